"""MSCCL++ execution plans in and out: MSCCL++'s own plans, hand-checkable plans, round trips."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest

from etstore.algorithms import check_algorithm, generate
from etstore.cli import main
from etstore.digest import content_hash
from etstore.errors import OptionError, TraceFormatError
from etstore.formats import read_trace
from etstore.formats.export import export_trace
from etstore.formats.files import MSCCLPP_PLAN, sniff_format
from etstore.formats.msccl_writer import to_msccl_xml
from etstore.formats.msccl_xml import parse_msccl_xml, read_msccl_xml
from etstore.formats.mscclpp_plan import parse_mscclpp_plan, read_mscclpp_plan
from etstore.formats.mscclpp_writer import plan_problems, to_mscclpp_plan, write_mscclpp_plan
from etstore.model import Trace, decode_attrs

DATA = Path(__file__).resolve().parents[1] / "data" / "mscclpp"
PLANS = sorted(p.name for p in DATA.glob("*.json"))

# (ops, deps, messages, chunks moved, nchunksperloop, check ok) per MSCCL++ plan, pinned
PINNED = {
    "allreduce.json": (80, 48, 32, 32, 16, True),
    "allreduce_packet.json": (18, 18, 6, 8, 4, True),
    "allreduce_pipeline.json": (92, 104, 24, 24, 4, True),
    "reduce.json": (18, 16, 6, 8, 4, True),
    "reduce_nvls.json": (10, 6, 4, 4, 2, True),
    "reduce_nvls_pipeline.json": (10, 6, 4, 4, 2, True),
    "reduce_pack.json": (13, 7, 4, 4, 2, True),
    "reduce_pack_tbg.json": (26, 14, 8, 8, 4, True),
    "reduce_tbg.json": (36, 32, 12, 16, 8, False),
    "transfer_pack.json": (7, 3, 2, 2, 2, True),
    "transfer_pack_tbg.json": (14, 6, 4, 4, 4, True),
}


def messages_and_chunks(t: Trace) -> tuple[int, int]:
    sends = t.ops.filter(pc.equal(t.ops["type"], "COMM_SEND_NODE"))
    return sends.num_rows, int(pc.sum(sends["msg_chunk_cnt"]).as_py() or 0)


def deps_of(t: Trace, rank: int) -> set[tuple[str, str]]:
    names = {
        (r, i): n for r, i, n in zip(*(t.ops[c].to_pylist() for c in ("rank", "id", "name")), strict=True)
    }
    d = t.deps.filter(pc.equal(t.deps["rank"], rank))
    return {
        (names[(rank, s)], names[(rank, x)])
        for s, x in zip(d["src"].to_pylist(), d["dst"].to_pylist(), strict=True)
    }


# ---------------------------------------------------------------- hand-built plans


def local(buf: str, index: int, size: int = 1) -> dict[str, Any]:
    return {"type": buf, "index": index, "size": size}


def remote(bid: int, index: int, size: int = 1) -> dict[str, Any]:
    return {"buffer_id": bid, "index": index, "size": size}


def sig(name: str, *ids: int, ctype: str = "memory") -> dict[str, Any]:
    return {"name": name, "channel_ids": list(ids), "channel_type": ctype}


def plan(
    gpus: list[dict[str, Any]], *, coll: str = "allgather", inplace: bool = False, proto: str = "Simple"
) -> dict[str, Any]:
    return {"name": "hand", "collective": coll, "protocol": proto, "inplace": inplace, "gpus": gpus}


def gpu(
    g: int,
    tbs: list[dict[str, Any]],
    *,
    chunks: tuple[int, int, int] = (1, 2, 0),
    channels: list[dict[str, Any]] | None = None,
    buffers: list[dict[str, Any]] | None = None,
    sems: int = 0,
) -> dict[str, Any]:
    return {
        "id": g,
        "input_chunks": chunks[0],
        "output_chunks": chunks[1],
        "scratch_chunks": chunks[2],
        "threadblocks": [{"id": i, **t} for i, t in enumerate(tbs)],
        "channels": channels or [],
        "remote_buffers": buffers or [],
        "semaphores": [{"init_value": 0} for _ in range(sems)],
    }


def mem_tb(
    ops: list[dict[str, Any]], *, chans: tuple[int, ...] = (0,), bufs: tuple[int, ...] = (0,)
) -> dict[str, Any]:
    return {
        "ops": ops,
        "channels": [{"channel_type": "memory", "channel_ids": list(chans)}] if chans else [],
        "remote_buffer_refs": [{"access_channel_type": "memory", "remote_buffer_ids": list(bufs)}]
        if bufs
        else [],
    }


def allgather_put(*, wait: bool = True, signal: bool = True) -> dict[str, Any]:
    """2-GPU out-of-place all-gather: copy your chunk home, put it into the peer's output, signal, wait."""
    gpus = []
    for g in (0, 1):
        ops = [
            {"name": "copy", "src_buff": [local("i", 0)], "dst_buff": [local("o", g)]},
            {
                "name": "put",
                "src_buff": [local("i", 0)],
                "dst_buff": [remote(0, g)],
                "channel_type": "memory",
            },
            {"name": "nop"},
        ]
        ops += [sig("signal", 0)] if signal else []
        ops += [sig("wait", 0)] if wait else []
        gpus.append(
            gpu(
                g,
                [mem_tb(ops)],
                channels=[{"channel_type": "memory", "connected_to": [1 - g]}],
                buffers=[{"rank": 1 - g, "type": "o", "access_channel_types": ["memory"]}],
            )
        )
    return plan(gpus)


