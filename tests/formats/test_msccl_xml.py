"""MSCCL-IR XML → algorithm trace, against the real fixtures and hand-checkable documents."""

from __future__ import annotations

import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import pyarrow.compute as pc
import pytest

from etstore.algorithms import generate
from etstore.errors import TraceFormatError
from etstore.formats import read_trace
from etstore.formats.et import read_et
from etstore.formats.msccl_writer import to_msccl_xml
from etstore.formats.msccl_xml import parse_msccl_xml, read_msccl_xml
from etstore.model import Trace, decode_attrs
from etstore.testing import MSCCL_HEAD as HEAD
from etstore.testing import msccl_doc as doc
from etstore.testing import msccl_step as step
from etstore.testing import msccl_tb as tb
from etstore.testing import ring_allreduce_xml

# (ops, deps, ranks) per fixture, pinned; deps re-derived independently below
COUNTS = {
    "all-reduce-ring-simple.xml": (28800, 28416, 16),
    "all-to-all-2d-hierarchical-simple-n2g32.xml": (2048, 1536, 32),
    "allgather-8n-1mb-4mb.xml": (448, 0, 8),
    "allgather-8n-8kb-1mb.xml": (448, 0, 8),
    "allgather-allpairs-16n-16tb.xml": (480, 240, 16),
    "allreduce-allpairs-8n-ll-32tb-op.xml": (2720, 5824, 8),
    "allreduce-allpairs-8n-ll-32tb.xml": (2688, 5568, 8),
    "allreduce-allpairs-8n-simple.xml": (5376, 11136, 8),
    "allreduce_1step_mccl_8_2_131072_LL.xml": (1120, 2448, 8),
    "alltoall-8n-1mb-4mb.xml": (480, 0, 8),
}


def edges(t: Trace, rank: int = 0) -> set[tuple[int, int]]:
    d = t.deps.filter(pc.equal(t.deps["rank"], rank))
    return set(zip(d["src"].to_pylist(), d["dst"].to_pylist(), strict=True))


def rank_ops(t: Trace, rank: int = 0) -> list[dict]:
    return t.ops.filter(pc.equal(t.ops["rank"], rank)).to_pylist()


# ---------------------------------------------------------------- an independent reference model


_NODES = {
    "s": "S",
    "r": "R",
    "rcs": "RS",
    "rrs": "RCS",
    "rrc": "RC",
    "rrcs": "RCS",
    "cpy": "C",
    "re": "C",
    "nop": "",
    "d": "",
    "st": "",
}


def reference_edges(path: Path) -> dict[int, set[tuple[int, int]]]:
    """Dependencies by the rules of docs/algorithms.md, computed step by step with dicts."""
    root = ET.parse(path).getroot()
    return {int(gpu.get("id")): _reference_gpu(gpu) for gpu in root.iter("gpu")}


def _reference_gpu(gpu: ET.Element) -> set[tuple[int, int]]:
    nodes: dict[tuple[int, int], list[int]] = {}
    order: dict[int, list[int]] = {}
    waits: dict[tuple[int, int], tuple[int, int]] = {}
    nid = 0
    for t in gpu.iter("tb"):
        tid = int(t.get("id"))
        order[tid] = []
        for s in t.iter("step"):
            k = (tid, int(s.get("s")))
            order[tid].append(k[1])
            nodes[k] = list(range(nid, nid + len(_NODES[s.get("type")])))
            nid += len(nodes[k])
            waits[k] = (int(s.get("depid")), int(s.get("deps")))

    def before(k: tuple[int, int]) -> list[int]:
        """What must finish before step k may start: its waits, those of the nops before it, and the
        last node of the previous step that has nodes."""
        tid, sidx = k
        seq = order[tid]
        j = seq.index(sidx)
        need: list[int] = []
        while True:
            depid, deps = waits[(tid, seq[j])]
            if depid >= 0:
                need += done((depid, deps))
            j -= 1
            if j < 0:
                return need
            if nodes[(tid, seq[j])]:
                return [*need, nodes[(tid, seq[j])][-1]]

    def done(k: tuple[int, int]) -> list[int]:
        return [nodes[k][-1]] if nodes[k] else before(k)

    out: set[tuple[int, int]] = set()
    for k, ns in nodes.items():
        if ns:
            out.update(pairwise(ns))
            out.update((p, ns[0]) for p in before(k) if p != ns[0])
    return out


