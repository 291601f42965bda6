"""CLI output and exits: valid JSON, unbroken numbers, one-line refusals, Ctrl-C at any time."""

from __future__ import annotations

import io
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from rich.console import Console

from etstore.cli import main
from etstore.cli._common import print_json
from etstore.cli._render import json_text, render, render_parts


def _strict(text: str) -> object:
    """``json.loads`` that refuses NaN/Infinity, as JavaScript's JSON.parse and jq do."""

    def refuse(name: str) -> object:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_json_has_no_nan_or_infinity(capsys: pytest.CaptureFixture[str]) -> None:
    table = pa.table({"x": [1.5, float("nan"), float("inf"), -float("inf"), None]})
    out = io.StringIO()
    render(table, "json", out=out)
    assert _strict(out.getvalue()) == [{"x": 1.5}, {"x": None}, {"x": None}, {"x": None}, {"x": None}]
    print_json({"ratio": float("nan"), "rows": [{"t": float("inf")}], "n": 3})
    assert _strict(capsys.readouterr().out) == {"ratio": None, "rows": [{"t": None}], "n": 3}
    assert json_text({"a": [float("nan")]}) == '{\n "a": [\n  null\n ]\n}'


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_a_table_in_parts_prints_as_the_whole_table(fmt: str) -> None:
    """Empty parts, a cut mid-part, values JSON and CSV must convert: byte for byte what
    ``render`` writes of the whole table, or of its first ``limit`` rows."""
    whole = pa.table(
        {"a": [1, 2, 3, 4, 5], "x": [0.5, float("nan"), None, 2.0, 1e300], "s": ["p", 'q"r', "s,t", "", None]}
    )
    parts = [whole.slice(0, 0), whole.slice(0, 2), whole.slice(2, 0), whole.slice(2, 3)]
    for limit in (0, 1, 3, 5, 9):
        want, got = io.StringIO(), io.StringIO()
        render(whole if not limit else whole.slice(0, limit), fmt, out=want)
        assert render_parts(iter(parts), fmt, limit=limit, out=got) == 5
        assert got.getvalue() == want.getvalue()
    empty, got = io.StringIO(), io.StringIO()
    render(whole.slice(0, 0), fmt, out=empty)
    render_parts([whole.slice(0, 0)], fmt, out=got)
    assert got.getvalue() == empty.getvalue()


@pytest.mark.parametrize("width", [80, 90, 100])
def test_tables_never_split_numbers(width: int) -> None:
    table = pa.table(
        {
            "trace": ["a-rather-long-trace-name-that-needs-folding"] * 2,
            "kind": ["w", "a"],
            "ranks": [100000, 8],
            "ops": [1_000_000_000, 5],
            "bytes": [123_456_789_012, 0],
            "busbw": [3.25, 1234567.5],
            "note": ["a long free-text column that can fold over several lines"] * 2,
        }
    )
    out = io.StringIO()
    render(table, "table", console=Console(file=out, width=width))
    lines = out.getvalue().splitlines()
    cells = [[c.strip() for c in re.split(r"[│┃]", line)[1:-1]] for line in lines if "│" in line]
    numbers = {"100000", "8", "1000000000", "5", "123456789012", "0", "3.25", "1,234,567.5"}
    # every number is whole on the first line of its row, and the lines below hold no digits there
    first_lines = [c for c in cells if c and c[1] in ("w", "a")]
    assert len(first_lines) == 2
    assert {v for row in first_lines for v in row[2:6]} == numbers
    continuation = [c for c in cells if c and c[1] not in ("w", "a", "kind")]
    assert all(v == "" for row in continuation for v in row[2:6])


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("topo", "show", ""), r"^etstore: error: topology spec is empty; try e\.g\. mesh2d:8x8"),
        (
            ("sweep", "--algo", "ring", "--topo", "ring:4", "--sizes", "99999999999999999999999"),
            r"^etstore: error: size '99999999999999999999999' is larger than the largest supported size, "
            r"2\^63 - 1 bytes",
        ),
        (
            ("sweep", "--algo", "ring", "--topo", "ring:4", "--sizes", "1KiB..99999999999999999999999"),
            r"larger than the largest supported size",
        ),
    ],
)
def test_bad_arguments_are_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    code, out, err = _run(capsys, "--store", str(tmp_path / "s"), *args)
    assert code == 1 and out == "" and re.search(message, err) and err.count("\n") == 1


def test_critical_path_json_is_the_list_of_rows(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, custom_allreduce: Path
) -> None:
    s = str(tmp_path / "s")
    assert _run(capsys, "--store", s, "ingest", str(custom_allreduce))[0] == 0
    code, out, _ = _run(capsys, "--store", s, "critical-path", "custom_allreduce", "--format", "json")
    rows = _strict(out)
    _, csv_out, _ = _run(capsys, "--store", s, "critical-path", "custom_allreduce", "--format", "csv")
    assert code == 0 and isinstance(rows, list) and len(rows) == len(csv_out.splitlines()) - 1
    assert list(rows[0]) == csv_out.splitlines()[0].split(",")  # same columns as the CSV header