def allgather_get(*, wait: bool = True) -> dict[str, Any]:
    """2-GPU all-gather by gets: each stages its chunk in scratch, signals, and the peer pulls it."""
    gpus = []
    for g in (0, 1):
        ops = [
            {"name": "copy", "src_buff": [local("i", 0)], "dst_buff": [local("s", 0)]},
            {"name": "copy", "src_buff": [local("i", 0)], "dst_buff": [local("o", g)]},
            {"name": "nop"},
            sig("signal", 0),
            *([sig("wait", 0)] if wait else []),
            {
                "name": "get",
                "src_buff": [remote(0, 0)],
                "dst_buff": [local("o", 1 - g)],
                "channel_ids": [0],
                "channel_type": "memory",
            },
        ]
        gpus.append(
            gpu(
                g,
                [mem_tb(ops)],
                chunks=(1, 2, 1),
                channels=[{"channel_type": "memory", "connected_to": [1 - g]}],
                buffers=[{"rank": 1 - g, "type": "s", "access_channel_types": ["memory"]}],
            )
        )
    return plan(gpus)


def test_put_signal_wait_is_one_message_and_checks() -> None:
    t = parse_mscclpp_plan(allgather_put(), name="ag")
    assert (
        t.kind == "algorithm" and t.params["collective"] == "allgather" and t.params["producer"] == "mscclpp"
    )
    assert messages_and_chunks(t) == (2, 2)
    r0 = t.ops.filter(pc.equal(t.ops["rank"], 0)).to_pylist()
    recv = next(o for o in r0 if o["type"] == "COMM_RECV_NODE")
    # the receive lands in rank 0's output slot 1, put there by gpu 1's threadblock 0
    assert recv["name"] == "recv_put_g1_tb0_op1" and recv["comm_src"] == 1
    a = decode_attrs(recv["attrs"])
    assert (a["msccl_type"], a["dstbuf"], a["dstoff"]) == ("r", "o", 1)
    assert check_algorithm(t).ok


def test_a_wait_whose_signal_never_comes_is_refused() -> None:
    with pytest.raises(
        TraceFormatError,
        match=r"<memory>: the plan cannot run to completion: gpu 0 threadblock 0 op 3 \(wait\) waits on "
        r"memory channel 0 for a signal from gpu 1 that never comes \(\+1 more",
    ):
        parse_mscclpp_plan(allgather_put(signal=False))


def test_a_get_is_ordered_by_the_peers_signal() -> None:
    t = parse_mscclpp_plan(allgather_get(), name="agg")
    # the send that serves gpu 1's get reads gpu 0's scratch after what gpu 0 did before its signal
    assert ("copy_copy_g0_tb0_op1", "send_get_g1_tb0_op5") in deps_of(t, 0)
    assert check_algorithm(t).ok
    # without the wait nothing orders the read after the staging copy: the check says so
    bad = check_algorithm(parse_mscclpp_plan(allgather_get(wait=False)))
    assert not bad.ok and any("reads s[0], which holds no data" in p for p in bad.problems)