# ---------------------------------------------------------------- fixtures


@pytest.mark.shared_files("msccl/*.xml")
def test_fixture_counts_and_exact_dependencies(shared_file: Path) -> None:
    t = read_msccl_xml(shared_file)
    assert (t.num_ops, t.num_deps, t.num_ranks) == COUNTS[shared_file.name]
    assert t.kind == "algorithm" and t.num_missing == 0
    ref = reference_edges(shared_file)
    for r in t.ranks:
        assert edges(t, r) == ref[r], f"rank {r}"


def test_custom_allreduce_matches_upstream_converted_et(custom_allreduce: Path) -> None:
    base = custom_allreduce
    ours = read_msccl_xml(base / "custom_allreduce.xml")
    upstream = read_et(base / "custom_allreduce")
    cols = ["rank", "id", "type", "comm_src", "comm_dst", "comm_tag"]
    assert ours.ops.select(cols).equals(upstream.ops.select(cols))  # same sends, recvs, reductions, peers
    key = [("rank", "ascending"), ("dst", "ascending"), ("src", "ascending")]
    assert (
        ours.deps.select(["rank", "src", "dst"])
        .sort_by(key)
        .equals(upstream.deps.select(["rank", "src", "dst"]).sort_by(key))
    )
    assert ours.num_ops == 280 and ours.num_deps == 272
    assert ours.params["collective"] == "allreduce" and ours.params["ngpus"] == 8
    assert ours.params["nchunksperloop"] == 8 and ours.params["inplace"] is True
    assert ours.params["outofplace"] is False  # absent attribute: the opposite of inplace
    assert ours.params["proto"] == "LL128" and ours.name == "custom_allreduce"


def test_read_trace_dispatches_xml(custom_allreduce_xml: Path) -> None:
    t = read_trace(custom_allreduce_xml)
    assert t.kind == "algorithm" and t.num_ops == 280


def test_fast_and_general_parsers_agree(shared_fixture: Callable[[str], Path]) -> None:
    """Reordered attributes, comments and a declaration take the other parser; same trace."""
    path = shared_fixture("msccl/allreduce-allpairs-8n-ll-32tb-op.xml")
    text = path.read_text()
    canonical = parse_msccl_xml(text)
    reordered = re.sub(r'<step s="(\d+)" type="(\w+)"', r'<step type="\2" s="\1"', text)
    assert reordered != text
    declared = '<?xml version="1.0"?>\n<!-- a comment with <tags> & "quotes" -->\n' + text
    for variant in (reordered, declared):
        other = parse_msccl_xml(variant)
        assert other.ops.equals(canonical.ops)
        assert other.deps.equals(canonical.deps)
        assert dict(other.params) == dict(canonical.params)


