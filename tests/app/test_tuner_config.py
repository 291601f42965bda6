"""Tuner configs out, on a real store: winners per bucket, worked out by hand, and the written
config read back by the example plugin's rules answering every logged call with its winner."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from etstore.algorithms.generators import generate
from etstore.app.ingest_files import ingest_paths
from etstore.app.runs import record_sweep
from etstore.app.tuner_config import BUCKET_COLUMNS, run_choices, sweep_choices
from etstore.errors import OptionError, UnknownTraceError
from etstore.formats import read_msccl_xml
from etstore.formats.tuner_config import (
    config_problems,
    match_tuner_config,
    nccl_collective,
    parse_tuner_config,
)
from etstore.sim.sweep import sweep
from etstore.store import EmbeddedStore

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tuner" / "nccl_tuner_4r.csv"

# One size per power-of-two bucket, so each bucket's winner is the fastest choice at that size.
HAND = """\
collective,size,nranks,nnodes,topology,algo,proto,nchannels,chunk_size,time_us
allreduce,1024,8,2,t,Ring,LL,2,,20
allreduce,1024,8,2,t,Tree,LL,2,,15
allreduce,2048,8,2,t,Tree,LL,2,,16
allreduce,2048,8,2,t,Ring,LL,2,,18
allreduce,4096,8,2,t,Ring,LL128,4,,19
allreduce,4096,8,2,t,Tree,LL,2,,25
allreduce,65536,8,2,t,Ring,Simple,8,131072,40
allreduce,65536,8,2,t,Ring,Simple,8,131072,44
allreduce,65536,8,2,t,NVLS,Simple,,,50
allreduce,1048576,8,2,t,halving-doubling,Simple,8,,100
allreduce,1048576,8,2,t,Ring,Simple,8,,120
allreduce,4194304,8,2,t,Ring,,8,,300
allreduce,4194304,8,2,t,Tree,Simple,8,,350
allgather,4096,4,,t,PAT,LL,,,8
allgather,8192,4,,t,PAT,LL,,,9
allgather,8192,4,,t,Ring,LL,,,12
alltoall,1024,8,2,t,Ring,LL,2,,5
"""

# (collective, size) -> the NCCL choice the config must answer with, None: no line answers
WANTED: dict[tuple[str, int], tuple[str, str, int] | None] = {
    ("allreduce", 1024): ("tree", "ll", 2),  # 15 < 20
    ("allreduce", 2048): ("tree", "ll", 2),  # 16 < 18: the same line as 1024 (adjacent buckets)
    ("allreduce", 4096): ("ring", "ll128", 4),  # 19 < 25
    ("allreduce", 65536): ("ring", "simple", 8),  # median 42 < 50 (chunk size not in the config)
    ("allreduce", 1048576): None,  # halving-doubling won: no NCCL algorithm
    ("allreduce", 4194304): None,  # Ring won without a protocol
    ("allgather", 4096): ("pat", "ll", -1),  # channels not logged
    ("allgather", 8192): ("pat", "ll", -1),  # 9 < 12
}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EmbeddedStore]:
    path = tmp_path / "hand.csv"
    path.write_text(HAND)
    with EmbeddedStore(tmp_path / "store") as s:
        ingest_paths(s, [path, EXAMPLE])
        yield s


def _steps(text: str) -> list[dict[str, Any]]:
    head, *rows = text.splitlines()
    return [dict(zip(head.split(","), r.split(","), strict=True)) for r in rows]


def test_every_logged_call_is_answered_by_its_winner(store: EmbeddedStore) -> None:
    got = run_choices(store.warehouse, "hand")
    text = got.config_text()
    assert text.splitlines()[4:] == [
        "allgather,4096,16383,pat,ll,-1,-1,4",
        "allreduce,1024,4095,tree,ll,2,2,8",
        "allreduce,4096,8191,ring,ll128,4,2,8",
        "allreduce,65536,131071,ring,simple,8,2,8",
    ]
    conf = parse_tuner_config(text)
    assert config_problems(text) == [] and conf == got.config
    for step in _steps(HAND):
        coll = nccl_collective(step["collective"])
        if coll is None:  # all-to-all: the plugin has no such collective
            continue
        size, ranks = int(step["size"]), int(step["nranks"])
        for nodes in [int(step["nnodes"])] if step["nnodes"] else [1, 3]:  # no nodes logged: any
            line = match_tuner_config(conf, coll, size, nodes=nodes, ranks=ranks)
            answer = None if line is None else (line.algorithm, line.protocol, line.channels)
            assert answer == WANTED[coll, size], step
    # sizes between the logged buckets match no line: NCCL's own choice
    assert match_tuner_config(conf, "allreduce", 8192, nodes=2, ranks=8) is None
    assert match_tuner_config(conf, "allreduce", 1024, nodes=2, ranks=16) is None


def test_the_table_by_hand(store: EmbeddedStore) -> None:
    got = run_choices(store.warehouse, "hand")
    rows = {(b["collective"], b["size_bucket_bytes"]): b for b in got.buckets}
    assert all(list(b) == list(BUCKET_COLUMNS) for b in got.buckets) and len(rows) == 9
    first = rows["ALL_REDUCE", 1024]
    assert (first["choice"], first["median_time_us"], first["runner_up"], first["runner_up_time_us"]) == (
        "Tree/LL/2ch",
        15.0,
        "Ring/LL/2ch",
        20.0,
    )
    assert (first["margin_us"], round(first["margin_pct"], 4), first["choices_tried"]) == (5.0, 33.3333, 2)
    assert (first["config_line"], first["config_min_bytes"], first["config_max_bytes"]) == (6, 1024, 4095)
    chunked = rows["ALL_REDUCE", 65536]
    assert (chunked["median_time_us"], chunked["samples"], chunked["bucket_samples"]) == (42.0, 2, 3)
    assert chunked["note"] == "chunk_bytes 131072 not written: the config has no chunk size"
    assert rows["ALL_REDUCE", 1048576]["left_out"] == (
        "'halving-doubling' is not an NCCL algorithm (tree, ring, collnet_direct, collnet_chain, nvls, "
        "nvls_tree, pat)"
    )
    assert rows["ALL_REDUCE", 4194304]["left_out"].startswith("no protocol logged")
    assert rows["ALL_TO_ALL", 1024]["left_out"].startswith("the plugin has no collective ALL_TO_ALL")
    assert rows["ALL_TO_ALL", 1024]["runner_up"] is None and rows["ALL_TO_ALL", 1024]["margin_us"] is None
    assert [b["nccl_algorithm"] for b in got.left_out()] == [None, None, None]


def test_the_example_run_by_hand_and_beside_v_tuner_best(store: EmbeddedStore) -> None:
    got = run_choices(store.warehouse, "nccl_tuner_4r")
    # 1 KiB bucket: Tree 10, 11 (1,024 B) and 30 (1,536 B): median 11; Ring 12, 14: median 13
    # 64 KiB: Ring/LL128 40, 42: 41; Tree 45. 1 MiB: the stored ring 175; Ring 180, 190: 185; NVLS 200
    assert [(b["choice"], b["median_time_us"], b["runner_up_time_us"]) for b in got.buckets] == [
        ("Tree/LL/2ch", 11.0, 13.0),
        ("Ring/LL128/4ch", 41.0, 45.0),
        ("ring_allreduce_4r/Simple/2ch", 175.0, 185.0),
    ]
    assert got.config_text().splitlines()[4:] == [
        "allreduce,1024,2047,tree,ll,2,1,4",
        "allreduce,65536,131071,ring,ll128,4,1,4",
    ]
    # a 1,536-byte call gets its bucket's winner (Tree), though Ring was faster at 1,536 B alone
    line = match_tuner_config(parse_tuner_config(got.config_text()), "allreduce", 1536, nodes=1, ranks=4)
    assert line is not None and line.algorithm == "tree"
    # nothing is stored for the logged algorithm_trace to link to: the trace column holds the name logged
    assert [b["trace"] for b in got.buckets] == [None, None, "ring_allreduce_4r"]
    assert (
        got.buckets[2]["left_out"]
        == "the choice ran algorithm trace 'ring_allreduce_4r', not an NCCL algorithm"
    )


def _same_as_the_view(store: EmbeddedStore, buckets: list[dict[str, Any]]) -> None:
    """The winners are v_tuner_best's (one rank and node count per bucket)."""
    view = store.sql(
        "SELECT algorithm, protocol, channels, chunk_bytes, trace, median_time_us, actions_tried "
        "FROM v_tuner_best WHERE run = 'nccl_tuner_4r' ORDER BY size_bucket_bytes"
    ).to_pylist()
    keys = ("algorithm", "protocol", "channels", "chunk_bytes", "trace", "median_time_us")
    assert [{k: b[k] for k in keys} | {"actions_tried": b["choices_tried"]} for b in buckets] == view


