"""Chakra ET message classes, built at import time from our own schema.

Upstream ships ``protoc`` output, which breaks whenever the installed protobuf
runtime is older or newer than the generator ("gencode/runtime mismatch"). We
build the same descriptors (``et_def.proto`` beside this file: package
``ChakraProtoMsg``, identical field numbers) through ``descriptor_pb2`` and the
message factory, an API every protobuf runtime since 3.20 offers.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = [
    "COLLECTIVE_COMM_TYPES",
    "LIST_ELEMENT_TYPES",
    "NODE_TYPES",
    "ONEOF_FIELDS",
    "PACKAGE",
    "AttributeProto",
    "GlobalMetadata",
    "IOInfo",
    "Node",
    "Tensor",
    "file_descriptor_proto",
]

PACKAGE = "ChakraProtoMsg"
_FILE = "etstore/et_def.proto"

NODE_TYPES: tuple[str, ...] = (
    "INVALID_NODE",
    "METADATA_NODE",
    "MEM_LOAD_NODE",
    "MEM_STORE_NODE",
    "COMP_NODE",
    "COMM_SEND_NODE",
    "COMM_RECV_NODE",
    "COMM_COLL_NODE",
)
COLLECTIVE_COMM_TYPES: tuple[str, ...] = (
    "ALL_REDUCE",
    "REDUCE",
    "ALL_GATHER",
    "GATHER",
    "SCATTER",
    "BROADCAST",
    "ALL_TO_ALL",
    "REDUCE_SCATTER",
    "REDUCE_SCATTER_BLOCK",
    "BARRIER",
)

_F = descriptor_pb2.FieldDescriptorProto
# Scalar kinds of AttributeProto's oneof, in field-number order from 3: each kind
# has a scalar member (odd number) and a list member (even number).
LIST_ELEMENT_TYPES: tuple[tuple[str, int], ...] = (
    ("double", _F.TYPE_DOUBLE),
    ("float", _F.TYPE_FLOAT),
    ("int32", _F.TYPE_INT32),
    ("int64", _F.TYPE_INT64),
    ("uint32", _F.TYPE_UINT32),
    ("uint64", _F.TYPE_UINT64),
    ("sint32", _F.TYPE_SINT32),
    ("sint64", _F.TYPE_SINT64),
    ("fixed32", _F.TYPE_FIXED32),
    ("fixed64", _F.TYPE_FIXED64),
    ("sfixed32", _F.TYPE_SFIXED32),
    ("sfixed64", _F.TYPE_SFIXED64),
    ("bool", _F.TYPE_BOOL),
    ("string", _F.TYPE_STRING),
    ("bytes", _F.TYPE_BYTES),
)
# oneof field number -> member name ("int64_val", "bool_list", ...)
ONEOF_FIELDS: dict[int, str] = {}
for _i, (_kind, _) in enumerate(LIST_ELEMENT_TYPES):
    ONEOF_FIELDS[3 + 2 * _i] = f"{_kind}_val"
    ONEOF_FIELDS[4 + 2 * _i] = f"{_kind}_list"


def _field(
    msg: descriptor_pb2.DescriptorProto,
    name: str,
    number: int,
    ftype: int,
    *,
    repeated: bool = False,
    type_name: str | None = None,
    oneof: int | None = None,
) -> None:
    f = msg.field.add()
    f.name = name
    f.number = number
    f.type = ftype
    f.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    if type_name:
        f.type_name = f".{PACKAGE}.{type_name}"
    if oneof is not None:
        f.oneof_index = oneof


def file_descriptor_proto() -> descriptor_pb2.FileDescriptorProto:
    """The schema of ``et_def.proto`` as a FileDescriptorProto."""
    fd = descriptor_pb2.FileDescriptorProto(name=_FILE, package=PACKAGE, syntax="proto3")

    attr = fd.message_type.add(name="AttributeProto")
    _field(attr, "name", 1, _F.TYPE_STRING)
    _field(attr, "doc_string", 2, _F.TYPE_STRING)
    attr.oneof_decl.add(name="value")
    for i, (kind, ftype) in enumerate(LIST_ELEMENT_TYPES):
        list_name = kind.capitalize() + "List"
        _field(attr, f"{kind}_val", 3 + 2 * i, ftype, oneof=0)
        _field(attr, f"{kind}_list", 4 + 2 * i, _F.TYPE_MESSAGE, type_name=list_name, oneof=0)
        lst = fd.message_type.add(name=list_name)
        _field(lst, "values", 1, ftype, repeated=True)

    for enum_name, values in (("NodeType", NODE_TYPES), ("CollectiveCommType", COLLECTIVE_COMM_TYPES)):
        enum = fd.enum_type.add(name=enum_name)
        for number, value in enumerate(values):
            enum.value.add(name=value, number=number)

    meta = fd.message_type.add(name="GlobalMetadata")
    _field(meta, "version", 1, _F.TYPE_STRING)
    _field(meta, "attr", 2, _F.TYPE_MESSAGE, repeated=True, type_name="AttributeProto")

    io = fd.message_type.add(name="IOInfo")
    for number, name in enumerate(("values", "shapes", "types"), start=1):
        _field(io, name, number, _F.TYPE_STRING)

    tensor = fd.message_type.add(name="Tensor")
    for number, name in enumerate(("tensor_id", "storage_id", "offset", "num_elem", "elem_bytes"), 1):
        _field(tensor, name, number, _F.TYPE_UINT64)
    _field(tensor, "device", 6, _F.TYPE_STRING)

    node = fd.message_type.add(name="Node")
    _field(node, "id", 1, _F.TYPE_UINT64)
    _field(node, "name", 2, _F.TYPE_STRING)
    _field(node, "type", 3, _F.TYPE_ENUM, type_name="NodeType")
    _field(node, "ctrl_deps", 4, _F.TYPE_UINT64, repeated=True)
    _field(node, "data_deps", 5, _F.TYPE_UINT64, repeated=True)
    _field(node, "start_time_micros", 6, _F.TYPE_UINT64)
    _field(node, "duration_micros", 7, _F.TYPE_UINT64)
    _field(node, "inputs", 8, _F.TYPE_MESSAGE, type_name="IOInfo")
    _field(node, "outputs", 9, _F.TYPE_MESSAGE, type_name="IOInfo")
    _field(node, "attr", 10, _F.TYPE_MESSAGE, repeated=True, type_name="AttributeProto")
    return fd


def _build() -> dict[str, Any]:  # generated message classes: attributes made at run time
    # A private pool: never clashes with an upstream ``et_def_pb2`` in the same process.
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_descriptor_proto())
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
        for name in ("GlobalMetadata", "Node", "AttributeProto", "IOInfo", "Tensor")
    }


_classes = _build()
GlobalMetadata = _classes["GlobalMetadata"]
Node = _classes["Node"]
AttributeProto = _classes["AttributeProto"]
IOInfo = _classes["IOInfo"]
Tensor = _classes["Tensor"]