def test_op_elements_give_the_same_dag(custom_allreduce_xml: Path) -> None:
    """The newer <op step type buf off cnt> form (no nchunksperloop) reads like <step>."""
    text = custom_allreduce_xml.read_text()

    def to_op(m: re.Match[str]) -> str:
        s, typ, sb, so, db, do, cnt, depid, deps, hasdep = m.groups()
        buf, off = (sb, so) if typ in ("s", "rcs", "rrs", "rrcs") else (db, do)
        extra = f' depid="{depid}" deps="{deps}"' if depid != "-1" else ""
        return f'<op step="{s}" type="{typ}" buf="{buf}" off="{off}" cnt="{cnt}"{extra} hasdep="{hasdep}"/>'

    op_text = re.sub(
        r'<step s="(\d+)" type="(\w+)" srcbuf="(\w)" srcoff="(-?\d+)" dstbuf="(\w)" dstoff="(-?\d+)" '
        r'cnt="(\d+)" depid="(-?\d+)" deps="(-?\d+)" hasdep="(\d)"/>',
        to_op,
        text,
    ).replace(' nchunksperloop="8"', "")
    assert "<op " in op_text and "<step" not in op_text
    a, b = parse_msccl_xml(text), parse_msccl_xml(op_text)
    cols = [
        "rank",
        "id",
        "name",
        "type",
        "comm_src",
        "comm_dst",
        "comm_tag",
        "msg_chunk_cnt",
        "chunk_offset",
        "total_chunk_cnt",
        "tb_id",
        "local_time_step",
    ]
    assert a.ops.select(cols).equals(b.ops.select(cols))
    assert a.deps.equals(b.deps)
    assert b.params["nchunksperloop"] == 8  # derived from the buffers


# ---------------------------------------------------------------- hand-checkable semantics


ALL_TYPES = doc(
    "\n".join(
        [
            tb(
                0,
                1,
                1,
                step(0, "s", "i", 0, "o", 1),  # srcoff != dstoff
                step(1, "rcs", "i", 1, "o", 1),
                step(2, "rrs", "i", 0, "o", 0),
                step(3, "rrcs", "i", 1, "o", 1),
                step(4, "rrc", "i", 0, "o", 0),
                step(5, "r", "i", 1, "s", 0),
            ),
            # tb 1: a copy after tb0 step 2; a nop carrying tb0 step 4; a reduce that waits for tb0 step 1
            tb(
                1,
                -1,
                -1,
                step(0, "cpy", "i", 0, "s", 1, depid=0, deps=2),
                step(1, "nop", "i", -1, "o", -1, cnt=0, depid=0, deps=4),
                step(2, "re", "s", 1, "o", 0, depid=0, deps=1),
                chan=3,
            ),
            # tb 2: d and st are dependency-only; a dependency on a nop waits for what the nop waits for
            tb(
                2,
                -1,
                -1,
                step(0, "d", "i", -1, "o", -1, cnt=0),
                step(1, "st", "i", -1, "o", -1, cnt=0),
                step(2, "cpy", "o", 0, "s", 0, depid=1, deps=1),
            ),
        ]
    )
)