def test_a_linked_step_is_expressed_by_its_algorithm(tmp_path: Path) -> None:
    with EmbeddedStore(tmp_path / "s") as s:
        s.ingest(read_msccl_xml(ROOT / "examples" / "algorithms" / "ring_allreduce_4r.xml"))
        s.ingest(generate("tree", coll="allreduce", ranks=4, chunks=1))
        ingest_paths(s, [EXAMPLE])
        got = run_choices(s.warehouse, "nccl_tuner_4r")
        _same_as_the_view(s, got.buckets)
    tree = got.buckets[0]
    assert (tree["algorithm"], tree["trace"], tree["nccl_algorithm"]) == (
        "Tree",
        "tree-allreduce-4r-1c",
        "tree",
    )
    assert got.buckets[2]["left_out"] == (
        "the choice ran algorithm trace 'ring_allreduce_4r', not an NCCL algorithm"
    )


def test_topologies_the_plugin_cannot_tell_apart(tmp_path: Path, store: EmbeddedStore) -> None:
    mixed = tmp_path / "mixed.csv"
    mixed.write_text(
        "collective,size,nranks,nnodes,topology,algo,proto,time_us\n"
        "allreduce,1024,8,1,nvlink,Tree,LL,10\nallreduce,1024,8,1,pcie,Ring,LL,12\n"
        "allreduce,1024,4,1,pcie,Ring,LL,12\n"
    )
    ingest_paths(store, [mixed])
    got = run_choices(store.warehouse, "mixed")
    assert [b["left_out"] is None for b in got.buckets] == [False, True, False]  # nvlink/8, pcie/4, pcie/8
    assert "topologies nvlink, pcie" in str(got.buckets[0]["left_out"])
    assert [c.fields() for c in got.config] == [["allreduce", "1024", "2047", "ring", "ll", "-1", "1", "4"]]
    one = run_choices(store.warehouse, "mixed", topology="nvlink")
    assert [c.fields()[3] for c in one.config] == ["tree"] and one.source["topology"] == "nvlink"
    with pytest.raises(OptionError, match=r"mixed has no topology 'nvl' \(it has: nvlink, pcie\)"):
        run_choices(store.warehouse, "mixed", topology="nvl")


