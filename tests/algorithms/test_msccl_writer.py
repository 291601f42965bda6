"""Trace → MSCCL-IR XML: runtime rules hold, and XML → Trace → XML → Trace gives the same DAG."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from etstore.algorithms import GENERATORS, check_algorithm, generate
from etstore.errors import UnsatisfiableError
from etstore.formats import to_msccl_xml, write_msccl_xml
from etstore.formats.msccl_xml import parse_msccl_xml, read_msccl_xml
from etstore.model import CHUNK_COLUMNS, Trace
from etstore.testing import msccl_step, msccl_tb, two_rank_allreduce
from etstore.testing import trace_from_nodes as algo

CUSTOM = "astra-sim/examples/system/custom_collectives/custom_ring_allreduce_8npus_1MB/custom_allreduce.xml"
DAG_COLS = ["rank", "id", "name", "type", "comm_src", "comm_dst", "comm_tag", *CHUNK_COLUMNS, "attrs"]


def assert_same_dag(a: Trace, b: Trace) -> None:
    assert a.ops.select(DAG_COLS).equals(b.ops.select(DAG_COLS))
    key = [("rank", "ascending"), ("dst", "ascending"), ("src", "ascending")]
    assert (
        a.deps.select(["rank", "src", "dst"])
        .sort_by(key)
        .equals(b.deps.select(["rank", "src", "dst"]).sort_by(key))
    )


def runtime_violations(text: str) -> list[str]:
    """What the MSCCL/RCCL XML parser and interpreter would reject (their documented rules)."""
    bad: list[str] = []
    if text.lstrip().startswith("<?"):
        bad.append("XML declaration")
    for ln in text.splitlines():
        if re.search(r"=\s*'|\s{2,}\w+=|\w+=[^\"]", ln.strip()):
            bad.append(f"attribute syntax: {ln.strip()[:60]}")
    root = ET.fromstring(text)
    for a in (
        "name",
        "proto",
        "nchannels",
        "nchunksperloop",
        "ngpus",
        "coll",
        "inplace",
        "outofplace",
        "minBytes",
        "maxBytes",
    ):
        if a not in root.attrib:
            bad.append(f"algo lacks {a}")
    if root.get("proto") not in ("Simple", "LL", "LL128"):
        bad.append("proto")
    for gpu in root.iter("gpu"):
        g = int(gpu.get("id"))
        for a in ("i_chunks", "o_chunks", "s_chunks"):
            if a not in gpu.attrib:
                bad.append(f"gpu lacks {a}")
        tbs = list(gpu.iter("tb"))
        if [int(t.get("id")) for t in tbs] != list(range(len(tbs))):
            bad.append(f"gpu {g}: tb ids not contiguous")
        conns: set[tuple[str, str, str]] = set()
        hasdep_needed: set[tuple[str, str]] = set()
        for t in tbs:
            for side in ("send", "recv"):
                if t.get(side) != "-1":
                    key = (side, t.get(side), t.get("chan"))
                    if key in conns:
                        bad.append(f"gpu {g}: two tbs on {key}")
                    conns.add(key)
                    if t.get(side) == str(g):
                        bad.append("peer is self")
            steps = list(t.iter("step"))
            if len(steps) > 256:
                bad.append("more than 256 steps")
            if [int(s.get("s")) for s in steps] != list(range(len(steps))):
                bad.append(f"gpu {g} tb {t.get('id')}: s not contiguous")
            pending_nop = False
            for s in steps:
                for a in (
                    "s",
                    "type",
                    "srcbuf",
                    "srcoff",
                    "dstbuf",
                    "dstoff",
                    "cnt",
                    "depid",
                    "deps",
                    "hasdep",
                ):
                    if a not in s.attrib:
                        bad.append(f"step lacks {a}")
                typ = s.get("type")
                if typ not in ("s", "r", "rcs", "rrs", "rrc", "rrcs", "cpy", "re", "nop"):
                    bad.append(f"type {typ}")
                if int(s.get("cnt")) >= 72:
                    bad.append("cnt >= 72")
                if s.get("depid") != "-1":
                    hasdep_needed.add((s.get("depid"), s.get("deps")))
                if typ == "nop":
                    if s.get("depid") == "-1":
                        bad.append("nop without dependency (the interpreter's step count would drift)")
                    pending_nop = True
                else:
                    if pending_nop and s.get("depid") == "-1":
                        bad.append("a nop chain must end in a step with its own dependency")
                    pending_nop = False
                    sends = typ in ("s", "rcs", "rrs", "rrcs")
                    recvs = typ in ("r", "rcs", "rrs", "rrc", "rrcs")
                    if sends and t.get("send") == "-1":
                        bad.append("send without peer")
                    if recvs and t.get("recv") == "-1":
                        bad.append("recv without peer")
        for t in tbs:
            for s in t.iter("step"):
                wanted = (t.get("id"), s.get("s")) in hasdep_needed
                if wanted != (s.get("hasdep") == "1"):
                    bad.append(f"gpu {g} tb {t.get('id')} step {s.get('s')}: hasdep wrong")
    return bad


# ---------------------------------------------------------------- round trips


@pytest.mark.shared_files("msccl/*.xml", CUSTOM)
def test_fixture_round_trip(shared_file: Path) -> None:
    t = read_msccl_xml(shared_file)
    text = to_msccl_xml(t)
    # the writer adds no header attribute the input lacked (such a file does not run in MSCCL
    # either way; generated and synthesized algorithms get the full header)
    lacked = {
        a for a in ("outofplace", "minBytes", "maxBytes") if a not in ET.parse(shared_file).getroot().attrib
    }
    assert [v for v in runtime_violations(text) if v.removeprefix("algo lacks ") not in lacked] == []
    again = parse_msccl_xml(text, name=t.name)
    assert_same_dag(t, again)
    assert to_msccl_xml(again) == text  # the written form is a fixed point
    for k in (
        "collective",
        "ngpus",
        "nchunksperloop",
        "inplace",
        "outofplace",
        "proto",
        "minBytes",
        "maxBytes",
        "gpu_chunks",
        "algo_name",
    ):
        assert again.params[k] == t.params[k], k


@pytest.mark.parametrize(("name", "coll"), [(n, c) for n, i in GENERATORS.items() for c in i.collectives])
def test_generated_round_trip(name: str, coll: str) -> None:
    ranks = 8
    t = generate(name, coll=coll, ranks=ranks, chunks=2)
    text = to_msccl_xml(t)
    assert runtime_violations(text) == []
    again = parse_msccl_xml(text, name=t.name)
    assert_same_dag(t, again)
    assert check_algorithm(again).ok


def test_custom_allreduce_text_matches_the_fixture_step_for_step(custom_allreduce_xml: Path) -> None:
    path = custom_allreduce_xml
    ours = [ln.strip() for ln in to_msccl_xml(read_msccl_xml(path)).splitlines()]
    theirs = [ln.strip() for ln in path.read_text().splitlines()]
    assert ours[1:] == theirs[1:]  # every gpu, tb and step line
    # the header keeps only the attributes the file had (no outofplace/minBytes/maxBytes added)
    assert ours[0] == (
        '<algo name="allreduce_ring_1channelsperring" proto="LL128" nchannels="1" '
        'nchunksperloop="8" ngpus="8" coll="allreduce" inplace="1">'
    )


def test_writes_a_file(tmp_path: Path) -> None:
    t = generate("ring", coll="allgather", ranks=3)
    p = write_msccl_xml(t, tmp_path / "sub" / "ring.xml", name='my "ring"', proto="LL")
    text = p.read_text()
    assert text.startswith('<algo name="my__ring_" proto="LL"')
    assert check_algorithm(read_msccl_xml(p)).ok


def test_threadblocks_are_formed_when_the_trace_has_none() -> None:
    t = generate("ring", coll="allgather", ranks=5)
    n = t.num_ops
    bare = t.replace(
        ops=t.ops.set_column(t.ops.schema.get_field_index("tb_id"), "tb_id", pa.nulls(n, pa.int64()))
        .set_column(
            t.ops.schema.get_field_index("local_time_step"), "local_time_step", pa.nulls(n, pa.int64())
        )
        .set_column(t.ops.schema.get_field_index("attrs"), "attrs", pa.nulls(n, pa.binary()))
    )
    assert check_algorithm(bare).ok
    text = to_msccl_xml(bare)
    assert runtime_violations(text) == []
    back = parse_msccl_xml(text)
    assert check_algorithm(back).ok
    assert back.num_ops == n


def test_hand_built_trace_without_attrs_is_written() -> None:
    nodes, edges = two_rank_allreduce()
    text = to_msccl_xml(algo(nodes, edges))
    assert runtime_violations(text) == []
    assert 'type="rrc"' in text
    assert check_algorithm(parse_msccl_xml(text)).ok


def test_ring_at_128_ranks_fits_the_interpreter() -> None:
    t = generate("ring", coll="allreduce", ranks=128)
    text = to_msccl_xml(t)
    assert (
        text.count("<step ") == 128 * 255
    )  # 2N-1 fused steps per rank: the most one threadblock may hold + 1
    back = parse_msccl_xml(text)
    assert back.num_ops == t.num_ops and back.num_deps == t.num_deps


# ---------------------------------------------------------------- what cannot be written


def test_interpreter_limits() -> None:
    with pytest.raises(
        UnsatisfiableError,
        match=r"rank 0 threadblock 0 needs 259 steps; the MSCCL interpreter "
        r"allows 256",
    ):
        to_msccl_xml(generate("ring", coll="allreduce", ranks=130))
    assert (
        to_msccl_xml(generate("ring", coll="allreduce", ranks=130), check_limits=False).count("<tb ") == 130
    )
    with pytest.raises(
        UnsatisfiableError,
        match=r"moves 72 chunks in one step; the MSCCL interpreter allows at "
        r"most 71",
    ):
        to_msccl_xml(generate("direct", coll="allgather", ranks=3, chunks=72))
    with pytest.raises(UnsatisfiableError, match=r"uses channel 32; MSCCL allows channels 0\.\.31"):
        to_msccl_xml(generate("ring", coll="allgather", ranks=2, chunks=33))


def test_two_send_peers_in_one_threadblock() -> None:
    t = generate("direct", coll="allgather", ranks=3)  # rank 0: tb 0 talks to rank 1, tb 1 to rank 2
    rank0 = pc.equal(t.ops["rank"], 0).to_numpy(zero_copy_only=False)
    tb = t.ops["tb_id"].to_numpy().copy()
    lts = t.ops["local_time_step"].to_numpy().copy()
    moved = rank0 & (tb == 1)
    tb[moved], lts[moved] = 0, lts[moved] + 2  # merge them into one threadblock
    ops = t.ops.set_column(t.ops.schema.get_field_index("tb_id"), "tb_id", pa.array(tb))
    ops = ops.set_column(ops.schema.get_field_index("local_time_step"), "local_time_step", pa.array(lts))
    with pytest.raises(
        UnsatisfiableError,
        match=r"rank 0 threadblock 0 sends to both 1 and 2; MSCCL-IR allows one "
        r"send peer",
    ):
        to_msccl_xml(t.replace(ops=ops))


def test_two_threadblocks_on_one_connection(custom_allreduce_xml: Path) -> None:
    text = custom_allreduce_xml.read_text()
    extra = msccl_tb(1, 1, -1, msccl_step(0, "s")) + "\n"
    text = text.replace(
        '    </tb>\n  </gpu>\n  <gpu id="1"', "    </tb>\n" + extra + '  </gpu>\n  <gpu id="1"', 1
    )
    other = extra.replace('send="1" recv="-1"', 'send="-1" recv="0"').replace('type="s"', 'type="r"')
    text = text.replace(
        '    </tb>\n  </gpu>\n  <gpu id="2"', "    </tb>\n" + other + '  </gpu>\n  <gpu id="2"', 1
    )
    t = parse_msccl_xml(text)
    verdict = check_algorithm(t).verdict  # export refuses in the check's words
    assert verdict.startswith("rank 0: threadblocks 0 and 1 both send to rank 1 on channel 0; message order")
    with pytest.raises(
        UnsatisfiableError, match=re.escape(f"cannot write 'algorithm' as MSCCL-IR: {verdict}")
    ):
        to_msccl_xml(t)


def test_nodes_msccl_cannot_express() -> None:
    t = generate("ring", coll="allgather", ranks=3)
    types = t.ops["type"].to_pylist()
    types[0] = "COMM_COLL_NODE"
    bad = t.replace(ops=t.ops.set_column(t.ops.schema.get_field_index("type"), "type", pa.array(types)))
    with pytest.raises(
        UnsatisfiableError,
        match=r"rank 0 node 0 \('send_tb0_s0', COMM_COLL_NODE\) is neither a "
        r"send, a receive, nor a reduce/copy COMP node",
    ):
        to_msccl_xml(bad)


def test_unmatched_messages_and_cycles_are_refused() -> None:
    nodes, edges = two_rank_allreduce()
    with pytest.raises(
        UnsatisfiableError,
        match=r"'hand' as MSCCL-IR: rank 0 x \(id 9\) is never received: rank 0 sends 3 message\(s\) to "
        r"rank 1 on tag 0, but rank 1 posts 2 receive\(s\)$",
    ):
        to_msccl_xml(
            algo([*nodes, {**nodes[0], "id": 9, "name": "x", "tb_id": None, "local_time_step": None}], edges)
        )
    # a cycle is named as the deadlock it is, with its nodes, as check_algorithm names it
    with pytest.raises(
        UnsatisfiableError,
        match=r"'hand' as MSCCL-IR: deadlock: rank 0 recv4 \(id 4\) → rank 0 send3 \(id 3\) → ",
    ):
        to_msccl_xml(algo(nodes, [*edges, (0, 4, 0)]))


def test_params_and_proto_are_validated() -> None:
    nodes, edges = two_rank_allreduce()
    t = algo(nodes, edges)
    with pytest.raises(UnsatisfiableError, match=r"params lack 'collective'"):
        to_msccl_xml(t.replace(params={"ngpus": 2}))
    with pytest.raises(UnsatisfiableError, match=r"proto 'LL256' is not one of Simple, LL, LL128"):
        to_msccl_xml(t, proto="LL256")
    assert int(pc.count(t.ops["id"]).as_py()) == 10


@pytest.mark.shared_files("msccl/*.xml")
def test_header_comes_back_byte_for_byte(shared_file: Path) -> None:
    path = shared_file
    head = re.search(r"<algo [^>]*>", path.read_text())
    assert head is not None
    text = to_msccl_xml(read_msccl_xml(path), check_limits=False)
    assert text.splitlines()[0] == head[0]


def test_changed_parameters_win_over_the_spelling(shared_fixture: Callable[[str], Path]) -> None:
    t = read_msccl_xml(shared_fixture("msccl/allreduce-allpairs-8n-ll-32tb.xml"))
    assert t.params["proto"] == "LL" and t.params["maxBytes"] == 65536
    changed = t.replace(params={**t.params, "proto": "Simple", "maxBytes": 1024})
    head = to_msccl_xml(changed).splitlines()[0]
    assert head == (
        '<algo name="allreduce_pairs" proto="Simple" nchannels="4" nchunksperloop="256" ngpus="8" '
        'coll="allreduce" inplace="1" outofplace="0" minBytes="0" maxBytes="1024">'
    )
    assert to_msccl_xml(t, proto="LL128").splitlines()[0].count('proto="LL128"') == 1
    quoted = t.replace(params={**t.params, "xml_header": [*t.params["xml_header"], ["note", 'a "b" & c']]})
    assert to_msccl_xml(quoted).splitlines()[0].endswith(' note="a &quot;b&quot; &amp; c">')