def test_export_writes_inside_a_directory_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, custom_allreduce: Path
) -> None:
    s = str(tmp_path / "s")
    assert _run(capsys, "--store", s, "ingest", str(custom_allreduce))[0] == 0
    out_dir = tmp_path / "dir"
    code, out, _ = _run(capsys, "--store", s, "export", "custom_allreduce", "--out", f"{out_dir}/")
    written = sorted(p.name for p in out_dir.iterdir())
    assert code == 0 and written == [f"custom_allreduce.{r}.et" for r in range(8)]
    assert not list(tmp_path.glob("dir.*"))  # nothing beside the directory
    assert out.splitlines() == [
        f"wrote 8 files: {out_dir / 'custom_allreduce.0.et'} ... custom_allreduce.7.et"
    ]
    # an existing directory without the slash means the same
    code, out, _ = _run(
        capsys, "--store", s, "export", "custom_allreduce", "--format", "json", "--out", str(out_dir)
    )
    assert code == 0 and len(list(out_dir.glob("custom_allreduce.*.json"))) == 8


# ---------------------------------------------------------------- Ctrl-C

_SCRIPT = Path(sys.executable).parent / "etstore"


def _interrupt(argv: list[str], delay_s: float) -> subprocess.CompletedProcess[str]:
    """Run ``argv``, and SIGINT it ``delay_s`` after it has begun loading numpy (its imports)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    maps = Path(f"/proc/{proc.pid}/maps")
    deadline = time.monotonic() + 60
    # on a busy machine the interpreter's own start-up (not ours to handle) can take a while:
    # wait for the first C extension of the command's imports before counting
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if "_multiarray_umath" in maps.read_text():
                break
        except OSError:
            break
        time.sleep(0.002)
    time.sleep(delay_s)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def test_ctrl_c_while_importing_is_one_line() -> None:
    # the console script's imports (argparse, rich, the command's module): SIGINT lands in them
    code = (
        "import os, signal, sys; sys.argv = ['etstore', 'ls']; import etstore.cli; "
        "os.kill(os.getpid(), signal.SIGINT); import pyarrow, etstore.store; print('not reached')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "etstore: interrupted\n")


def test_ctrl_c_in_main_is_one_line(tmp_path: Path) -> None:
    # main() itself (imports of the command, parsing, the work): KeyboardInterrupt → 130, one line
    code = (
        "import os, signal, sys, threading; from etstore.cli import main; "
        "threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start(); "
        f"sys.exit(main(['--store', {str(tmp_path / 's')!r}, 'sweep', '--coll', 'allreduce', "
        "'--sizes', '1KiB..1GiB:2', '--algo', 'ring,direct', '--topo', 'mesh2d:8x8', '--no-record']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "etstore: interrupted\n")


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc to see the imports")
@pytest.mark.skipif(not _SCRIPT.exists(), reason="the etstore console script is not beside this Python")
@pytest.mark.parametrize("delay_s", [0.0, 0.05, 0.1, 0.15, 0.2, 0.5])
def test_ctrl_c_in_the_first_half_second(tmp_path: Path, delay_s: float) -> None:
    # the real console script, interrupted while importing (0 .. 0.15 s: the command's module
    # and the C extensions it loads, one of which crashed when interrupted in its
    # initialisation) or working: a sweep that takes seconds, so the signal never lands
    # after the work is done
    argv = [sys.executable, str(_SCRIPT), "--store", str(tmp_path / "s"), "sweep", "--coll", "allreduce"]
    argv += ["--sizes", "1KiB..1GiB:2", "--algo", "ring,direct", "--topo", "mesh2d:8x8", "--no-record"]
    done = _interrupt(argv, delay_s)
    assert (done.returncode, done.stderr) == (130, "etstore: interrupted\n")


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc to see the imports")
def test_ctrl_c_while_duckdb_runs_a_query_is_one_line(tmp_path: Path) -> None:
    # DuckDB 2 turns the Ctrl-C that lands in a query into RuntimeError('Query interrupted'),
    # which used to end the command with that traceback and exit 1
    store = str(tmp_path / "s")
    assert main(["--store", store, "workload", "--ranks", "2", "--layers", "1", "--tp", "1", "--ingest"]) == 0
    query = "SELECT count(*) FROM range(100000000000) a"
    argv = [sys.executable, "-m", "etstore.cli", "--store", store, "sql", query]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    maps, deadline = Path(f"/proc/{proc.pid}/maps"), time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline and "_duckdb.cpython" not in maps.read_text():
        time.sleep(0.01)
    time.sleep(2.0)  # the store is open and the query (minutes long) is running
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (130, "", "etstore: interrupted\n")


def test_a_query_repeating_a_column_name_keeps_every_column(tmp_path: Path) -> None:
    """``SELECT s.name, t.name`` (a join) names two columns alike: both print, numbered as DuckDB
    numbers repeats, in every format."""
    import duckdb

    table = duckdb.sql("SELECT 'a' AS name, 1 AS id, 'b' AS name").to_arrow_table()
    assert table.column_names == ["name", "id", "name"]
    for fmt in ("json", "csv", "table"):
        out = io.StringIO()
        render(table, fmt, out=out, console=Console(file=out, width=80))
        text = out.getvalue()
        if fmt == "json":
            assert json.loads(text) == [{"name": "a", "id": 1, "name_1": "b"}]
        elif fmt == "csv":
            assert text.splitlines() == ["name,id,name_1", "a,1,b"]
        else:
            assert "name_1" in text and " b " in text
