"""Start-up of the CLI: the listing and --version load no engine; a command loads only its module."""

from __future__ import annotations

import importlib
import io
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

import etstore.cli
from etstore import __version__, store
from etstore.cli import COMMANDS, _parser, main
from etstore.cli._render import Rows, render
from etstore.workloads import transformer

HEAVY = ("duckdb", "pyarrow", "sqlalchemy", "sqlmodel", "ladybug", "neo4j", "plotly")

# runs the CLI in a fresh interpreter, then names on stderr the heavy and etstore.cli modules it loaded
_PROBE = """
import atexit, sys
heavy = {heavy!r}
def loaded():
    names = [m for m in heavy if m in sys.modules]
    names += sorted(m for m in sys.modules if m.startswith("etstore.cli."))
    print("loaded:" + ",".join(names), file=sys.stderr)
atexit.register(loaded)
from etstore.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _run(*argv: str, watch: tuple[str, ...] = HEAVY) -> tuple[str, list[str]]:
    """stdout of ``etstore ARGV`` (which must succeed) and the modules of ``watch`` and the CLI it loaded."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=watch), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    report = [line for line in done.stderr.splitlines() if line.startswith("loaded:")]
    assert done.returncode == 0 and len(report) == 1, done.stderr
    return done.stdout, [m for m in report[0][len("loaded:") :].split(",") if m]


def test_importing_the_cli_loads_no_engine() -> None:
    code = f"import sys, etstore.cli; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"


def test_version_and_help_load_no_engine_and_no_command_module() -> None:
    out, loaded = _run("--version")
    assert (out.strip(), loaded) == (f"etstore {__version__}", [])
    out, loaded = _run("--help")
    assert loaded == []
    assert all(f"    {name}" in out for name in COMMANDS) and "$ETSTORE_STORE" in out


def test_a_command_loads_its_own_module_only() -> None:
    out, loaded = _run("topo", "show", "ring:4", "--format", "json")
    assert '"npus": 4' in out
    assert "etstore.cli.topology" in loaded and "etstore.cli.simulate" not in loaded
    out, loaded = _run("rm", "--help")
    assert out.startswith("usage: etstore rm")
    assert "etstore.cli.traces" in loaded and "etstore.cli.topology" not in loaded


def test_table_lists_every_command_module() -> None:
    modules = {
        m.name
        for m in pkgutil.iter_modules(etstore.cli.__path__)
        if not m.name.startswith("_")
        and hasattr(importlib.import_module(f"etstore.cli.{m.name}"), "register")
    }
    assert modules == {c.module for c in COMMANDS.values()}


def test_listing_is_the_same_whichever_module_is_loaded() -> None:
    # the table's help lines and order match what each module registers, so the listing never drifts
    placeholders = _parser().format_help()
    for name in COMMANDS:
        assert _parser(name).format_help() == placeholders, name


def test_every_command_prints_its_own_help(capsys: pytest.CaptureFixture[str]) -> None:
    for name in COMMANDS:
        with pytest.raises(SystemExit) as exit_:
            main([name, "--help"])
        assert exit_.value.code == 0 and capsys.readouterr().out.startswith(f"usage: etstore {name} "), name


def test_store_defaults_named_in_the_help_are_the_stores() -> None:
    assert (etstore.cli._STORE_ENV_VAR, etstore.cli._DEFAULT_STORE) == (store.ENV_VAR, store.DEFAULT_STORE)


def _small_store(path: Path) -> None:
    with store.EmbeddedStore(path) as s:
        s.ingest(transformer(ranks=2, layers=1, tp=1), name="small")


def test_ls_reads_the_catalog_without_the_engines_an_orm_or_pandas(tmp_path: Path) -> None:
    _small_store(tmp_path / "s")
    watch = (*HEAVY, "pandas", "numpy")
    out, loaded = _run("--store", str(tmp_path / "s"), "ls", "--format", "json", watch=watch)
    assert [r["name"] for r in json.loads(out)] == ["small"]
    # the listing is the catalog's (SQLite), rendered from plain rows: no engine, no ORM, and no
    # Arrow conversion (pyarrow's first one imports pandas). pyarrow and numpy themselves still
    # come with the store package (etstore.model's schemas, etstore.store.base).
    assert set(loaded) & set(watch) <= {"pyarrow", "numpy"}, loaded
    assert "etstore.cli.traces" in loaded and "etstore.cli._inputs" not in loaded
    out, loaded = _run("--store", str(tmp_path / "s"), "ls", watch=watch)
    assert "small" in out and "workload" in out
    assert set(loaded) & set(watch) <= {"pyarrow", "numpy"}, loaded


def test_ls_prints_what_the_arrow_rendering_printed(tmp_path: Path) -> None:
    # the plain-rows listing is, byte for byte, what rendering the same rows through Arrow printed
    pa = pytest.importorskip("pyarrow")
    _small_store(tmp_path / "s")
    with store.EmbeddedStore(tmp_path / "s") as s:
        s.ingest(transformer(ranks=4, layers=1, tp=2), name="second")
    with store.EmbeddedStore(tmp_path / "s", read_only=True) as s:
        rows = [t.as_row() for t in s.traces()]
    assert sorted(r["name"] for r in rows) == ["second", "small"]
    cols = ["name", "kind", "ranks", "ops", "deps", "missing", "messages", "parent", "created"]
    for fmt in ("table", "csv", "json"):
        chosen = rows if fmt == "json" else [{c: r[c] for c in cols} for r in rows]
        arrow, plain = io.StringIO(), io.StringIO()
        render(pa.Table.from_pylist(chosen), fmt, out=arrow, console=Console(width=200, file=arrow))
        render(Rows(list(chosen[0]), chosen), fmt, out=plain, console=Console(width=200, file=plain))
        assert plain.getvalue() == arrow.getvalue(), fmt
        out, _ = _run("--store", str(tmp_path / "s"), "ls", "--format", fmt)
        if fmt != "table":  # the table's width is the probe's terminal's
            assert out == plain.getvalue(), fmt
    # an empty store: the header alone, as the empty Arrow table of strings printed it
    arrow, plain = io.StringIO(), io.StringIO()
    render(pa.table({c: pa.array([], pa.string()) for c in cols}), "csv", out=arrow)
    render(Rows(cols, []), "csv", out=plain)
    assert plain.getvalue() == arrow.getvalue() == ",".join(cols) + "\n"


def test_plain_rows_align_numbers_right_and_text_left() -> None:
    buf = io.StringIO()
    rows = [
        {"n": 7, "x": 1.5, "flag": True, "s": "a", "none": None},
        {"n": 12345, "x": None, "flag": False, "s": "bb", "none": None},
    ]
    render(Rows(["n", "x", "flag", "s", "none"], rows), "table", console=Console(width=80, file=buf))
    lines = buf.getvalue().splitlines()
    first = next(line for line in lines if " a " in line)
    raw = first.split("│")[1:-1]
    assert [c.strip() for c in raw] == ["7", "1.5", "True", "a", ""]
    # n and x right-aligned (numbers), flag and s left-aligned (bools and text are not numbers)
    assert raw[0] == "     7 " and raw[1] == " 1.5 " and raw[2] == " True  " and raw[3] == " a  "
    # as Arrow's types (int64, double, bool, string, null) laid the same rows out
    arrow = io.StringIO()
    render(
        pytest.importorskip("pyarrow").Table.from_pylist(rows), "table", console=Console(width=80, file=arrow)
    )
    assert buf.getvalue() == arrow.getvalue()