def test_every_step_type_becomes_its_node_sequence() -> None:
    t = parse_msccl_xml(ALL_TYPES)
    ops = rank_ops(t, 0)
    assert [
        (o["id"], o["type"][5:9] if o["type"].startswith("COMM") else o["name"].split("_")[0]) for o in ops
    ] == [
        (0, "SEND"),
        (1, "RECV"),
        (2, "SEND"),  # rcs
        (3, "RECV"),
        (4, "reduce"),
        (5, "SEND"),  # rrs
        (6, "RECV"),
        (7, "reduce"),
        (8, "SEND"),  # rrcs
        (9, "RECV"),
        (10, "reduce"),  # rrc
        (11, "RECV"),  # r
        (12, "copy"),  # cpy (tb 1)
        (13, "reduce"),  # re (tb 1; the nop made no node)
        (14, "copy"),  # cpy (tb 2; d and st made no node)
    ]
    assert [o["name"] for o in ops][:3] == ["send_tb0_s0", "recv_tb0_s1", "send_tb0_s1"]
    assert ops[13]["name"] == "reduce_tb1_s2" and ops[13]["local_time_step"] == 2 and ops[13]["tb_id"] == 1
    assert edges(t, 0) == {
        (0, 1),
        (1, 2),
        (2, 3),
        (3, 4),
        (4, 5),
        (5, 6),
        (6, 7),
        (7, 8),
        (8, 9),
        (9, 10),
        (10, 11),  # tb 0
        (5, 12),  # cpy waits for tb0 step 2 (rrs, last node 5)
        (12, 13),
        (10, 13),
        (2, 13),  # re: program order, the nop's wait (tb0 step 4), its own (tb0 step 1)
        (12, 14),
        (10, 14),  # cpy in tb 2 waits for the nop tb1 step 1: what that nop waits for
    }
    # peers, tags and chunk columns
    send0, recv1 = ops[0], ops[1]
    assert (send0["comm_dst"], send0["comm_src"], send0["comm_tag"]) == (1, None, 0)
    assert (recv1["comm_src"], recv1["comm_dst"], recv1["comm_tag"]) == (1, None, 0)
    assert ops[12]["comm_tag"] is None and ops[12]["comm_src"] is None
    assert (
        send0["chunk_offset"],
        send0["msg_chunk_idx"],
        send0["msg_chunk_cnt"],
        send0["total_chunk_cnt"],
    ) == (0, 0, 1, 2)
    assert (
        ops[11]["chunk_offset"] == 0 and ops[11]["msg_chunk_idx"] == 1
    )  # recv: lands at dstoff, came from srcoff
    assert decode_attrs(ops[0]["attrs"]) == {
        "msccl_type": "s",
        "srcbuf": "i",
        "srcoff": 0,
        "dstbuf": "o",
        "dstoff": 1,
    }
    assert decode_attrs(ops[12]["attrs"])["chan"] == 3  # peerless threadblocks keep their channel
    assert t.params["gpu_chunks"] == {"i": [2, 2], "o": [2, 2], "s": [2, 2]}


def test_many_chunks_per_step_and_channels() -> None:
    head = HEAD.replace('nchunksperloop="2"', 'nchunksperloop="8"').replace('nchannels="1"', 'nchannels="2"')
    text = doc(
        tb(0, 1, -1, step(0, "s", "i", 0, "i", 4, cnt=4), chan=0)
        + "\n"
        + tb(1, 1, -1, step(0, "s", "i", 4, "i", 0, cnt=4), chan=1),
        tb(0, -1, 0, step(0, "r", "i", 0, "i", 4, cnt=4), chan=0)
        + "\n"
        + tb(1, -1, 0, step(0, "r", "i", 4, "i", 0, cnt=4), chan=1),
        head=head,
        chunks='i_chunks="8" o_chunks="0" s_chunks="0"',
    )
    t = parse_msccl_xml(text)
    ops = t.ops.to_pylist()
    assert [(o["rank"], o["comm_tag"], o["msg_chunk_cnt"], o["chunk_offset"]) for o in ops] == [
        (0, 0, 4, 0),
        (0, 1, 4, 4),
        (1, 0, 4, 4),
        (1, 1, 4, 0),
    ]
    assert t.num_deps == 0 and t.params["nchannels"] == 2


def test_gpus_out_of_order_are_grouped_by_rank() -> None:
    text = doc(tb(0, -1, 0, step(0, "r")), tb(0, 1, -1, step(0, "s")))  # gpu 1's steps written first
    swapped = (
        text.replace('<gpu id="0"', '<gpu id="X"')
        .replace('<gpu id="1"', '<gpu id="0"')
        .replace('<gpu id="X"', '<gpu id="1"')
    )
    assert swapped.index('<gpu id="1"') < swapped.index('<gpu id="0"')
    t = parse_msccl_xml(swapped)
    assert t.ops["rank"].to_pylist() == [0, 1]
    assert t.ops["type"].to_pylist() == ["COMM_SEND_NODE", "COMM_RECV_NODE"]  # gpu 0 sends, gpu 1 receives
    assert t.ops["comm_dst"].to_pylist() == [1, None] and t.ops["comm_src"].to_pylist() == [None, 0]


# ---------------------------------------------------------------- errors


BOMB = """<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<algo name="&lol9;" ngpus="1" coll="allreduce"></algo>
"""