def test_barrier_and_semaphores_order_threadblocks() -> None:
    def two_tbs(first: dict[str, Any], second: dict[str, Any], g: int) -> dict[str, Any]:
        stage = {"name": "copy", "src_buff": [local("i", 0)], "dst_buff": [local("s", 0)]}
        home = {"name": "copy", "src_buff": [local("i", 0)], "dst_buff": [local("o", g)]}
        send = {
            "name": "put",
            "src_buff": [local("s", 0)],
            "dst_buff": [remote(0, g)],
            "channel_type": "memory",
        }
        return gpu(
            g,
            [
                {"ops": [home, stage, {"name": "nop"}, first], "channels": []},
                mem_tb([second, send, {"name": "nop"}, sig("signal", 0), sig("wait", 0)]),
            ],
            chunks=(1, 2, 1),
            channels=[{"channel_type": "memory", "connected_to": [1 - g]}],
            buffers=[{"rank": 1 - g, "type": "o", "access_channel_types": ["memory"]}],
            sems=1,
        )

    barrier = {"name": "barrier", "barrier_id": 0, "num_threadblocks": 2}
    for first, second in (
        (barrier, barrier),
        ({"name": "sem_release", "semaphore_ids": [0]}, {"name": "sem_acquire", "semaphore_ids": [0]}),
    ):
        t = parse_mscclpp_plan(plan([two_tbs(first, second, g) for g in (0, 1)]))
        assert ("copy_copy_g0_tb0_op1", "send_put_g0_tb1_op1") in deps_of(t, 0)
        assert check_algorithm(t).ok
    short = {"name": "barrier", "barrier_id": 0, "num_threadblocks": 3}
    with pytest.raises(
        TraceFormatError, match=r"op 3 \(barrier\) waits at barrier 0 for 3 threadblocks, 2 arrive"
    ):
        parse_mscclpp_plan(plan([two_tbs(short, short, g) for g in (0, 1)]))


def test_ll_packets_are_read_once_written() -> None:
    gpus = []
    for g in (0, 1):
        gpus.append(
            gpu(
                g,
                [
                    mem_tb(
                        [
                            {
                                "name": "ppkt",
                                "src_buff": [local("i", 0)],
                                "dst_buff": [remote(0, 0)],
                                "channel_type": "memory",
                            }
                        ]
                    ),
                    {
                        "ops": [
                            {"name": "upkt", "src_buff": [local("s", 0)], "dst_buff": [local("o", 1 - g)]},
                            {"name": "copy", "src_buff": [local("i", 0)], "dst_buff": [local("o", g)]},
                        ],
                        "channels": [],
                    },
                ],
                chunks=(1, 2, 1),
                channels=[{"channel_type": "memory", "connected_to": [1 - g]}],
                buffers=[{"rank": 1 - g, "type": "s", "access_channel_types": ["memory"]}],
            )
        )
    t = parse_mscclpp_plan(plan(gpus, proto="LL"))
    # no signal: the unpack waits for the packets themselves
    assert ("recv_ppkt_g1_tb0_op0", "copy_upkt_g0_tb1_op0") in deps_of(t, 0)
    assert check_algorithm(t).ok
    gpus[1]["threadblocks"][0]["ops"] = []
    with pytest.raises(
        TraceFormatError,
        match=r"gpu 0 threadblock 1 op 0 \(upkt\) reads the LL packet at s\[0\], which nothing writes",
    ):
        parse_mscclpp_plan(plan(gpus, proto="LL"))


