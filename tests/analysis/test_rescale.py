"""Re-scaling: a generated workload rescaled equals the one generated at the target size; a
recorded DDP step grows; what cannot be rescaled correctly is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pytest

from etstore.analysis.rescale import rescale
from etstore.app.rescale import rescale_stored
from etstore.cli import main
from etstore.errors import EtstoreError
from etstore.formats.pytorch_et import read_pytorch_et
from etstore.model import Trace
from etstore.sim import simulate
from etstore.store import EmbeddedStore
from etstore.testing import assert_trace_equal, hand_expanded
from etstore.topology import Topology
from etstore.workloads import transformer

DATA = Path(__file__).resolve().parents[1] / "data"
# every op column but the durations: those of new ranks repeat their template's, where generation
# draws fresh ±10% jitter per rank
STRUCTURE = [
    "name",
    "type",
    "comm_type",
    "comm_size",
    "comm_src",
    "comm_dst",
    "comm_tag",
    "pg_name",
    "is_cpu_op",
]


def _durations(trace: Trace, rank: int) -> np.ndarray:
    ops = trace.ops.filter(pc.equal(trace.ops["rank"], rank))
    return ops["duration_micros"].to_numpy().astype(np.int64)


def _same_but_durations(got: Trace, want: Trace) -> None:
    assert_trace_equal(got, want, columns=STRUCTURE)
    assert {k: v for k, v in got.params.items() if k != "rescaled"} == dict(want.params)


@pytest.mark.parametrize(("ranks", "tp", "to"), [(8, 2, 16), (4, 2, 12), (4, 1, 8), (8, 2, 24)])
def test_dp_growth_equals_generation(ranks: int, tp: int, to: int) -> None:
    parent = transformer(ranks=ranks, tp=tp, layers=2)
    got = rescale(parent, ranks=to)
    want = transformer(ranks=to, tp=tp, layers=2)
    _same_but_durations(got, want)
    assert got.name == f"transformer-{to}r" and got.kind == "rescaled"
    assert got.params["rescaled"]["from"] == {"ranks": ranks, "dp": ranks // tp, "tp": tp, "pp": 1}
    assert got.params["rescaled"]["to"] == {"ranks": to, "dp": to // tp, "tp": tp, "pp": 1}
    for r in range(to):
        if r < ranks:  # the parent's ranks are generation's (the seeded jitter runs rank by rank)
            assert (_durations(got, r) == _durations(want, r)).all()
        else:  # a new replica repeats the parent's replica at its place
            assert (_durations(got, r) == _durations(parent, r % ranks)).all()
            timed = _durations(want, r) > 0  # compute; the others last 0 in both
            ratio = _durations(got, r)[timed] / _durations(want, r)[timed]
            assert ((ratio > 0.9 / 1.1 - 0.01) & (ratio < 1.1 / 0.9 + 0.01)).all()


def test_dp_shrink_equals_generation_exactly() -> None:
    got = rescale(transformer(ranks=16, tp=2, layers=3), ranks=8)
    want = transformer(ranks=8, tp=2, layers=3)
    _same_but_durations(got, want)
    assert_trace_equal(got, want)  # durations too: the first ranks are generation's


@pytest.mark.parametrize(
    ("ranks", "tp", "to", "tp_to"), [(8, 2, 8, 4), (8, 4, 8, 2), (16, 4, 16, 2), (8, 2, 16, 4)]
)
def test_tp_change_equals_generation(ranks: int, tp: int, to: int, tp_to: int) -> None:
    parent = transformer(ranks=ranks, tp=tp, layers=2)
    got = rescale(parent, ranks=to, tp=tp_to)
    want = transformer(ranks=to, tp=tp_to, layers=2)
    _same_but_durations(got, want)
    # compute by the shard ratio: generation's to the microsecond each was rounded to
    for r in range(min(ranks, to)):
        assert np.abs(_durations(got, r) - _durations(want, r)).max() <= 1
    notes = got.params["rescaled"]["notes"]
    assert any(
        n.startswith(f"compute: every COMP_NODE's duration x {tp}/{tp_to}, the shard ratio") for n in notes
    )


def test_gradient_sizes_follow_the_shard_and_activations_do_not() -> None:
    got = rescale(transformer(ranks=8, tp=2, layers=1, hidden=1024), ranks=8, tp=4)
    sizes = {
        (r["comm_type"], r["pg_name"][:2]): r["comm_size"] for r in got.ops.to_pylist() if r["comm_type"]
    }
    assert sizes[("ALL_REDUCE", "dp")] == 12 * 1024 * 1024 * 2 // 4
    assert sizes[("ALL_GATHER", "tp")] == sizes[("REDUCE_SCATTER", "tp")] == 2048 * 1024 * 2


def test_recorded_ddp_step_grows() -> None:
    parent = read_pytorch_et(DATA / "torch_ddp_2r")
    got = rescale(parent, ranks=4)
    assert got.ranks == [0, 1, 2, 3] and got.params["comm_groups"] == {"0": [0, 1, 2, 3]}
    assert got.params["world_size"] == 4 and got.params["execution"] == "recorded"
    assert sorted(got.params["windows"]) == ["0", "1", "2", "3"]
    assert got.params["windows"]["3"] == parent.params["windows"]["1"]

    def collectives(t: Trace, rank: int) -> list[tuple[Any, ...]]:
        ops = t.ops.filter(pc.and_(pc.equal(t.ops["rank"], rank), pc.equal(t.ops["type"], "COMM_COLL_NODE")))
        return list(zip(*(ops[c].to_pylist() for c in ("comm_type", "comm_size", "pg_name")), strict=True))

    for r in range(4):  # the same calls and sizes, in the grown group
        assert collectives(got, r) == collectives(parent, r % 2)
    assert len(collectives(got, 0)) == 4
    result = simulate(got, Topology.from_spec("switch:4,bw=25,lat=2000"))
    rows = result.collectives.to_pylist()
    assert len(rows) == 4 and {r["group_size"] for r in rows} == {4}
    assert [r["size_bytes"] for r in rows] == [20, 4, 2704, 2704]
    assert result.total_ns > 0


def test_one_rank_ddp_recording_grows() -> None:
    got = rescale(read_pytorch_et(DATA / "torch_ddp_cuda_1r"), ranks=2)
    assert got.params["comm_groups"] == {"0": [0, 1]}


def _no_tp(t: Trace) -> Trace:
    return t.replace(params={k: v for k, v in t.params.items() if k != "tp"})


@pytest.mark.parametrize(
    ("make", "kwargs", "says"),
    [
        (lambda: transformer(ranks=8), {"ranks": 16, "pp": 2}, "pp 2 is not supported"),
        (lambda: transformer(ranks=8), {"ranks": 12, "tp": 5}, "not a multiple of tp 5"),
        (lambda: transformer(ranks=8), {"ranks": 8, "dp": 2}, "is not dp 2 x tp 2"),
        (lambda: transformer(ranks=8), {"ranks": 0}, "--ranks must be a positive integer"),
        (lambda: transformer(ranks=8), {"ranks": 8}, "nothing to change"),
        (lambda: transformer(ranks=8), {"dp": None}, "give --ranks"),
        (lambda: transformer(ranks=8).replace(kind="rewritten"), {"ranks": 16}, "is of kind rewritten"),
        (
            lambda: transformer(ranks=4, tp=1),
            {"ranks": 4, "tp": 2},
            "tp 1 -> 2: the trace has no tp collectives",
        ),
        (lambda: transformer(ranks=8, tp=2), {"ranks": 2, "tp": 2}, "dp 4 -> 1 would leave"),
        (lambda: transformer(ranks=8, tp=2), {"ranks": 16, "source_tp": 4}, "--from-tp 4 contradicts"),
        (lambda: _no_tp(transformer(ranks=8)), {"ranks": 16}, "name no tp; give --from-tp"),
        (lambda: _no_tp(transformer(ranks=8)), {"ranks": 16, "source_tp": 4}, "neither a tensor- nor"),
        (lambda: hand_expanded()[0], {"ranks": 4}, "is of kind expanded"),
        (lambda: read_pytorch_et(DATA / "torch_ddp_2r"), {"ranks": 4, "tp": 2}, "tp of a recording"),
        (lambda: read_pytorch_et(DATA / "torch_tp_2r"), {"ranks": 4}, "functional collectives"),
        (lambda: read_pytorch_et(DATA / "torch_fsdp2_2r"), {"ranks": 4}, "ALL_GATHER over a data-parallel"),
    ],
)
def test_what_cannot_be_rescaled_is_refused_in_one_line(make: Any, kwargs: dict[str, Any], says: str) -> None:
    with pytest.raises(EtstoreError) as err:
        rescale(make(), **kwargs)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_rescale_stored_records_the_derivation(tmp_path: Path) -> None:
    with EmbeddedStore(tmp_path / "s") as store:
        store.ingest(transformer(ranks=4, tp=2, layers=1), name="w")
        report = rescale_stored(store, "w", ranks=8, name="w8")
        info = store.info("w8")
        assert report.created and info.parent == "w" and info.ranks == 8
        assert info.params["rescaled"]["parent"] == "w"
        _same_but_durations(store.load("w8"), transformer(ranks=8, tp=2, layers=1))


def test_cli_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "s")
    assert main(["--store", store, "workload", "--ranks", "8", "--tp", "2", "--layers", "2", "--ingest"]) == 0
    capsys.readouterr()
    code = main(["--store", store, "rescale", "transformer", "--ranks", "8", "--tp", "4", "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0
    row = json.loads(out)[0]
    assert row["trace"] == "transformer-8r-tp4" and row["parent"] == "transformer"
    assert row["from"] == "8 ranks (dp 4 x tp 2)" and row["to"] == "8 ranks (dp 2 x tp 4)"
    assert "the shard ratio" in err  # said at the command: beside json, on stderr
    code = main(["--store", store, "rescale", "transformer", "--ranks", "16"])
    out, _ = capsys.readouterr()
    assert code == 0 and "transformer-16r" in out and "data-parallel groups: 4 -> 8 ranks" in out
    with EmbeddedStore(tmp_path / "s", read_only=True) as s:
        _same_but_durations(s.load("transformer-16r"), transformer(ranks=16, tp=2, layers=2))
        assert s.info("transformer-16r").parent == "transformer"
    for bad in (["--ranks", "16", "--pp", "2"], ["--ranks", "12", "--tp", "5"]):
        assert main(["--store", store, "rescale", "transformer", *bad]) == 1
        err = capsys.readouterr().err
        assert err.startswith("etstore: error: rescale: ") and err.count("\n") == 1
