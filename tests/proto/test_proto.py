"""Our runtime-built descriptors agree with et_def.proto, field by field."""

from __future__ import annotations

import re
from pathlib import Path

from etstore import proto
from etstore.proto import GlobalMetadata, Node

PROTO = Path(proto.__file__).with_name("et_def.proto")


def _proto_fields() -> dict[str, dict[str, int]]:
    text = PROTO.read_text()
    out: dict[str, dict[str, int]] = {}
    for m in re.finditer(r"message (\w+) \{(.*?)\n?\}", text, re.S):
        body = m.group(2)
        out[m.group(1)] = {f: int(n) for f, n in re.findall(r"(\w+) = (\d+);", body)}
    return out


def test_every_message_and_field_number_matches_the_proto_file() -> None:
    expected = _proto_fields()
    fd = proto.file_descriptor_proto()
    built = {m.name: {f.name: f.number for f in m.field} for m in fd.message_type}
    assert built == expected
    assert expected["Node"]["attr"] == 10 and expected["AttributeProto"]["bytes_list"] == 32


def test_enums_match_the_proto_file() -> None:
    text = PROTO.read_text()
    for enum, values in (("NodeType", proto.NODE_TYPES), ("CollectiveCommType", proto.COLLECTIVE_COMM_TYPES)):
        body = re.search(rf"enum {enum} \{{(.*?)\}}", text, re.S).group(1)
        assert dict(re.findall(r"(\w+) = (\d+);", body)) == {v: str(i) for i, v in enumerate(values)}


def test_wire_bytes_are_chakra_field_numbers() -> None:
    # id=1 (field 1), type=COMP_NODE (field 3 = 4), one attr (field 10, 14 bytes: name 2+9, bool 3)
    node = Node(id=1, type=4)
    node.attr.add(name="is_cpu_op", bool_val=True)
    assert node.SerializeToString() == bytes(
        [0x08, 0x01, 0x18, 0x04, 0x52, 0x0E, 0x0A, 0x09]
    ) + b"is_cpu_op" + bytes([0xD8, 0x01, 0x01])
    assert GlobalMetadata(version="0.0.4").SerializeToString() == b"\x0a\x050.0.4"
