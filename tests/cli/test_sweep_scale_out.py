"""``etstore sweep`` beyond one process: the points on a two-node Ray cluster give the serial
command's rows; a failing point exits 1 with the point named while the others are recorded;
sweeps of several processes racing into one store are all recorded, none lost or doubled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

ETSTORE = [sys.executable, "-m", "etstore.cli"]
SIZES = "1KiB..1MiB:4"


def _run(store: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ETSTORE, "--store", str(store), *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CI": "true", **(env or {})},
    )


def _rows(out: str) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k not in ("wall_s", "sweep_id")} for row in json.loads(out)]


def _sql(store: Path, query: str) -> list[dict[str, Any]]:
    done = _run(store, "sql", query, "--format", "json")
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[str]:
    """A Ray cluster of two nodes (one CPU each) on this machine; its processes stopped after."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()


def test_a_failing_point_exits_1_naming_it_and_the_rest_are_recorded(tmp_path: Path) -> None:
    store = tmp_path / "s"
    done = _run(store, "algo", "gen", "ring", "--ranks", "4", "--coll", "allreduce", "--name", "ring4")
    assert done.returncode == 0, done.stderr
    run = _run(
        store,
        "sweep",
        "--algo",
        "ring,ring4",
        "--topo",
        "ring:4",
        "--topo",
        "ring:8",
        "--sizes",
        "1KiB,4KiB",
        "--ray",
    )
    assert run.returncode == 1
    lines = run.stderr.splitlines()
    failed = [line for line in lines if line.startswith("warning: point ")]
    assert len(failed) == 2 and all("/ ring4 /" in line and "ring:8" in line for line in failed)
    assert failed[0] == (
        "warning: point ring:8,bw=50,lat=500 / ring4 / 1024 B failed: "
        "algorithm 'ring4' has 4 ranks but the ALL_REDUCE group has 8"
    )
    assert "warning: 2 of 8 points failed; the other 6 recorded as sweep 1" in lines
    kept = _sql(store, "SELECT algorithm, count(*) AS n FROM sweep_points GROUP BY 1 ORDER BY 1")
    assert kept == [{"algorithm": "ring", "n": 4}, {"algorithm": "ring4", "n": 2}]
    params = _sql(store, "SELECT DISTINCT params FROM sweep_points")
    assert [f["point"] for f in json.loads(params[0]["params"])["failed"]] == [
        "ring:8,bw=50,lat=500 / ring4 / 1024 B",
        "ring:8,bw=50,lat=500 / ring4 / 4096 B",
    ]


def test_sweeps_racing_into_one_store_are_all_recorded_once(tmp_path: Path) -> None:
    store = tmp_path / "s"
    assert _run(store, "workload", "--ranks", "8", "--layers", "2", "--name", "w", "--ingest").returncode == 0
    bws = (10, 20, 30, 40)
    procs = [
        subprocess.Popen(
            [
                *ETSTORE,
                "--store",
                str(store),
                "sweep",
                "--algo",
                "ring",
                "--topo",
                f"ring:8,bw={bw}",
                "--sizes",
                SIZES,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "CI": "true"},
        )
        for bw in bws
    ]
    knobs = [
        subprocess.Popen(
            [*ETSTORE, "--store", str(store), "sweep", "w", "--knob", f"slow:{r}=1,2,3", "--topo", "ring:8"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "CI": "true"},
        )
        for r in (1, 2)
    ]
    for p in procs + knobs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    sweeps = _sql(
        store,
        "SELECT sweep_id, min(topology) AS topo, count(*) AS n, count(DISTINCT topology) AS t "
        "FROM sweep_points GROUP BY 1 ORDER BY 1",
    )
    assert sorted(s["topo"] for s in sweeps) == sorted(f"ring:8,bw={bw},lat=500" for bw in bws)
    assert [s["sweep_id"] for s in sweeps] == [1, 2, 3, 4] and all(
        s["n"] == 6 and s["t"] == 1 for s in sweeps
    )
    runs = _sql(
        store,
        "SELECT run_id, json_extract_string(params, '$.user.sensitivity.knob') AS knob, "
        "CAST(json_extract(params, '$.user.sensitivity.first_run') AS INT) AS first "
        "FROM runs ORDER BY run_id",
    )
    assert [r["run_id"] for r in runs] == [1, 2, 3, 4, 5, 6]
    by_knob: dict[str, list[int]] = {}
    for r in runs:
        by_knob.setdefault(r["knob"], []).append(r["run_id"])
    assert sorted(by_knob) == ["slow:1", "slow:2"]
    for ids in by_knob.values():  # each sweep's runs follow one another from its first
        assert ids == list(range(ids[0], ids[0] + 3))
        assert {r["first"] for r in runs if r["run_id"] in ids} == {ids[0]}


def test_a_sweep_on_a_two_node_cluster_gives_the_serial_rows(tmp_path: Path, two_nodes: str) -> None:
    argv = ["sweep", "--algo", "ring,direct,synth", "--topo", "ring:8", "--topo", "mesh2d:4x2"]
    argv += ["--sizes", SIZES, "--format", "json"]
    serial = _run(tmp_path / "s", *argv)
    assert serial.returncode == 0, serial.stderr
    on_ray = _run(tmp_path / "s", *argv, "--ray", two_nodes)
    assert on_ray.returncode == 0, on_ray.stderr
    assert "points ran on Ray: 2 node(s), 2 CPU(s)" in on_ray.stderr
    assert _rows(on_ray.stdout) == _rows(serial.stdout) and len(_rows(serial.stdout)) == 2 * 3 * 6
    sweeps = _sql(tmp_path / "s", "SELECT sweep_id, count(*) AS n FROM sweep_points GROUP BY 1 ORDER BY 1")
    assert sweeps == [{"sweep_id": 1, "n": 36}, {"sweep_id": 2, "n": 36}]
    same = _sql(
        tmp_path / "s",
        "SELECT count(*) AS n FROM sweep_points a JOIN sweep_points b "
        "USING (topology, algorithm, size_bytes) WHERE a.sweep_id = 1 AND b.sweep_id = 2 "
        "AND a.time_ns = b.time_ns AND a.busbw_gb_per_s = b.busbw_gb_per_s",
    )
    assert same == [{"n": 36}]