def test_switch_load_reduce_store_is_loads_reductions_and_stores() -> None:
    n = 3
    gpus = []
    for g in range(n):
        peers = [q for q in range(n) if q != g]
        ops = [
            sig("signal", 0, 1),
            sig("wait", 0, 1),
            {"name": "nop"},
            {
                "name": "glres",
                "src_buff": [{"switch_channel_id": 0, "index": g, "size": 1}],
                "dst_buff": [{"switch_channel_id": 0, "index": g, "size": 1}],
                "channel_type": "switch",
                "reduce_op": "sum",
            },
            {"name": "nop"},
            sig("signal", 0, 1),
            sig("wait", 0, 1),
        ]
        gpus.append(
            gpu(
                g,
                [
                    {
                        "ops": ops,
                        "channels": [
                            {"channel_type": "memory", "channel_ids": [0, 1]},
                            {"channel_type": "switch", "channel_ids": [0]},
                        ],
                    }
                ],
                chunks=(n, n, 0),
                channels=[
                    {"channel_type": "memory", "connected_to": peers},
                    {
                        "channel_type": "switch",
                        "buffer_type": "i",
                        "rank_groups": [{"size": n, "ranks": list(range(n))}],
                    },
                ],
            )
        )
    t = parse_mscclpp_plan(plan(gpus, coll="allreduce", inplace=True))
    report = check_algorithm(t)
    assert report.ok and report.reduces == n * (n - 1)
    # each rank loads n-1 chunks and stores n-1: 2(n-1) messages per glres
    assert messages_and_chunks(t) == (2 * n * (n - 1), 2 * n * (n - 1))


def test_port_put_with_signal() -> None:
    gpus = []
    for g in (0, 1):
        ops = [
            {"name": "copy", "src_buff": [local("i", 0)], "dst_buff": [local("o", g)]},
            {
                "name": "pws",
                "src_buff": [local("i", 0)],
                "dst_buff": [remote(0, g)],
                "channel_ids": [0],
                "channel_type": "port",
            },
            sig("wait", 0, ctype="port"),
        ]
        gpus.append(
            gpu(
                g,
                [
                    {
                        "ops": ops,
                        "channels": [{"channel_type": "port", "channel_ids": [0]}],
                        "remote_buffer_refs": [{"access_channel_type": "port", "remote_buffer_ids": [0]}],
                    }
                ],
                channels=[{"channel_type": "port", "connected_to": [1 - g]}],
                buffers=[{"rank": 1 - g, "type": "o", "access_channel_types": ["port"]}],
            )
        )
    assert check_algorithm(parse_mscclpp_plan(plan(gpus))).ok


def _mutate(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    doc = allgather_put()
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


TB0 = ("gpus", 0, "threadblocks", 0)


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        (("inplace",), KeyError, r"'inplace' must be true or false"),
        (("gpus", 0, "id"), 1, r"gpus\[0\]: id 1 must equal its position 0"),
        ((*TB0, "ops", 1, "name"), "glre", r"gpu 0 threadblock 0 op 1: unknown operation 'glre'"),
        ((*TB0, "ops", 0, "src_buff", 0, "type"), "x", r"src_buff\[0\]: type='x' is not a buffer"),
        (
            (*TB0, "ops", 1, "dst_buff", 0, "buffer_id"),
            3,
            r"op 1 \(put\) dst_buff\[0\]: buffer_id 3 is not one",
        ),
        (
            (*TB0, "ops", 0, "dst_buff", 0, "index"),
            2,
            r"o\[2:3\] is past the 2 chunk\(s\) of gpu 0's output_chunks",
        ),
        (
            (*TB0, "ops", 3, "channel_ids"),
            [4],
            r"op 3 \(signal\): memory channel id 4 is not one of the threadblock's 1",
        ),
        ((*TB0, "id"), 2, r"threadblock 0: id 2 must equal its position 0"),
        (("gpus", 0, "channels", 0, "connected_to"), [0], r"a memory channel from gpu 0 to itself"),
        ((*TB0, "ops", 0, "dst_buff"), [], r"operands L → - .*the executor reads L → L"),
        ((*TB0, "ops", 1, "channel_type"), "switch", r"buffer_id 0 is not one of the threadblock's 0 switch"),
    ],
)
def test_malformed_plans_fail_in_one_line(path: tuple[Any, ...], value: Any, match: str) -> None:
    with pytest.raises(TraceFormatError, match=match) as info:
        parse_mscclpp_plan(_mutate(path, value))
    assert "\n" not in str(info.value)


