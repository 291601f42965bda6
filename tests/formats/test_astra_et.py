"""``.et`` export of recorded traces as ASTRA-sim's Chakra feeder and workload layer accept them.

What ASTRA-sim 518bd51 refuses was read from its source and confirmed by running the analytical
backend built from it (bench/README.md): METADATA_NODEs abort it (Statistics), a dependency on an
absent node makes the feeder throw, a communication node marked ``is_cpu_op`` throws in
``Workload::issue_comm``. The exported DLRM and DDP recordings ran to the end there, each rank's
finish equal to etstore's simulation of the same files (pinned below).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest

from etstore.formats._frames import varint
from etstore.formats.astra_et import for_astra_sim
from etstore.formats.et import read_et, write_et
from etstore.formats.export import export_trace
from etstore.formats.recognise import read_trace
from etstore.model import Trace, deps_table, ops_table
from etstore.proto import NODE_TYPES, Node
from etstore.sim import read_network_config, read_system_config, simulate

ROOT = Path(__file__).resolve().parents[2]
ALLOWED_TYPES = {
    "COMP_NODE",
    "COMM_COLL_NODE",
    "COMM_SEND_NODE",
    "COMM_RECV_NODE",
    "MEM_LOAD_NODE",
    "MEM_STORE_NODE",
}
COMM_TYPES = {"COMM_COLL_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE"}


def _nodes(path: Path) -> list[Node]:
    """Every node of one exported file, parsed with the Chakra message classes."""
    data = path.read_bytes()
    length, pos = varint(data, 0, path)
    pos += length  # the GlobalMetadata
    out = []
    while pos < len(data):
        length, pos = varint(data, pos, path)
        out.append(Node.FromString(data[pos : pos + length]))
        pos += length
    return out


def _feeder_accepts(paths: list[Path]) -> dict[str, int]:
    """Assert what ASTRA-sim's feeder and workload layer need of every node; count per type."""
    counts: dict[str, int] = {}
    for path in (p for p in paths if p.name.endswith(".et")):
        nodes = _nodes(path)
        ids = {n.id for n in nodes}
        for n in nodes:
            kind = NODE_TYPES[n.type]
            counts[kind] = counts.get(kind, 0) + 1
            assert kind in ALLOWED_TYPES, (path.name, n.id, kind)
            assert set(n.data_deps) <= ids and set(n.ctrl_deps) <= ids, (
                path.name,
                n.id,
            )  # graph_sanity_check
            attrs = {a.name: a for a in n.attr}
            if kind in COMM_TYPES:
                assert not (attrs.get("is_cpu_op") and attrs["is_cpu_op"].bool_val), (path.name, n.id)
            if kind == "COMM_COLL_NODE":
                assert {"comm_type", "comm_size"} <= set(attrs), (path.name, n.id)
    return counts


def test_recorded_dlrm_exports_as_astra_sim_runs_it(tmp_path: Path) -> None:
    dlrm = read_trace(ROOT / "examples" / "dlrm_8r")
    out = export_trace(dlrm, tmp_path / "dlrm")
    counts = _feeder_accepts(list(out))
    assert counts == {"COMP_NODE": 15636, "COMM_COLL_NODE": 64}
    back = read_et(tmp_path / "dlrm")
    cpu = back.ops.filter(pc.equal(back.ops["type"], "COMP_NODE"))
    assert pc.sum(pc.cast(cpu["is_cpu_op"], "int64")).as_py() == 13456  # CPU ops stay CPU ops
    assert out.changes == ("dropped 24 METADATA_NODEs (ASTRA-sim aborts on them)",)