def test_xml_bomb_is_refused_before_parsing() -> None:
    start = time.perf_counter()
    with pytest.raises(TraceFormatError, match=r"bomb\.xml:2: DOCTYPE declarations are not allowed"):
        parse_msccl_xml(BOMB, source="bomb.xml")
    assert time.perf_counter() - start < 1.0


def test_utf16_doctype_is_refused_by_the_parser() -> None:
    data = BOMB.replace('<?xml version="1.0"?>', '<?xml version="1.0" encoding="UTF-16"?>').encode("utf-16")
    with pytest.raises(TraceFormatError, match="DOCTYPE/ENTITY declarations are not allowed"):
        parse_msccl_xml(data, source="bomb16.xml")


def test_truncated_file_names_file_and_line(tmp_path: Path, custom_allreduce_xml: Path) -> None:
    text = custom_allreduce_xml.read_text()
    cut = tmp_path / "cut.xml"
    cut.write_text(text[: len(text) // 2])
    with pytest.raises(TraceFormatError, match=r"cut\.xml:\d+: not well-formed XML .*truncated file\?"):
        read_msccl_xml(cut)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match=r"nope\.xml: cannot read"):
        read_msccl_xml(tmp_path / "nope.xml")
    empty = tmp_path / "empty.xml"
    empty.write_text("  \n")
    with pytest.raises(TraceFormatError, match=r"empty\.xml:1: empty file"):
        read_msccl_xml(empty)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            doc(tb(0, 1, 1, step(0, "s"), step(1, "xyz"))),
            r"x\.xml:\d+: gpu 0 tb 0 step 1: unknown step type 'xyz'",
        ),
        (
            doc(tb(0, 1, 1, step(0, "s"), step(1, "r", depid=5, deps=0))),
            r"x\.xml:\d+: gpu 0 tb 0 step 1: depid=5 deps=0 points nowhere",
        ),
        (
            doc(
                tb(0, 1, -1, step(0, "s", depid=1, deps=0))
                + "\n"
                + tb(1, -1, 1, step(0, "r", depid=0, deps=0))
            ),
            r"dependency cycle on gpu 0: tb \d step 0 → tb \d step 0",
        ),
        (doc(tb(0, 1, 1, step(0, "s"), step(1, "r", depid=0, deps=1))), r"dependency cycle on gpu 0"),
        (
            doc(tb(0, 1, 1, step(0, "s").replace(' cnt="1"', ""))),
            r"x\.xml:\d+: gpu 0 tb 0 step 0: missing attribute 'cnt'",
        ),
        (
            doc(tb(0, 1, 1, step(0, "s").replace('cnt="1"', 'cnt="one"'))),
            r"attribute cnt='one' is not an integer",
        ),
        (doc(tb(0, 1, 1, step(0, "s", sb="q"))), r"srcbuf='q' is not a buffer"),
        (
            doc(tb(0, -1, 1, step(0, "s"))),
            r"gpu 0 tb 0 step 0: type 's' sends, but its threadblock has send=-1",
        ),
        (doc(tb(0, 1, -1, step(0, "rrc"))), r"type 'rrc' receives, but its threadblock has recv=-1"),
        (
            doc(tb(0, 1, -1, step(0, "s", so=1, cnt=2))),
            r"srcbuf i\[1:3\] is outside the 2 chunks gpu 0 declares",
        ),
        (doc(tb(0, 1, -1, step(0, "s"), step(0, "s"))), r"gpu 0 tb 0 step 0: step index 0 appears twice"),
        (
            doc(tb(0, 1, -1, step(0, "s")) + "\n" + tb(0, 1, -1, step(0, "s"))),
            r"threadblock id 0 appears twice",
        ),
        (doc(tb(0, 5, -1, step(0, "s"))), r"gpu 0 tb 0: send peer 5 must be -1 or another gpu in 0\.\.1"),
        (doc(tb(0, 0, -1, step(0, "s"))), r"send peer 0 must be -1 or another gpu"),
        (doc(tb(0, 1, -1, step(0, "s", cnt=0))), r"cnt must be at least 1"),
        (doc(tb(0, 1, -1, step(0, "s")).replace(' chan="0"', "")), r"gpu 0 <tb>: missing attribute 'chan'"),
        (doc("").replace('coll="allreduce"', 'coll=" "'), r"x\.xml:1: <algo> coll is empty"),
        (
            doc(tb(0, 1, -1, step(0, "s"), chan=-1)),
            r"x\.xml:3: gpu 0 tb 0: chan=-1 must not be negative \(only a threadblock without peers",
        ),
        (doc(tb(0, -1, -1, step(0, "cpy"), chan=-2)), r"gpu 0 tb 0: chan=-2 must not be negative"),
        (doc("").replace(' coll="allreduce"', ""), r"<algo> has no 'coll' attribute"),
        (doc("").replace('<gpu id="1"', '<gpu id="7"'), r"gpu id 7 is outside 0\.\.1"),
        (doc("").replace('<gpu id="1"', '<gpu id="0"'), r"gpu id 0 appears twice"),
        (HEAD + "</algo>", r"<algo> has no <gpu> elements"),
        ("<algorithm/>", r"x\.xml:1: root element must be <algo>, found <algorithm>"),
        (
            "<algo ngpus='2' coll='allreduce'><gpu id='0'></gpu></algo>",
            r"<gpu>: missing attribute 'i_chunks'",
        ),
        ("just text", r"x\.xml:1: not well-formed XML"),
    ],
    ids=lambda v: v[:0] if isinstance(v, str) and "<" in v else None,
)
def test_broken_inputs_are_named_precisely(text: str, message: str) -> None:
    with pytest.raises(TraceFormatError, match=message):
        parse_msccl_xml(text, source="x.xml")


