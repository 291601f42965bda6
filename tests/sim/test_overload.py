"""Physically impossible results do not pass unremarked (issue 14, item 5).

The congestion-unaware model lets any number of messages share a link at full speed.
A result whose links are offered more than their bandwidth is flagged: the library
lists those links in ``SimResult.overloaded`` and the CLI prints one warning line.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from etstore.app.runs import record_run
from etstore.cli import main
from etstore.model import Trace, ops_table
from etstore.sim import SimConfig, simulate
from etstore.store import open_store
from etstore.topology import Topology, parse_topology

MIB64 = 64 << 20
BYTES_PER_NS_50 = 50 * 2**30 / 1e9  # 50 GB/s, GB = 2^30


def _collective(n: int, size: int, coll: str) -> Trace:
    ops = ops_table(
        {
            "rank": np.arange(n),
            "id": np.ones(n, dtype=np.uint64),
            "type": ["COMM_COLL_NODE"] * n,
            "comm_type": [coll] * n,
            "comm_size": [size] * n,
        }
    )
    return Trace(ops, name=f"{coll.lower()}-{n}")


def test_direct_all_gather_on_a_mesh_is_flagged_unaware_and_not_aware() -> None:
    # the case: every rank sends its 64 MiB to the 63 others at once, dimension-order
    # routes on an 8x8 mesh of 50 GB/s links
    topo = parse_topology("mesh:8x8,bw=50,lat=500")
    w = _collective(64, MIB64, "ALL_GATHER")
    res = simulate(w, topo, algorithms={"ALL_GATHER": "direct"})
    # unaware: the farthest pair (14 hops) sets the makespan, as if nothing shared a link
    assert res.total_ns == 14 * 500 + MIB64 / BYTES_PER_NS_50 == 1_257_000.0
    # bytes over all links: 64 MiB x the summed hop counts of all ordered pairs; on a line of 8,
    # sum |a - b| = 168, so on the 8x8 grid 2 dims x 168 x 8 x 8 = 21,504 hops
    assert float(np.sum(res.links["bytes"].to_numpy())) == 21_504 * MIB64
    # on average a link is offered 21,504 x 64 MiB / (224 links x 1.257 ms) ≈ 4,770 GB/s > 50:
    # some link must exceed its bandwidth, and the result says which
    assert res.overloaded.num_rows > 0
    worst = res.overloaded.to_pylist()[0]
    assert (
        worst["bandwidth_gb_per_s"] == 50.0
        and worst["offered_gb_per_s"] > 21_504 * 64 / 224 / 1.257e-3 / 1024
    )
    assert worst["offered_gb_per_s"] == max(r["offered_gb_per_s"] for r in res.overloaded.to_pylist())
    line = res.overload_warning()
    assert line is not None and f"link {worst['link']} (NPU {worst['src']} -> {worst['dst']})" in line
    assert "50.0 GB/s" in line and res.summary()["overloaded_links"] == res.overloaded.num_rows
    # congestion-aware: links queue, nothing is offered beyond bandwidth, busbw drops below one
    # link's rate (50 GB/s with GB = 2^30 is 53.69 GB/s in busbw's GB = 10^9)
    aware = simulate(w, topo, config=SimConfig(congestion="aware"), algorithms={"ALL_GATHER": "direct"})
    assert aware.overloaded.num_rows == 0 and aware.overload_warning() is None
    link = BYTES_PER_NS_50  # 50 GB/s (GB = 2^30) in bytes per ns, i.e. in GB/s with GB = 10^9
    assert (
        aware.collectives["busbw_gb_per_s"][0].as_py() < link < res.collectives["busbw_gb_per_s"][0].as_py()
    )


@pytest.mark.parametrize("algo", ["native", "ring"])
def test_ring_all_reduce_on_a_ring_is_not_flagged(algo: str) -> None:
    res = simulate(_collective(8, MIB64, "ALL_REDUCE"), Topology.ring(8), algorithms={"ALL_REDUCE": algo})
    assert res.overloaded.num_rows == 0 and res.overload_warning() is None
    # each link carries one message at a time: well below its bandwidth over its window
    assert res.links["utilization"].to_numpy().max() < 1.0


def test_cli_warns_once_on_stderr_and_keeps_json_clean(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    s = tmp_path / "s"
    with open_store(s, write=True) as store:
        store.ingest(_collective(64, MIB64, "ALL_GATHER"))
        store.ingest(_collective(8, MIB64, "ALL_REDUCE"))
    args = ["--store", str(s), "sim", "all_gather-64", "--topo", "mesh:8x8,bw=50,lat=500", "--algo", "direct"]
    assert main([*args, "--format", "json", "--no-record"]) == 0
    out, err = capsys.readouterr()
    (doc,) = json.loads(out)  # the summary table: one row
    assert doc["overloaded_links"] > 0 and doc["worst_link"]["bandwidth_gb_per_s"] == 50.0
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: physically impossible")
    assert f"link {doc['worst_link']['link']} " in lines[0]
    # the same run congestion-aware, and a ring all-reduce on a ring: no warning
    assert main([*args, "--congestion", "aware", "--no-record"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["--store", str(s), "sim", "all_reduce-8", "--topo", "ring:8", "--no-record"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_recorded_impossible_run_keeps_its_overloaded_links(tmp_path: Path) -> None:
    with open_store(tmp_path / "s", write=True) as store:
        res = simulate(
            _collective(64, MIB64, "ALL_GATHER"),
            parse_topology("mesh:8x8,bw=50,lat=500"),
            algorithms={"ALL_GATHER": "direct"},
        )
        run = record_run(store.warehouse, res, trace_name="ag")
        got = store.sql(f"SELECT params FROM runs WHERE run_id = {run}").to_pylist()[0]["params"]
    links = json.loads(got)["overloaded_links"]
    assert len(links) == res.overloaded.num_rows and links[0]["link"] == res.overloaded["link"][0].as_py()