def test_runs_are_found_by_name_or_id(store: EmbeddedStore) -> None:
    assert run_choices(store.warehouse, 2).source["name"] == "nccl_tuner_4r"
    with pytest.raises(UnknownTraceError, match=r"no tuner run 'nope' \(SELECT run_id, name FROM tuner_runs"):
        run_choices(store.warehouse, "nope")


# ---------------------------------------------------------------- sweeps

SIZES = [1024, 2048, 65536, 1 << 20]


def _fastest(points: list[dict[str, Any]], algorithms: set[str]) -> dict[int, str]:
    """Per size, the algorithm with the least simulated time among ``algorithms``."""
    best: dict[int, tuple[float, str]] = {}
    for p in points:
        if p["algorithm"] in algorithms:
            best[p["size_bytes"]] = min(
                best.get(p["size_bytes"], (float("inf"), "")), (p["time_ns"], p["algorithm"])
            )
    return {size: name for size, (_, name) in best.items()}


def test_a_sweep_needs_a_protocol_and_an_nccl_name(tmp_path: Path) -> None:
    points = sweep(SIZES, ["ring", "tree", "native"], ["ring:4,bw=50,lat=500"], collective="allreduce")
    with EmbeddedStore(tmp_path / "s") as s:
        sid = record_sweep(s.warehouse, points)
        bare = sweep_choices(s.warehouse, sid)
        given = sweep_choices(s.warehouse, str(sid), protocol="LL128")
    assert bare.config == [] and {b["left_out"] for b in bare.buckets} == {
        "a simulation models no NCCL protocol: give --protocol to write it"
    }
    wanted = _fastest(points.to_pylist(), {"ring", "tree", "native"})
    assert [b["algorithm"] for b in given.buckets] == [wanted[s] for s in SIZES]
    conf = parse_tuner_config(given.config_text())
    nccl = {"ring": "ring", "native": "ring", "tree": "tree"}
    for size in SIZES:
        line = match_tuner_config(conf, "allreduce", size, nodes=5, ranks=4)  # nodes unknown: any
        assert line is not None and (line.algorithm, line.protocol, line.channels) == (
            nccl[wanted[size]],
            "ll128",
            -1,
        )
        assert match_tuner_config(conf, "allreduce", size, nodes=1, ranks=8) is None
    assert all(c.nodes == -1 and c.ranks == 4 for c in conf)
    assert given.source == {
        "kind": "sweep",
        "id": sid,
        "name": f"sweep {sid}",
        "topology": None,
        "protocol": "ll128",
    }