def test_error_line_numbers_are_exact() -> None:
    text = doc(tb(0, 1, 1, step(0, "s"), step(1, "r"), step(2, "zz")))
    line = text.splitlines().index(next(ln for ln in text.splitlines() if 'type="zz"' in ln)) + 1
    with pytest.raises(TraceFormatError, match=rf"^x\.xml:{line}: gpu 0 tb 0 step 2"):
        parse_msccl_xml(text, source="x.xml")
    bad = doc(tb(0, 1, 1, step(0, "s"), step(1, "r", depid=3, deps=3)))
    line = bad.splitlines().index(next(ln for ln in bad.splitlines() if 'depid="3"' in ln)) + 1
    with pytest.raises(TraceFormatError, match=rf"^x\.xml:{line}: gpu 0 tb 0 step 1: depid=3"):
        parse_msccl_xml(bad, source="x.xml")


def test_ring_generator_reproduces_the_custom_allreduce_fixture(custom_allreduce_xml: Path) -> None:
    text = custom_allreduce_xml.read_text()
    body = [ln.strip() for ln in text.splitlines() if "<step" in ln]
    assert [ln.strip() for ln in ring_allreduce_xml(8).splitlines() if "<step" in ln] == body


def test_large_ring_reads_linearly() -> None:
    """128-rank ring all-reduce (the bench input): 65,024 steps into 81,280 nodes (no timing here)."""
    t = parse_msccl_xml(ring_allreduce_xml(128))
    assert t.num_ops == 128 * (4 * 127 + 127)  # 508 steps per rank, 127 of them rrc (two nodes)
    assert t.num_deps == t.num_ops - 128  # one chain per rank


# ---------------------------------------------------------------- hostile inputs (one line, no traceback)


def _small() -> str:
    return ring_allreduce_xml(2)


