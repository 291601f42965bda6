"""`etstore synth`: the stored name comes from the request's own inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from etstore.algorithms.synth import synthesize
from etstore.cli import main
from etstore.cli.topology import default_name
from etstore.store import open_store


def run(capsys: pytest.CaptureFixture[str], store: Path, *args: str) -> tuple[int, str, str]:
    code = main(["--store", str(store), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_default_name_spells_every_non_default_input() -> None:
    r = synthesize("mesh2d:4x4", coll="allreduce", chunks_per_npu=2, seed=3, trials=1)
    assert default_name(r, "1GiB", 8) == "synth-allreduce-mesh2d-4x4-bw-50-lat-500-2c-s3"
    r = synthesize("ring:4", coll="broadcast", root=2, buffer_bytes=1 << 20, trials=1)
    assert default_name(r, "1MiB", 3) == "synth-broadcast-ring-4-bw-50-lat-500-1c-s0-r2-1MiB-t3"


def test_synth_names_follow_their_inputs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    s = tmp_path / "s"
    names = []
    for extra in ([], ["--size", "1MiB"], ["--chunks", "2"]):
        code, out, _ = run(
            capsys, s, "synth", "--topo", "mesh2d:3x3", "--coll", "allgather", "--format", "json", *extra
        )
        assert code == 0
        names.append(json.loads(out)[0]["trace"])
    assert names == [
        "synth-allgather-mesh2d-3x3-bw-50-lat-500-1c-s0",
        "synth-allgather-mesh2d-3x3-bw-50-lat-500-1c-s0-1MiB",
        "synth-allgather-mesh2d-3x3-bw-50-lat-500-2c-s0",
    ]
    with open_store(s) as store:
        assert sorted(t.name for t in store.traces()) == sorted(names)


def test_synth_reports_the_bisection_bound(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # the example: 8×8 mesh All-to-All; the 8-link cut forces 128 link times of 313 µs
    code, out, _ = run(
        capsys,
        tmp_path / "s",
        "synth",
        "--topo",
        "mesh2d:8x8",
        "--coll",
        "a2a",
        "--no-store",
        "--format",
        "json",
    )
    (doc,) = json.loads(out)
    assert code == 0 and doc["lower_bound_ns"] == pytest.approx(40_064_000.0)
    assert doc["ratio"] == pytest.approx(doc["time_ns"] / 40_064_000.0)


def test_synth_without_storing_never_builds_the_trace(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from etstore.algorithms import synth as synth_mod

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("the algorithm trace was built")

    monkeypatch.setattr(synth_mod, "build_trace", refuse)
    code, out, _ = run(capsys, tmp_path / "s", "synth", "--topo", "mesh2d:4x4", "--coll", "ag", "--no-store")
    # 16 NPUs each receive 15 chunks: 240 transfers, a send and a receive each
    assert code == 0 and "240 transfers, 480 ops" in out
    code, out, _ = run(
        capsys,
        tmp_path / "s",
        "synth",
        "--topo",
        "mesh2d:4x4",
        "--coll",
        "ag",
        "--no-store",
        "--format",
        "json",
    )
    (doc,) = json.loads(out)
    assert (doc["transfers"], doc["ops"]) == (240, 480) and "deps" not in doc


def test_stored_synth_pairs_messages_without_the_schedule(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The schedule is the command's largest object (285 MB at 64x64): once the last part is
    built nothing holds it, so the store's last step (pairing every message) runs without it."""
    import gc
    import weakref

    from etstore.cli import topology as topo_cli
    from etstore.store import _streamed as streamed

    results: list[weakref.ref[object]] = []
    alive_at_load: list[bool] = []
    real_synthesize, real_load = topo_cli.synthesize, streamed._stage_messages

    def recording_synthesize(*a: object, **k: object) -> object:
        res = real_synthesize(*a, **k)  # type: ignore[arg-type]
        results.append(weakref.ref(res.schedule))
        return res

    def checking_load(*a: object, **k: object) -> None:
        gc.collect()
        alive_at_load.append(results[0]() is not None)
        real_load(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(topo_cli, "synthesize", recording_synthesize)
    monkeypatch.setattr(topo_cli, "PART_OPS", 100)  # several parts: the streamed load
    monkeypatch.setattr(streamed, "_stage_messages", checking_load)
    code, out, _ = run(capsys, tmp_path / "s", "synth", "--topo", "mesh2d:4x4", "--coll", "ag")
    assert code == 0 and "240 transfers, 480 ops" in out and "stored as" in out
    assert alive_at_load == [False]


def test_synth_reports_the_time_sweep_gives_its_algorithm(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # one algorithm, one answer: issue 34's case on a 4×4 mesh, and priced as ASTRA-sim's custom
    # collectives (the stored name says so)
    s = tmp_path / "s"
    for extra in ([], ["--reduction-mem-accesses", "0", "--copy-mem-accesses", "0"]):
        args = ["--topo", "mesh2d:4x4", "--coll", "allreduce", "--chunks", "2", "--size", "16MiB"]
        code, out, _ = run(capsys, s, "synth", *args, *extra, "--format", "json")
        (doc,) = json.loads(out)
        assert code == 0 and doc["time_exact"] and doc["aware_extra_ns"] == 0.0
        code, out, _ = run(
            capsys, s, "sweep", "--coll", "allreduce", "--sizes", "16MiB", "--algo", doc["trace"],
            "--topo", "mesh2d:4x4", "--no-record", "--format", "json", *extra,
        )  # fmt: skip
        assert code == 0 and json.loads(out)[0]["time_ns"] == doc["time_ns"]
        assert doc["trace"].endswith("-16MiB-red0-copy0" if extra else "-16MiB")


def test_synth_simulates_what_its_schedule_cannot_say(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # congestion-aware through a switch: the ports are shared, so the command simulates the
    # algorithm and says what that adds to the congestion-unaware figure
    s = tmp_path / "s"
    args = ["synth", "--topo", "switch:4", "--coll", "allgather", "--size", "1MiB", "--congestion", "aware"]
    code, out, _ = run(capsys, s, *args, "--format", "json")
    (doc,) = json.loads(out)
    assert code == 0 and doc["trace"].endswith("-aware") and doc["aware_extra_ns"] > 0
    code, out, _ = run(
        capsys, s, "sweep", "--coll", "allgather", "--sizes", "1MiB", "--algo", doc["trace"],
        "--topo", "switch:4", "--congestion", "aware", "--no-record", "--format", "json",
    )  # fmt: skip
    assert json.loads(out)[0]["time_ns"] == doc["time_ns"]
    code, out, _ = run(capsys, s, *args, "--no-store")
    assert code == 0 and "congestion-aware links add" in out and "simulated" in out