def test_recorded_gloo_ddp_exports_as_astra_sim_runs_it(tmp_path: Path, rt_inputs: Path) -> None:
    ddp = read_trace(ROOT / "tests" / "data" / "torch_ddp_2r")
    out = export_trace(ddp, tmp_path / "ddp")
    assert _feeder_accepts(list(out)) == {"COMP_NODE": 656, "COMM_COLL_NODE": 8}
    assert out.changes == (
        "dropped 6 METADATA_NODEs (ASTRA-sim aborts on them)",
        "8 communication nodes recorded on a CPU thread written with is_cpu_op false (ASTRA-sim runs "
        "communication on the NPU's communication slot only)",
    )
    # ASTRA-sim analytical (518bd51, congestion-unaware) ran these files on a ring of 2
    # (50 GB/s, 500 ns) with rt_template's system config: ranks 0 and 1 finished at these ns
    net = tmp_path / "ring2.yml"
    net.write_text("topology: [ Ring ]\nnpus_count: [ 2 ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n")
    network = read_network_config(net)
    cfg = read_system_config(rt_inputs / "system_cfg.json")
    res = simulate(read_et(tmp_path / "ddp"), network.topology, config=cfg, dims=network.dims)
    assert res.ranks["total_ns"].to_pylist() == [17_159_000.0, 18_565_000.0]


def test_metadata_nodes_are_dropped_and_waits_through_them_kept() -> None:
    ops = ops_table(
        {
            "rank": [0] * 5,
            "id": [1, 2, 3, 4, 5],
            "type": ["COMP_NODE", "METADATA_NODE", "METADATA_NODE", "COMP_NODE", "COMP_NODE"],
        }
    )
    # 1 -> 2 -> 3 -> 4 (ctrl), 2 -> 5 (data), and 1 -> 4 already there
    deps = deps_table([0] * 5, [1, 2, 3, 2, 1], [2, 3, 4, 5, 4], ["ctrl", "ctrl", "ctrl", "data", "ctrl"])
    fixed, notes = for_astra_sim(Trace(ops, deps, name="m"))
    assert fixed.ops["id"].to_pylist() == [1, 4, 5]
    edges = sorted(zip(*(fixed.deps[c].to_pylist() for c in ("src", "dst", "kind")), strict=True))
    assert edges == [(1, 4, "ctrl"), (1, 5, "data")]
    assert notes == (
        "dropped 2 METADATA_NODEs (ASTRA-sim aborts on them); 1 dependencies through them now wait for "
        "what they waited for",
    )


def test_dangling_dependencies_tags_and_collective_types(tmp_path: Path) -> None:
    ops = ops_table(
        {
            "rank": [0, 0, 0],
            "id": [1, 2, 3],
            "type": ["COMM_SEND_NODE", "COMM_COLL_NODE", "COMP_NODE"],
            "comm_dst": [1, None, None],
            "comm_size": [64, 64, None],
            "comm_type": [None, "BARRIER", None],
        }
    )
    trace = Trace(ops, missing=deps_table([0], [99], [3]), name="d")
    out = export_trace(trace, tmp_path / "d")
    back = read_et(tmp_path / "d")
    assert back.num_missing == 0
    assert back.ops["comm_tag"].to_pylist() == [0, None, None]
    assert back.ops["comm_type"].to_pylist() == [None, "BROADCAST", None]
    assert out.changes == (
        "dropped 1 dependencies on nodes absent from their rank's file (ASTRA-sim's feeder refuses the file)",
        "1 sends and receives without comm_tag written with tag 0",
        "1 collectives ASTRA-sim does not run (BARRIER) written as BROADCAST, which it replays for the "
        "node's duration (as etstore replays them)",
    )


def test_a_trace_astra_sim_runs_is_written_unchanged(tmp_path: Path, rt_template: Path) -> None:
    trace = read_et(rt_template / "chakra_trace")
    out = export_trace(trace, tmp_path / "w")
    assert out.changes == ()
    for r in range(8):
        assert (tmp_path / f"w.{r}.et").read_bytes() == (rt_template / f"chakra_trace.{r}.et").read_bytes()


@pytest.mark.parametrize("verbatim", [True, False])
def test_verbatim_keeps_what_the_default_changes(tmp_path: Path, verbatim: bool) -> None:
    ops = ops_table({"rank": [0, 0], "id": [1, 2], "type": ["METADATA_NODE", "COMP_NODE"]})
    write_et(Trace(ops, name="v"), tmp_path / "in" / "v")
    out = export_trace(read_et(tmp_path / "in" / "v"), tmp_path / "out" / "v", verbatim=verbatim)
    same = (tmp_path / "out" / "v.0.et").read_bytes() == (tmp_path / "in" / "v.0.et").read_bytes()
    assert same is verbatim and bool(out.changes) is not verbatim