def test_invalid_utf8_in_an_attribute_is_named() -> None:
    data = _small().encode().replace(b'name="', b'name="\xff\xfe', 1)
    with pytest.raises(TraceFormatError, match=r"^x\.xml:1: byte 0xff is not UTF-8") as err:
        parse_msccl_xml(data, source="x.xml")
    assert "\n" not in str(err.value)
    deeper = _small().encode().replace(b'srcbuf="', b'srcbuf="\xc3', 1)
    line = deeper[: deeper.index(b"\xc3")].count(b"\n") + 1
    with pytest.raises(TraceFormatError, match=rf"^x\.xml:{line}: byte 0xc3 is not UTF-8"):
        parse_msccl_xml(deeper, source="x.xml")


def test_integers_beyond_64_bits_are_refused() -> None:
    text = re.sub(r'srcoff="\d+"', 'srcoff="9223372036854775808"', _small(), count=1)
    with pytest.raises(
        TraceFormatError, match=r"attribute srcoff='9223372036854775808' is out of range \(a signed 64-bit"
    ):
        parse_msccl_xml(text, source="x.xml")
    text = re.sub(r'ngpus="\d+"', 'ngpus="-9223372036854775809"', _small(), count=1)
    with pytest.raises(TraceFormatError, match="ngpus='-9223372036854775809' is out of range"):
        parse_msccl_xml(text)


@pytest.mark.parametrize("ngpus", ["4294967296", "2147483647"])
def test_declared_gpus_above_the_limit_are_refused_upfront(ngpus: str) -> None:
    text = re.sub(r'ngpus="\d+"', f'ngpus="{ngpus}"', _small(), count=1)
    assert len(text) < 4096  # a small file: the refusal comes before any allocation for 2^31 GPUs
    with pytest.raises(
        TraceFormatError,
        match=rf"^x\.xml:1: ngpus={ngpus} exceeds the reader's limit of 65,536 \(raise it with the "
        r"keyword argument max_ngpus\)$",
    ):
        parse_msccl_xml(text, source="x.xml")


def test_declared_chunks_above_the_limit_are_refused_upfront() -> None:
    text = re.sub(r'nchunksperloop="\d+"', 'nchunksperloop="2000000000"', _small(), count=1)
    with pytest.raises(
        TraceFormatError,
        match=r"nchunksperloop=2000000000 exceeds the reader's limit of 1,048,576 \(raise it with the "
        r"keyword argument max_chunks_per_loop\)",
    ):
        parse_msccl_xml(text, source="x.xml")
    big_gpu = re.sub(r'o_chunks="\d+"', 'o_chunks="2000000000"', _small(), count=1)
    with pytest.raises(TraceFormatError, match=r"x\.xml:2: <gpu>: o_chunks=2000000000 exceeds"):
        parse_msccl_xml(big_gpu, source="x.xml")


def test_limits_are_keyword_arguments(tmp_path: Path) -> None:
    text = _small()  # 2 GPUs, 2 chunks per loop
    with pytest.raises(TraceFormatError, match="ngpus=2 exceeds the reader's limit of 1 "):
        parse_msccl_xml(text, max_ngpus=1)
    with pytest.raises(TraceFormatError, match="nchunksperloop=2 exceeds the reader's limit of 1 "):
        parse_msccl_xml(text, max_chunks_per_loop=1)
    path = tmp_path / "ring.xml"
    path.write_text(text)
    assert read_msccl_xml(path, max_ngpus=2, max_chunks_per_loop=2).num_ranks == 2


def test_the_header_is_kept_as_written(shared_fixture: Callable[[str], Path]) -> None:
    path = shared_fixture("msccl/all-reduce-ring-simple.xml")
    t = read_msccl_xml(path)
    head = re.search(r"<algo ([^>]*)>", path.read_text())
    assert head is not None
    written = re.findall(r'(\w+)="([^"]*)"', head[1])
    assert t.params["xml_header"] == [list(p) for p in written]
    assert ["maxcount", "1"] in t.params["xml_header"]  # attributes etstore does not interpret too


# ---------------------------------------------------------------- what msccl-tools writes, runtimes or not

DATA = Path(__file__).resolve().parents[1] / "data" / "msccl"


