"""``etstore report``: writes the file and prints its path; bad input is one line and exit code 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from etstore.cli import main
from etstore.testing import RecordedStore as Recorded


def test_report_command_writes_and_prints_the_path(
    recorded: Recorded, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp.html"
    a, b = recorded.runs
    code = main(
        [
            "--store",
            str(recorded.path),
            "report",
            str(a),
            str(b),
            "--sweep",
            str(recorded.sweep),
            "--out",
            str(out),
        ]
    )
    assert code == 0
    assert capsys.readouterr().out.strip() == str(out.resolve())
    assert out.read_text().count("Plotly.newPlot(") == 7


def test_sweep_only(recorded: Recorded, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep.html"
    code = main(["--store", str(recorded.path), "report", "--sweep", str(recorded.sweep), "--out", str(out)])
    assert code == 0 and capsys.readouterr().out.strip() == str(out.resolve())
    text = out.read_text()
    assert text.count("Plotly.newPlot(") == 1 and f"sweep {recorded.sweep}" in text


def test_latest(recorded: Recorded, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "latest.html"
    assert main(["--store", str(recorded.path), "report", "--latest", "--out", str(out)]) == 0
    assert f"run {max(recorded.runs)} (" in out.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["report", "77"], "etstore: error: no run 77 in the metrics"),
        (["report"], "etstore: error: report: name at least one run id, or pass --latest or --sweep ID"),
        (["report", "--sweep", "9"], "etstore: error: no sweep 9"),
        (["report", "1", "--out", "/nonexistent-dir/r.html"], "does not exist"),
        (["report", "1", "--sweep", "9"], "etstore: error: no sweep 9"),
    ],
)
def test_errors_are_one_line(
    recorded: Recorded, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    argv = ["--store", str(recorded.path), *args]
    if "--out" not in args:
        argv += ["--out", str(tmp_path / "r.html")]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
