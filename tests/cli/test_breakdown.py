"""``etstore breakdown``, ``etstore diff`` and ``replay --slow`` on recordings, as the user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from etstore.analysis.breakdown import breakdown
from etstore.cli import main
from etstore.formats.pytorch_et import read_pytorch_et

ROOT = Path(__file__).resolve().parents[2]
GLOO = ROOT / "tests" / "data" / "torch_ddp_cuda_gloo_2r"


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[dict[str, object]]:
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert isinstance(rows, list)
    return rows


def test_breakdown_json_rows_are_the_librarys(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    store = ["--store", str(tmp_path / "s")]
    ranks = _json(capsys, [*store, "breakdown", str(GLOO), "--format", "json"])
    want = breakdown(read_pytorch_et(GLOO))
    assert ranks == want.ranks.to_pylist()
    assert {"rank", "idle_pct", "compute_pct", "non_compute_pct"} <= set(ranks[0])
    colls = _json(capsys, [*store, "breakdown", str(GLOO), "--table", "collectives", "--format", "json"])
    assert len(colls) == want.collectives.num_rows == 10
    assert not (tmp_path / "s").exists()  # reading files creates no store


def test_diff_json_and_a_kind(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cpu = ROOT / "tests" / "data" / "torch_ddp_2r"
    rows = _json(
        capsys,
        [
            "--store",
            str(tmp_path / "s"),
            "diff",
            str(cpu),
            str(GLOO),
            "--kind",
            "collective",
            "--format",
            "json",
        ],
    )
    assert {r["kind"] for r in rows} == {"collective"}
    assert rows[0]["key"] == "ALL_REDUCE 2,704 B" and rows[0]["count_a"] == 4 and rows[0]["count_b"] == 0


def test_replay_with_a_straggler(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    store = ["--store", str(tmp_path / "s")]
    base = _json(capsys, [*store, "replay", str(GLOO), "--format", "json"])
    slow = _json(capsys, [*store, "replay", str(GLOO), "--slow", "1=2", "--format", "json"])
    assert [r["measured_us"] for r in slow] == [r["measured_us"] for r in base]
    assert all(s["simulated_us"] > b["simulated_us"] for s, b in zip(slow, base, strict=True))
    assert main([*store, "replay", str(GLOO), "--scale", "tpu=2"]) == 1
    assert "unknown op class 'tpu'" in capsys.readouterr().err


def test_sim_with_a_straggler_records_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    store = ["--store", str(tmp_path / "s")]
    assert main([*store, "ingest", str(GLOO), "--name", "g"]) == 0
    capsys.readouterr()
    args = [*store, "sim", "g", "--topo", "switch:2", "--table", "summary", "--format", "json"]
    (base,) = _json(capsys, args)
    (slow,) = _json(capsys, [*args, "--slow", "0-1=2"])
    assert slow["total_ns"] > base["total_ns"]
    from etstore.store import open_store

    with open_store(tmp_path / "s") as s:
        rows = s.warehouse.query("SELECT run_id, params FROM runs ORDER BY run_id").to_arrow().to_pylist()
    assert "perturbation" not in json.loads(rows[0]["params"])["user"]
    assert json.loads(rows[1]["params"])["user"]["perturbation"]["slow"] == {"0": 2.0, "1": 2.0}