def test_threadblocks_without_peers_may_say_channel_minus_one() -> None:
    # each gpu reduces its peer's chunk from scratch in <tb send="-1" recv="-1" chan="-1">
    t = read_msccl_xml(DATA / "allreduce_2g_local_tb.xml")
    assert (t.num_ranks, t.num_ops, t.params["nchannels"], t.params["gpu_chunks"]["s"]) == (2, 10, 1, [1, 1])
    reduce = [o for o in rank_ops(t, 0) if o["tb_id"] == 1]
    assert [(o["name"], o["type"], o["comm_tag"]) for o in reduce] == [("reduce_tb1_s0", "COMP_NODE", None)]
    assert "chan" not in decode_attrs(reduce[0]["attrs"])  # no channel to give back
    assert {(1, 4), (4, 2)} <= edges(t, 0)  # it waits for the receive (id 1), the next send (id 2) for it
    # the runtimes refuse a negative channel: the writer gives the threadblock one it may use
    written = to_msccl_xml(t)
    assert written.count('<tb id="1" send="-1" recv="-1" chan="0">') == 2 and 'chan="-1"' not in written
    again = parse_msccl_xml(written)
    assert again.deps.equals(t.deps) and again.ops.drop_columns(["attrs"]).equals(
        t.ops.drop_columns(["attrs"])
    )
    # the scanner and expat read it alike (an attribute the scanner does not know sends it to expat)
    text = (DATA / "allreduce_2g_local_tb.xml").read_text()
    assert parse_msccl_xml(
        text.replace('<step s="0" type="re"', '<step note="x" s="0" type="re"')
    ).ops.equals(t.ops)


def test_a_custom_collective_is_read(caplog: pytest.LogCaptureFixture) -> None:
    # msccl-tools' alltonext (examples/mscclang/alltonext_forward.py 2 1): coll="custom"
    with caplog.at_level("WARNING", logger="etstore.formats.msccl_xml"):
        t = read_msccl_xml(DATA / "alltonext_forward_2n.xml")
    assert not caplog.records  # custom is a name msccl-tools writes: nothing to warn about
    assert (t.params["collective"], t.num_ranks, t.num_ops, t.params["nchunksperloop"]) == (
        "custom",
        16,
        72,
        8,
    )
    assert 'coll="custom"' in to_msccl_xml(t).splitlines()[0]


def test_any_collective_name_is_read_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="etstore.formats.msccl_xml"):
        t = parse_msccl_xml(
            doc(tb(0, 1, -1, step(0, "s")), tb(0, -1, 0, step(0, "r"))).replace("allreduce", "AllToNext")
        )
    assert t.params["collective"] == "AllToNext"
    assert [r.getMessage() for r in caplog.records] == [
        "<memory>:1: coll='AllToNext' is no collective etstore knows; read as a custom collective (checked "
        "for matched messages and deadlocks, not for what it computes)"
    ]
    assert parse_msccl_xml(doc("").replace('coll="allreduce"', 'coll="all_gather"')).params["collective"] == (
        "allgather"
    )


def test_export_writes_only_the_header_attributes_the_input_had(custom_allreduce_xml: Path) -> None:
    # ASTRA-sim's custom_allreduce.xml has no outofplace, minBytes or maxBytes: none are added
    head = custom_allreduce_xml.read_text().splitlines()[0]
    t = read_msccl_xml(custom_allreduce_xml)
    assert [k for k, _ in t.params["xml_header"]] == [
        "name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace"
    ]  # fmt: skip
    assert to_msccl_xml(t).splitlines()[0] == head
    assert to_msccl_xml(t, proto="LL").splitlines()[0] == head.replace('proto="LL128"', 'proto="LL"')
    # a trace with no input header (generated) gets every attribute the runtimes require
    generated = to_msccl_xml(generate("ring", coll="allreduce", ranks=4)).splitlines()[0]
    assert ' outofplace="0" minBytes="0" maxBytes="0"' in generated
