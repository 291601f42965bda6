"""The memory budget of a multi-rank PyTorch recording is checked on the sum of its files,
held together while the trace is assembled, before any is read: a recording whose every
file fits the budget alone can still be refused, in one line naming the files and the budget."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from etstore.cli import main
from etstore.errors import TraceFormatError
from etstore.formats import read_kineto, read_pytorch_et, read_trace
from etstore.formats._frames import KINETO_COST, PYTORCH_ET_COST
from etstore.store import EmbeddedStore

DDP_4R = Path(__file__).parents[1] / "data" / "torch_ddp_4r"
ET = sorted(DDP_4R.glob("rank*_et.json.gz"))
KINETO = sorted(DDP_4R.glob("rank*_kineto.json.gz"))
MiB = 1 << 20


def _need(paths: list[Path]) -> float:
    """What reading ``paths`` together costs, from their decompressed bytes."""
    return sum(
        len(gzip.decompress(p.read_bytes()))
        * (KINETO_COST if "kineto" in p.name else PYTORCH_ET_COST).per_byte
        for p in paths
    )


def _refusal(paths: list[Path]) -> str:
    """How the one line refusing ``paths`` begins."""
    names = ", ".join(p.name for p in paths)
    return f"{DDP_4R}: {len(paths)} files read together ({names}), "


def test_the_data_fits_each_file_alone_but_not_the_sum() -> None:
    # the budgets below are chosen by these numbers: a test of the sum needs both to hold
    assert len(ET) == len(KINETO) == 4
    assert (
        max(_need([et, k]) for et, k in zip(ET, KINETO, strict=True))
        < 16 * MiB
        < _need(ET + KINETO)
        < 40 * MiB
    )
    assert max(_need([k]) for k in KINETO) < 4 * MiB < _need(KINETO)


def test_a_rank_fits_but_the_recording_is_refused_upfront(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ETSTORE_MEMORY_BUDGET", "16MiB")
    # one rank, its execution and Kineto traces together, fits
    one = read_pytorch_et(ET[0], kineto=KINETO[0])
    assert one.num_ranks == 1
    # the four, held together, do not: read as a directory, as files given, and from Python
    refusals = {
        "directory": lambda: read_trace(DDP_4R),
        "reader on the directory": lambda: read_pytorch_et(DDP_4R),
        "mapping and glob": lambda: read_pytorch_et(
            dict(enumerate(ET)), kineto=str(DDP_4R / "rank*_kineto.json.gz")
        ),
    }
    for how, read in refusals.items():
        with pytest.raises(TraceFormatError) as refused:
            read()
        message = str(refused.value)
        assert "\n" not in message, how
        listed = ET + KINETO if how == "mapping and glob" else sorted(ET + KINETO)
        assert message.startswith(_refusal(listed)), (how, message)
        assert "more than the memory budget of 16 MiB" in message, how
        assert message.endswith(
            "(set the environment variable ETSTORE_MEMORY_BUDGET, e.g. "
            "ETSTORE_MEMORY_BUDGET=64GiB, to raise it)"
        ), how


def test_a_kineto_only_recording_sums_its_ranks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for k in KINETO:
        shutil.copy(k, tmp_path / k.name)
    monkeypatch.setenv("ETSTORE_MEMORY_BUDGET", "4MiB")
    assert read_kineto(tmp_path / KINETO[0].name).num_ranks == 1  # a rank alone fits
    with pytest.raises(TraceFormatError, match=r"4 files read together .* Kineto traces, needs about"):
        read_trace(tmp_path)
    monkeypatch.setenv("ETSTORE_MEMORY_BUDGET", "8MiB")
    assert read_trace(tmp_path).num_ranks == 4


def test_the_cli_refuses_in_one_line_and_ingests_within_a_budget_the_sum_fits(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = str(tmp_path / "s")
    monkeypatch.setenv("ETSTORE_MEMORY_BUDGET", "16MiB")
    assert main(["--store", store, "ingest", str(DDP_4R), "--format", "json"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith("etstore: error: " + _refusal(sorted(ET + KINETO))), err
    assert "more than the memory budget of 16 MiB" in err
    with EmbeddedStore(store, read_only=True) as s:
        assert list(s.traces()) == []  # refused before anything was read, let alone stored

    monkeypatch.setenv("ETSTORE_MEMORY_BUDGET", "40MiB")
    assert main(["--store", store, "ingest", str(DDP_4R), "--format", "json"]) == 0
    capsys.readouterr()
    with EmbeddedStore(store, read_only=True) as s:
        assert [(t.name, t.ranks) for t in s.traces()] == [("torch_ddp_4r", 4)]