def test_a_sweep_winner_without_an_nccl_name_is_left_out(tmp_path: Path) -> None:
    points = sweep(SIZES[:2], ["ring", "direct"], ["ring:4,bw=50,lat=500"], collective="allreduce")
    assert set(_fastest(points.to_pylist(), {"ring", "direct"}).values()) == {"direct"}
    with EmbeddedStore(tmp_path / "s") as s:
        got = sweep_choices(s.warehouse, record_sweep(s.warehouse, points), protocol="simple")
    assert got.config == [] and [b["runner_up"] for b in got.buckets] == ["ring", "ring"]
    assert str(got.buckets[0]["left_out"]).startswith("etstore's 'direct' has no NCCL algorithm")


def test_sweep_errors(tmp_path: Path) -> None:
    points = sweep(
        SIZES[:1], ["ring"], ["ring:4,bw=50,lat=500", "switch:4,bw=50,lat=500"], collective="allreduce"
    )
    with EmbeddedStore(tmp_path / "s") as s:
        sid = record_sweep(s.warehouse, points)
        both = sweep_choices(s.warehouse, sid, protocol="simple")
        assert both.config == [] and all(
            "choose one with --topology" in str(b["left_out"]) for b in both.buckets
        )
        one = sweep_choices(s.warehouse, sid, protocol="simple", topology="switch:4,bw=50,lat=500")
        assert [c.fields() for c in one.config] == [
            ["allreduce", "1024", "2047", "ring", "simple", "-1", "-1", "4"]
        ]
        with pytest.raises(UnknownTraceError, match=r"no sweep 9 \(SELECT DISTINCT sweep_id"):
            sweep_choices(s.warehouse, 9)
        with pytest.raises(OptionError, match=r"sweep 'x': a sweep is named by its id, an integer"):
            sweep_choices(s.warehouse, "x")
        with pytest.raises(OptionError, match=r"protocol 'fast' is not NCCL's: one of ll, ll128, simple"):
            sweep_choices(s.warehouse, sid, protocol="fast")
