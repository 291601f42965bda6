"""The native .et codec (``_etcodec`` via ``_native``) against the pure-Python reference.

Every comparison decodes the same bytes twice, once per path, and demands identical
Arrow tables (and identical Arrow IPC bytes, which content hashes are built from).
Error cases run on both paths; native-only tests skip when the extension is not built.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from etstore.errors import TraceFormatError
from etstore.formats import et, read_et, write_et
from etstore.formats._frames import varint, write_varint
from etstore.model import ATTR_COLUMNS, DEPS_SCHEMA, OPS_SCHEMA
from etstore.proto import ONEOF_FIELDS, AttributeProto, GlobalMetadata, Node
from etstore.testing import require_extension

Decoder = Callable[[bytes, int, Path], tuple[pa.Table, pa.Table, bytes]]
P = Path("trace.3.et")
NATIVE = "etstore.formats._native"  # the codec's glue: ImportError when _etcodec is missing or stale


def _native_decode() -> Decoder:
    return require_extension(NATIVE).decode_rank


@pytest.fixture
def native() -> Any:
    return require_extension(NATIVE)


def _decoders() -> list[Any]:
    return [
        pytest.param(et._decode_py, id="python"),
        pytest.param(None, id="native"),
    ]


def _resolve(decoder: Decoder | None) -> Decoder:
    return _native_decode() if decoder is None else decoder


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _assert_same(a: tuple[pa.Table, pa.Table, bytes], b: tuple[pa.Table, pa.Table, bytes]) -> None:
    """Equal schemas, values (first differing column named) and IPC bytes."""
    (ops_a, deps_a, meta_a), (ops_b, deps_b, meta_b) = a, b
    assert ops_a.schema == ops_b.schema == OPS_SCHEMA
    assert deps_a.schema == deps_b.schema == DEPS_SCHEMA
    for name in OPS_SCHEMA.names:
        assert ops_a[name].equals(ops_b[name]), (name, ops_a[name][:5], ops_b[name][:5])
    for name in DEPS_SCHEMA.names:
        assert deps_a[name].equals(deps_b[name]), name
    assert meta_a == meta_b
    assert _ipc(ops_a) == _ipc(ops_b)
    assert _ipc(deps_a) == _ipc(deps_b)


def _outcome(decoder: Decoder, data: bytes) -> tuple[str, Any]:
    try:
        return "ok", decoder(data, 3, P)
    except TraceFormatError as exc:
        return "error", str(exc)


def _assert_same_outcome(data: bytes) -> tuple[str, Any]:
    """Both paths accept with equal tables, or both raise the same located error."""
    ref = _outcome(et._decode_py, data)
    got = _outcome(_native_decode(), data)
    assert ref[0] == got[0], (ref, got)
    if ref[0] == "ok":
        _assert_same(ref[1], got[1])
    else:
        assert ref[1] == got[1]
        assert re.match(rf"^{re.escape(str(P))}: byte \d+: ", got[1])
    return ref


def _frame(blob: bytes) -> bytes:
    return write_varint(len(blob)) + blob


def _file(nodes: list[bytes], meta: bytes | None = None) -> bytes:
    meta = GlobalMetadata(version="0.0.4").SerializeToString() if meta is None else meta
    return _frame(meta) + b"".join(_frame(n) for n in nodes)


def _key(field: int, wire: int) -> bytes:
    return write_varint(field << 3 | wire)


def _attr_record(attr: Any) -> bytes:
    blob = attr.SerializeToString()
    return _key(10, 2) + write_varint(len(blob)) + blob


# ------------------------------------------------------------------ fixtures


@pytest.mark.shared_files("**/*.et")
def test_fixture_decodes_identically(shared_file: Path) -> None:
    path = shared_file
    data = path.read_bytes()
    _assert_same(et._decode_py(data, 5, path), _native_decode()(data, 5, path))


@pytest.mark.shared_files("**/*.et")
def test_fixture_encodes_back_to_the_same_bytes(shared_file: Path, native: Any) -> None:
    path = shared_file
    data = path.read_bytes()
    ops, deps, meta = native.decode_rank(data, 0, path)
    assert native.encode_rank(ops, deps, meta) == data
    assert et._encode_py(ops, deps, meta) == data


def test_chakra_fixture_write_et_is_byte_exact(native: Any, tmp_path: Path, feeder: Path) -> None:
    path = feeder
    trace = read_et(path)
    assert trace.num_ops == 3664
    (out,) = write_et(trace, tmp_path / "again")
    assert out.read_bytes() == path.read_bytes()


# ------------------------------------------------------------ generated nodes

_INT_RANGES = {
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint32": (0, 2**32 - 1),
    "uint64": (0, 2**64 - 1),
    "sint32": (-(2**31), 2**31 - 1),
    "sint64": (-(2**63), 2**63 - 1),
    "fixed32": (0, 2**32 - 1),
    "fixed64": (0, 2**64 - 1),
    "sfixed32": (-(2**31), 2**31 - 1),
    "sfixed64": (-(2**63), 2**63 - 1),
}


def _scalar(kind: str) -> st.SearchStrategy[Any]:
    if kind in _INT_RANGES:
        lo, hi = _INT_RANGES[kind]
        # small values hit the promotion ranges (comm_type 0..9, int32 columns) often
        return st.one_of(st.integers(max(lo, -3), 12), st.integers(lo, hi))
    if kind == "double":
        return st.floats(allow_nan=False)
    if kind == "float":
        return st.floats(allow_nan=False, width=32)
    if kind == "bool":
        return st.booleans()
    if kind == "string":
        return st.text(max_size=6)
    return st.binary(max_size=6)


@st.composite
def attributes(draw: st.DrawFn) -> Any:
    """An AttributeProto with any name (promotable ones often), any oneof member, maybe a doc."""
    name = draw(st.sampled_from([*ATTR_COLUMNS, "rf_id", "op_schema", ""]))
    attr = AttributeProto(name=name)
    if draw(st.integers(0, 9)) == 0:
        attr.doc_string = draw(st.text(min_size=1, max_size=4))
    member = draw(st.sampled_from([None, *ONEOF_FIELDS.values()]))
    if member is not None:
        kind = member.rsplit("_", 1)[0]
        if member.endswith("_list"):
            getattr(attr, member).values.extend(draw(st.lists(_scalar(kind), max_size=3)))
        else:
            setattr(attr, member, draw(_scalar(kind)))
    return attr


@st.composite
def node_frames(draw: st.DrawFn, node_id: int) -> bytes:
    """One Node frame, encoded the usual way or with unpacked deps and reordered fields."""
    node = Node(id=node_id)
    if draw(st.booleans()):
        node.name = draw(st.text(max_size=8))
    node.type = draw(st.one_of(st.integers(0, 7), st.integers(-(2**31), 2**31 - 1)))
    node.start_time_micros = draw(st.sampled_from([0, 1, 2**64 - 1]))
    node.duration_micros = draw(st.integers(0, 2**64 - 1))
    data_deps = draw(st.lists(st.integers(0, 2**64 - 1), max_size=4))
    ctrl_deps = draw(st.lists(st.integers(0, 2**64 - 1), max_size=4))
    for field in ("inputs", "outputs"):
        if draw(st.booleans()):
            getattr(node, field).values = draw(st.text(max_size=6))
    attrs = draw(st.lists(attributes(), max_size=5))
    style = draw(st.sampled_from(["packed", "unpacked", "attrs-first"]))
    if style == "packed":
        node.data_deps.extend(data_deps)
        node.ctrl_deps.extend(ctrl_deps)
        node.attr.extend(attrs)
        return node.SerializeToString()
    if style == "unpacked":
        node.attr.extend(attrs)
        deps = b"".join(_key(5, 0) + write_varint(d) for d in data_deps)
        deps += b"".join(_key(4, 0) + write_varint(d) for d in ctrl_deps)
        return deps + node.SerializeToString()
    # attributes and I/O before the scalars, outputs before inputs: protobuf merges both halves
    head = b"".join(_attr_record(a) for a in attrs)
    if node.HasField("outputs"):
        head = Node(outputs=node.outputs).SerializeToString() + head
        node.ClearField("outputs")
    node.data_deps.extend(data_deps)
    node.ctrl_deps.extend(ctrl_deps)
    return head + node.SerializeToString()


@st.composite
def et_files(draw: st.DrawFn) -> bytes:
    """A rank file: metadata plus nodes with unique, unordered ids (zero-length nodes too)."""
    ids = draw(st.lists(st.integers(0, 2**64 - 1), unique=True, max_size=6))
    frames = [b"" if i == 0 and draw(st.booleans()) else draw(node_frames(i)) for i in ids]
    meta = draw(st.sampled_from([b"", GlobalMetadata(version="1.0").SerializeToString()]))
    return _file(frames, meta)


_SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(et_files())
def test_generated_nodes_decode_identically(data: bytes) -> None:
    kind, _ = _assert_same_outcome(data)
    assert kind == "ok"


@_SETTINGS
@given(et_files())
def test_native_encode_round_trips_and_matches_reference_messages(data: bytes) -> None:
    native = require_extension(NATIVE)
    ops, deps, meta = native.decode_rank(data, 3, P)
    written = native.encode_rank(ops, deps, meta)
    _assert_same(native.decode_rank(written, 3, P), (ops, deps, meta))
    reference = et._encode_py(ops, deps, meta)
    assert _messages(written) == _messages(reference)
    # lossless: every node parses to what the input held (unknown fields aside, none here)
    assert _messages(written)[1:] == [_canonical(f) for f in _frames(data)[1:]]


def _frames(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        n, pos = varint(data, pos, P)
        out.append(data[pos : pos + n])
        pos += n
    return out


def _canonical(frame: bytes) -> bytes:
    """A node as a comparable value: parsed, attrs of promoted form rebuilt, re-serialized."""
    return Node.FromString(frame).SerializeToString(deterministic=True)


def _messages(data: bytes) -> list[bytes]:
    frames = _frames(data)
    return frames[:1] + [_canonical(f) for f in frames[1:]]


def _wire_fields(depth: int) -> st.SearchStrategy[bytes]:
    """Protobuf-shaped noise: any field number (Node's, AttributeProto's, huge, 0), any wire type."""
    numbers = st.sampled_from([0, 1, 2, 3, 4, 5, 8, 10, 15, 27, 29, 30, 33, 2**29 - 1])
    varints = st.sampled_from([0, 1, 127, 128, 2**31, 2**32 + 4, 2**63, 2**64 - 1]).map(write_varint)
    leaf = st.one_of(
        st.tuples(numbers, varints).map(lambda t: _key(t[0], 0) + t[1]),
        st.tuples(numbers, st.binary(min_size=8, max_size=8)).map(lambda t: _key(t[0], 1) + t[1]),
        st.tuples(numbers, st.binary(min_size=4, max_size=4)).map(lambda t: _key(t[0], 5) + t[1]),
        st.tuples(numbers, st.sampled_from([b"", b"ok", b"\xc3\xa9", b"\xff", b"\x0a\x01a"])).map(
            lambda t: _key(t[0], 2) + write_varint(len(t[1])) + t[1]
        ),
        st.tuples(numbers, st.sampled_from([3, 4, 6, 7])).map(lambda t: _key(t[0], t[1])),
    )
    if depth == 0:
        return leaf
    inner = st.lists(_wire_fields(depth - 1), max_size=3).map(b"".join)
    return st.one_of(
        leaf,
        st.tuples(numbers, inner).map(lambda t: _key(t[0], 2) + write_varint(len(t[1])) + t[1]),
        st.tuples(numbers, inner).map(lambda t: _key(t[0], 3) + t[1] + _key(t[0], 4)),
    )


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(_wire_fields(3), max_size=5).map(b"".join), max_size=3), st.integers(0, 2))
def test_protobuf_shaped_noise_gives_the_same_outcome(frames: list[bytes], cut: int) -> None:
    data = _file(frames)
    _assert_same_outcome(data[: len(data) - cut])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80), st.binary(max_size=6))
def test_arbitrary_bytes_give_the_same_outcome(blob: bytes, prefix: bytes) -> None:
    _assert_same_outcome(_file([prefix + blob]))
    _assert_same_outcome(blob)


# --------------------------------------------------------------- wire corners


def test_zero_length_frame_is_a_node_not_eof() -> None:
    data = _file([b"", Node(id=7, name="after").SerializeToString(), b""])
    _, (ops, _, _) = _assert_same_outcome(data)
    assert ops["id"].to_pylist() == [0, 7, 0]
    assert ops["name"].to_pylist() == ["", "after", ""]
    assert ops["type"].to_pylist() == ["INVALID_NODE"] * 3
    assert ops["attrs"].null_count == 3 and ops["attr_order"].to_pylist() == ["", "", ""]


def test_packed_and_unpacked_deps_interleave_in_wire_order() -> None:
    node = (
        _key(4, 0)
        + write_varint(9)
        + Node(id=5, data_deps=[1, 2], ctrl_deps=[10]).SerializeToString()
        + _key(5, 0)
        + write_varint(3)
    )
    _, (_, deps, _) = _assert_same_outcome(_file([node]))
    assert deps.to_pydict() == {
        "rank": [3] * 5,
        "src": [1, 2, 3, 9, 10],
        "dst": [5] * 5,
        "kind": ["data", "data", "data", "ctrl", "ctrl"],
        "pos": [0, 1, 2, 0, 1],
    }


@pytest.mark.parametrize(
    ("code", "name"),
    [
        (4, "COMP_NODE"),
        (7, "COMM_COLL_NODE"),
        (12, "NODE_TYPE_12"),
        (-1, "NODE_TYPE_-1"),
        (2**31 - 1, f"NODE_TYPE_{2**31 - 1}"),
    ],
)
def test_node_type_names(code: int, name: str) -> None:
    _, (ops, _, _) = _assert_same_outcome(_file([Node(id=1, type=code).SerializeToString()]))
    assert ops["type"].to_pylist() == [name]


@pytest.mark.parametrize(
    "member", [m for m in ONEOF_FIELDS.values() if m.split("_")[0] in _INT_RANGES and m.endswith("_val")]
)
def test_any_integer_member_promotes(member: str) -> None:
    attrs = [
        AttributeProto(name="comm_src", **{member: 3}),
        AttributeProto(name="comm_type", **{member: 2}),
        AttributeProto(name="comm_size", **{member: 4096}),
    ]
    node = Node(id=1, type=5, attr=attrs).SerializeToString()
    _, (ops, _, _) = _assert_same_outcome(_file([node]))
    row = ops.to_pylist()[0]
    number = {v: k for k, v in ONEOF_FIELDS.items()}[member]
    assert (row["comm_src"], row["comm_type"], row["comm_size"]) == (3, "ALL_GATHER", 4096)
    assert row["attr_order"] == f"comm_src:{number},comm_type:{number},comm_size:{number}"
    assert row["attrs"] is None


@pytest.mark.parametrize(
    "attr",
    [
        AttributeProto(name="comm_src", int64_val=2**31),  # does not fit the int32 column
        AttributeProto(name="comm_type", int64_val=10),  # not a CollectiveCommType
        AttributeProto(name="comm_size", uint64_val=2**63),  # does not fit int64
        AttributeProto(name="comm_size", doc_string="bytes", int64_val=5),  # documented: keep as is
        AttributeProto(name="is_cpu_op", int32_val=1),  # bool column wants bool_val
        AttributeProto(name="pg_name", bytes_val=b"0"),  # string column wants string_val
        AttributeProto(name="comm_tag", int32_list=Node().attr.add().int32_list),  # a list
    ],
    ids=["int32-range", "comm-type-range", "uint64-big", "doc-string", "bool-member", "bytes", "list"],
)
def test_unfitting_attributes_stay_raw(attr: Any) -> None:
    node = Node(id=1, attr=[attr]).SerializeToString()
    _, (ops, _, _) = _assert_same_outcome(_file([node]))
    row = ops.to_pylist()[0]
    assert row[attr.name] is None and row["attr_order"] == "*"
    assert row["attrs"] == _attr_record(attr)


def test_second_occurrence_and_unknown_fields_stay_raw() -> None:
    first = AttributeProto(name="comm_src", int32_val=1)
    second = AttributeProto(name="comm_src", int32_val=2)
    # an unknown field (99) inside an otherwise promotable attribute: export could not rebuild it
    odd = AttributeProto(name="comm_dst", int32_val=4).SerializeToString() + _key(99, 0) + b"\x01"
    odd_record = _key(10, 2) + write_varint(len(odd)) + odd
    node = Node(id=1, attr=[first, second]).SerializeToString() + odd_record
    _, (ops, _, _) = _assert_same_outcome(_file([node]))
    row = ops.to_pylist()[0]
    assert (row["comm_src"], row["comm_dst"]) == (1, None)
    assert row["attr_order"] == "comm_src:7,*,*"
    assert row["attrs"] == _attr_record(second) + odd_record


def test_interleaved_records_are_kept_in_field_order() -> None:
    a = AttributeProto(name="x", int64_val=1)
    node = _attr_record(a) + Node(outputs={"values": "o"}, inputs={"values": "i"}).SerializeToString()
    _, (ops, _, _) = _assert_same_outcome(_file([node]))
    expected = Node(inputs={"values": "i"}, outputs={"values": "o"}, attr=[a]).SerializeToString()
    assert ops["attrs"].to_pylist() == [expected]


def test_unknown_node_fields_and_foreign_wire_types_are_skipped() -> None:
    group = _key(33, 3) + _key(1, 0) + b"\x05" + _key(0, 1) + bytes(8) + _key(33, 4)  # field 0 ok in groups
    node = _key(1, 2) + b"\x01\x05" + group + Node(id=4).SerializeToString() + _key(10, 0) + b"\x01"
    _, (ops, _, _) = _assert_same_outcome(_file([node]))
    assert ops["id"].to_pylist() == [4] and ops["attrs"].to_pylist() == [None]


@pytest.mark.parametrize(("depth", "ok"), [(100, True), (101, False)])
def test_group_nesting_limit(depth: int, ok: bool) -> None:
    node = _key(11, 3) * depth + _key(11, 4) * depth
    kind, _ = _assert_same_outcome(_file([node]))
    assert (kind == "ok") is ok


# ------------------------------------------------- files without GlobalMetadata


@pytest.mark.parametrize(
    "first",
    [
        Node(id=5, name="first").SerializeToString(),  # varint id: field 1, wire type 0
        Node(id=0, name="c", type=7).SerializeToString(),  # id 0 is not written: name, then type
        Node(id=0, name="c", attr=[AttributeProto(name="comm_size", uint64_val=9)]).SerializeToString(),
        b"\x18\x01",  # only a node type
    ],
    ids=["id", "id0-type", "id0-attr", "type-only"],
)
def test_a_file_starting_with_a_node_has_no_metadata(first: bytes) -> None:
    data = _frame(first) + _frame(_NODE)
    _, (ops, deps, meta) = _assert_same_outcome(data)
    assert meta is None
    assert ops.num_rows == 2 and ops["id"].to_pylist()[1] == 1
    assert ops["id"].to_pylist()[0] == Node.FromString(first).id
    assert deps["src"].to_pylist() == [0]


@pytest.mark.parametrize(
    "frame",
    [b"", GlobalMetadata(version="1.0.2").SerializeToString(), b"\x12\x00", b"\x0a\x00\x12\x00"],
    ids=["empty", "version", "empty-attr", "both"],
)
def test_a_metadata_frame_stays_metadata(frame: bytes) -> None:
    _, (ops, _, meta) = _assert_same_outcome(_frame(frame) + _frame(_NODE))
    assert meta == frame and ops.num_rows == 1


# ------------------------------------------------------------- bad inputs

_META = _frame(GlobalMetadata(version="0.0.4").SerializeToString())
_NODE = Node(id=1, name="n", data_deps=[0]).SerializeToString()
_AT1 = len(_META)  # offset of the first node frame
_AT2 = len(_META) + len(_frame(_NODE))  # offset of the second
_PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4"

_NOT_NODE = "is not a Chakra Node"
_DOUBLES_2_BYTES = b"\x52\x06\x22\x04\x0a\x02\x00\x00"  # attr { double_list { packed, 2 bytes } }
_BAD = {
    "truncated-mid-frame": (
        _META + _frame(_NODE)[:-2],
        rf"byte {_AT1}: node frame 1 claims {len(_NODE)} bytes but only {len(_NODE) - 2} remain",
    ),
    "truncated-varint": (_META + _frame(_NODE) + b"\x80\x80", rf"byte {_AT2}: truncated frame length"),
    "overlong-varint": (_META + b"\xff" * 5 + b"\x01", rf"byte {_AT1}: frame length is not a varint32"),
    "2GB-frame": (_META + write_varint(2**31) + b"\x08\x01", rf"byte {_AT1}: node frame 1 claims 2147483648"),
    "2GB-metadata": (write_varint(2**31) + b"\x0a\x00", r"byte 0: GlobalMetadata frame claims 2147483648"),
    "garbage": (bytes(range(255, 0, -7)) * 3, r"byte 0: "),
    "png": (_PNG, r"byte 0: GlobalMetadata frame claims"),
    "bad-utf8-name": (_META + _frame(b"\x12\x02\xc3\x28"), rf"byte {_AT1}: frame 1 {_NOT_NODE}"),
    "field-zero": (_META + _frame(_NODE) + _frame(b"\x00\x01"), rf"byte {_AT2}: frame 2 {_NOT_NODE}"),
    "wire-type-7": (_META + _frame(b"\x0f"), rf"byte {_AT1}: frame 1 {_NOT_NODE}"),
    "bad-attr-list": (_META + _frame(b"\x52\x05\x32\x03\x0a\x01\x00"), rf"byte {_AT1}: frame 1 {_NOT_NODE}"),
    "bad-double-list": (_META + _frame(_DOUBLES_2_BYTES), rf"byte {_AT1}: frame 1 {_NOT_NODE}"),
    "tag-over-32-bits": (_META + _frame(b"\xf8\xff\xff\xff\x1f\x01"), rf"byte {_AT1}: frame 1 {_NOT_NODE}"),
    # field 11 only: neither a GlobalMetadata nor a node (a node-like first frame is the old form)
    "metadata-not-metadata": (_frame(b"\x58\x01") + _frame(_NODE), r"byte 0: first frame is not a Chakra "),
    "empty": (b"", r"byte 0: truncated frame length"),
}


@pytest.mark.parametrize("decoder", _decoders())
@pytest.mark.parametrize("case", sorted(_BAD))
def test_bad_input_raises_with_byte_offset(decoder: Decoder | None, case: str) -> None:
    data, pattern = _BAD[case]
    with pytest.raises(TraceFormatError, match=rf"^{re.escape(str(P))}: {pattern}"):
        _resolve(decoder)(data, 3, P)


@pytest.mark.parametrize("decoder", _decoders())
@pytest.mark.parametrize(
    "text",
    [b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80", b"\xf8\x88\x80\x80\x80"],
    ids=["overlong", "surrogate", "past-10ffff", "cut-short", "lone-continuation", "five-bytes"],
)
@pytest.mark.parametrize("where", ["name", "attr-name", "string-list", "metadata"])
def test_invalid_utf8_in_any_string_field(decoder: Decoder | None, text: bytes, where: str) -> None:
    def record(field: int, payload: bytes) -> bytes:
        return _key(field, 2) + write_varint(len(payload)) + payload

    meta, node = _META, b""
    if where == "name":
        node = record(2, text)
    elif where == "attr-name":
        node = record(10, record(1, text))
    elif where == "string-list":
        node = record(10, record(30, record(1, text)))
    else:
        meta = _frame(record(1, text))
    at, what = (0, "first frame is not a Chakra GlobalMetadata") if where == "metadata" else (_AT1, "frame 1")
    with pytest.raises(TraceFormatError, match=rf"byte {at}: {what}"):
        _resolve(decoder)(meta + _frame(node), 3, P)


@pytest.mark.parametrize("case", sorted(_BAD))
def test_bad_input_messages_agree(case: str) -> None:
    assert _assert_same_outcome(_BAD[case][0])[0] == "error"


@pytest.mark.parametrize("decoder", _decoders())
def test_every_truncation_of_a_fixture_is_an_error(decoder: Decoder | None, custom_allreduce: Path) -> None:
    data = (custom_allreduce / "custom_allreduce.0.et").read_bytes()
    decode = _resolve(decoder)
    step = 1 if decoder is None else 97  # the reference path is slow; sample it
    ends = set(range(1, len(data), step)) | {len(data) - 1, len(data) - 2}
    for end in sorted(ends):
        cut = data[:end]
        try:
            decode(cut, 0, P)
        except TraceFormatError as exc:
            assert re.match(rf"^{re.escape(str(P))}: byte \d+: ", str(exc)), str(exc)
        else:  # cut exactly between two frames: a shorter, valid trace
            assert _frame_boundary(data, end)


def _frame_boundary(data: bytes, end: int) -> bool:
    pos = 0
    while pos < end:
        n, pos = varint(data, pos, P)
        pos += n
    return pos == end


# ------------------------------------------------------------ native encoder


def test_encoder_rejects_what_a_node_cannot_hold(native: Any) -> None:
    ops, deps, meta = native.decode_rank(_file([Node(id=1, type=7).SerializeToString()]), 0, P)
    bad_type = ops.set_column(
        OPS_SCHEMA.get_field_index("comm_type"), "comm_type", pa.array(["ALL_SOMETHING"])
    )
    with pytest.raises(ValueError, match="ALL_SOMETHING"):
        native.encode_rank(bad_type, deps, meta)
    truncated = pa.array([b"\x52\x09"], pa.binary())
    garbage = ops.set_column(OPS_SCHEMA.get_field_index("attrs"), "attrs", truncated)
    with pytest.raises(ValueError, match="attrs"):
        native.encode_rank(garbage, deps, meta)
    wide = ops.set_column(OPS_SCHEMA.get_field_index("comm_src"), "comm_src", pa.array([-1], pa.int32()))
    wide = wide.set_column(OPS_SCHEMA.get_field_index("attr_order"), "attr_order", pa.array(["comm_src:11"]))
    with pytest.raises(ValueError, match="comm_src"):  # uint32_val cannot hold -1
        native.encode_rank(wide, deps, meta)


def test_encoder_writes_edited_columns_and_missing_deps(native: Any) -> None:
    attrs = [AttributeProto(name="comm_src", sint32_val=-2), AttributeProto(name="rf_id", int64_val=9)]
    data = _file([Node(id=8, type=5, attr=attrs, data_deps=[99], ctrl_deps=[1]).SerializeToString()])
    ops, deps, meta = native.decode_rank(data, 0, P)
    ops = ops.set_column(OPS_SCHEMA.get_field_index("comm_src"), "comm_src", pa.array([-7], pa.int32()))
    ops = ops.set_column(OPS_SCHEMA.get_field_index("comm_tag"), "comm_tag", pa.array([5], pa.int32()))
    written = native.encode_rank(ops, deps, meta)
    assert written == et._encode_py(ops, deps, meta)
    node = Node.FromString(_frames(written)[1])
    # hand-edited attr_order: repeats and unknown columns are skipped, as the reference does
    order = OPS_SCHEMA.get_field_index("attr_order")
    edited = ops.set_column(order, "attr_order", pa.array(["comm_src:17,bogus:9,*,comm_src:7"]))
    assert native.encode_rank(edited, deps, meta) == et._encode_py(edited, deps, meta)
    assert [(a.name, a.WhichOneof("value")) for a in node.attr] == [
        ("comm_src", "sint32_val"),
        ("rf_id", "int64_val"),
        ("comm_tag", "int32_val"),
    ]
    assert node.attr[0].sint32_val == -7 and list(node.data_deps) == [99] and list(node.ctrl_deps) == [1]