def test_not_json_and_nested_pipelines(tmp_path: Path) -> None:
    bad = tmp_path / "cut.json"
    text = json.dumps(allgather_put())
    bad.write_text(text[: len(text) // 2])
    with pytest.raises(TraceFormatError, match=r"cut\.json"):
        read_mscclpp_plan(bad)
    doc = allgather_put()
    inner = {"name": "pipeline", "iter_context": {"unit_size": 16, "num_chunks": 1}, "ops": []}
    doc["gpus"][0]["threadblocks"][0]["ops"].insert(0, {**inner, "ops": [inner]})
    with pytest.raises(TraceFormatError, match=r"op 0\.0 \(pipeline\): a pipeline inside a pipeline"):
        parse_mscclpp_plan(doc)


def test_packets_live_in_scratch() -> None:
    doc = allgather_put()
    doc["gpus"][0]["threadblocks"][0]["ops"][1]["name"] = "ppkt"
    with pytest.raises(TraceFormatError, match=r"operand dst_buff\[0\] is an LL packet in 'o'"):
        parse_mscclpp_plan(doc)


# ---------------------------------------------------------------- MSCCL++'s own plans


@pytest.mark.parametrize("name", PLANS)
def test_mscclpps_plans_read_and_check(name: str) -> None:
    t = read_mscclpp_plan(DATA / name)
    report = check_algorithm(t)
    ops, deps, msgs, moved, nchunks, ok = PINNED[name]
    assert (t.num_ops, t.num_deps, report.messages, report.chunks_moved) == (ops, deps, msgs, moved)
    assert t.params["nchunksperloop"] == nchunks and report.ok is ok
    assert not report.hang  # every plan runs to completion
    if name == "reduce_tbg.json":  # a real unsynchronised read (tests/data/mscclpp/SOURCES.md)
        assert (
            report.problems[0]
            == "rank 1 send_rres_g0_tb1_op6 (id 14) reads s[1], which holds no data at that point"
        )


@pytest.mark.parametrize("name", PLANS)
def test_plan_round_trip_is_exact(name: str, tmp_path: Path) -> None:
    t = read_mscclpp_plan(DATA / name)
    out = write_mscclpp_plan(t, tmp_path / name)
    original = json.loads((DATA / name).read_text())
    written = json.loads(out.read_text())
    if name == "allreduce_pipeline.json":  # the older spelling is written as today's parser reads it
        for g in original["gpus"]:
            g["channels"] = [
                {("buffer_type" if k == "buff" else k): v for k, v in c.items()} for c in g["channels"]
            ]
    assert written == original
    again = read_mscclpp_plan(out)
    assert content_hash(again) == content_hash(t)
    assert plan_problems(written) == []


@pytest.mark.parametrize("name", PLANS)
def test_mscclpp_trace_exports_as_msccl_ir_and_as_a_lowered_plan(name: str) -> None:
    t = read_mscclpp_plan(DATA / name)
    want = check_algorithm(t)
    xml = parse_msccl_xml(to_msccl_xml(t))
    stale = t.replace(params={k: v for k, v in t.params.items() if k != "mscclpp"})  # no frame: lowered
    lowered = parse_mscclpp_plan(to_mscclpp_plan(stale))
    for other in (xml, lowered):
        got = check_algorithm(other)
        assert (got.ok, got.messages, got.chunks_moved) == (want.ok, want.messages, want.chunks_moved)


def test_a_changed_trace_is_not_written_from_its_stale_frame() -> None:
    t = read_mscclpp_plan(DATA / "reduce_nvls.json")
    frame = copy.deepcopy(t.params["mscclpp"])
    frame["gpus"][0]["threadblocks"][0]["ops"][1]["name"] = (
        "nop"  # no longer the plan the trace was read from
    )
    written = to_mscclpp_plan(t.replace(params={**t.params, "mscclpp": frame}))
    names = {op["name"] for g in written["gpus"] for tb in g["threadblocks"] for op in tb["ops"]}
    assert "glres" not in names and {"put", "wait", "signal"} <= names
    assert check_algorithm(parse_mscclpp_plan(written)).ok


# ---------------------------------------------------------------- any algorithm out


@pytest.mark.parametrize(
    ("gen", "coll", "ranks"),
    [
        ("ring", "allreduce", 4),
        ("ring", "allreduce", 8),
        ("ring", "allgather", 4),
        ("ring", "reducescatter", 4),
        ("ring", "broadcast", 4),
        ("direct", "allreduce", 4),
        ("halving-doubling", "allreduce", 8),
        ("tree", "allreduce", 8),
        ("alltoall-direct", "alltoall", 4),
    ],
)
def test_generated_algorithms_lower_to_plans_that_check(gen: str, coll: str, ranks: int) -> None:
    algo = generate(gen, coll=coll, ranks=ranks)
    doc = to_mscclpp_plan(algo)
    assert plan_problems(doc) == []
    assert all(len(tb["ops"]) <= 64 for g in doc["gpus"] for tb in g["threadblocks"])
    back = parse_mscclpp_plan(doc)
    report = check_algorithm(back)
    assert report.ok and report.collective == coll
    assert messages_and_chunks(back) == messages_and_chunks(algo)


def test_msccl_ir_fixtures_round_trip_through_mscclpp(shared_fixture: Callable[[str], Path]) -> None:
    paths = sorted(Path(__file__).resolve().parents[1].joinpath("data", "msccl").glob("*.xml"))
    paths.append(
        shared_fixture(
            "astra-sim/examples/system/custom_collectives/custom_ring_allreduce_8npus_1MB/custom_allreduce.xml"
        )
    )
    for path in paths:
        algo = read_msccl_xml(path)
        back = parse_mscclpp_plan(to_mscclpp_plan(algo))
        got, want = check_algorithm(back), check_algorithm(algo)
        assert got.ok and want.ok and got.postcondition == want.postcondition, path.name
        assert messages_and_chunks(back) == messages_and_chunks(algo), path.name


@pytest.mark.shared_files("msccl/*.xml")
def test_rccl_msccl_ir_fixtures_lower_to_plans_that_check(shared_file: Path) -> None:
    algo = read_msccl_xml(shared_file)
    if algo.num_ops > 10_000:
        pytest.skip("large: tested under -m slow")
    back = parse_mscclpp_plan(to_mscclpp_plan(algo))
    got = check_algorithm(back)
    assert got.ok and got.messages == check_algorithm(algo).messages
    assert messages_and_chunks(back) == messages_and_chunks(algo)


@pytest.mark.slow
def test_the_16_rank_ring_lowers_too(shared_fixture: Callable[[str], Path]) -> None:
    algo = read_msccl_xml(shared_fixture("msccl/all-reduce-ring-simple.xml"))
    back = parse_mscclpp_plan(to_mscclpp_plan(algo))
    assert check_algorithm(back).ok and messages_and_chunks(back) == messages_and_chunks(algo)


def test_a_threadblock_past_64_operations_is_cut_in_two() -> None:
    doc = to_mscclpp_plan(generate("ring", coll="allreduce", ranks=8))
    tbs = doc["gpus"][0]["threadblocks"]
    assert (
        len(tbs) == 2
        and tbs[0]["ops"][-1]["name"] == "sem_release"
        and tbs[1]["ops"][0]["name"] == "sem_acquire"
    )


# ---------------------------------------------------------------- wiring


def test_recognised_ingested_checked_and_exported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = DATA / "reduce_pack.json"
    assert sniff_format(src) == MSCCLPP_PLAN
    assert read_trace(src).params["producer"] == "mscclpp"
    store = str(tmp_path / "s")
    assert main(["--store", store, "ingest", str(src)]) == 0
    assert main(["--store", store, "check", "reduce_pack"]) == 0
    out = tmp_path / "out" / "rp"
    assert main(["--store", store, "export", "reduce_pack", "--format", "mscclpp", "--out", str(out)]) == 0
    capsys.readouterr()
    assert json.loads(out.with_suffix(".json").read_text()) == json.loads(src.read_text())


def test_export_refuses_a_workload(tmp_path: Path) -> None:
    workload = generate("ring", coll="allreduce", ranks=2).replace(kind="workload")
    with pytest.raises(OptionError, match=r"the mscclpp format writes algorithm traces"):
        export_trace(workload, tmp_path / "w", format="mscclpp")
