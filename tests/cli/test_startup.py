"""Start-up of the CLI: the listing and --version load no engine; a command loads only its module."""

from __future__ import annotations

import importlib
import io
import json
import os
import pkgutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from rich.console import Console

import etstore.cli
from etstore import __version__, store
from etstore.cli import COMMANDS, _parser, main
from etstore.cli._render import Rows, json_text, render
from etstore.errors import StoreError
from etstore.store.listing import list_traces
from etstore.store.upgrade import upgrade_store
from etstore.testing import clear_server, serve
from etstore.workloads import transformer

FORMAT1_STORE = Path(__file__).parents[1] / "store" / "data" / "format1-store.tar.xz"
HEAVY = ("duckdb", "pyarrow", "sqlalchemy", "sqlmodel", "ladybug", "neo4j", "plotly")

# runs the CLI in a fresh interpreter, then names on stderr the heavy and etstore.cli modules it loaded
# (besides etstore.cli._console, which the package itself imports)
_PROBE = """
import atexit, sys
heavy = {heavy!r}
def loaded():
    names = [m for m in heavy if m in sys.modules]
    names += sorted(m for m in sys.modules if m.startswith("etstore.cli.") and m != "etstore.cli._console")
    print("loaded:" + ",".join(names), file=sys.stderr)
atexit.register(loaded)
from etstore.cli import _become_the_command, main
if {command_process!r}:  # as the console script and `python -m etstore.cli` run it
    _become_the_command()
sys.exit(main(sys.argv[1:]))
"""


def _probe(
    *argv: str, watch: tuple[str, ...] = HEAVY, command_process: bool = False
) -> tuple[int, str, str, list[str]]:
    """Exit code, stdout and stderr of ``etstore ARGV``, and the modules of ``watch`` and the CLI
    it loaded (``command_process``: with the console script's process-wide settings)."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=watch, command_process=command_process), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = done.stderr.splitlines(keepends=True)
    report = [line for line in lines if line.startswith("loaded:")]
    assert len(report) == 1, done.stderr
    err = "".join(line for line in lines if not line.startswith("loaded:"))
    return done.returncode, done.stdout, err, [m for m in report[0].strip()[len("loaded:") :].split(",") if m]


def _run(*argv: str, watch: tuple[str, ...] = HEAVY, command_process: bool = False) -> tuple[str, list[str]]:
    """stdout of ``etstore ARGV`` (which must succeed) and the modules of ``watch`` and the CLI it loaded."""
    code, out, err, loaded = _probe(*argv, watch=watch, command_process=command_process)
    assert code == 0, err
    return out, loaded


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


def test_only_output_that_draws_loads_rich(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """rich's console costs ≈ 0.02 s to import: --version, --help and JSON to a pipe never
    draw with it (the simulation's overload warning goes to stderr as plain text); a table does."""
    for forcing in ("FORCE_COLOR", "TTY_COMPATIBLE"):  # rich's own "this pipe is a terminal"
        monkeypatch.delenv(forcing, raising=False)
    prefix = str(Path(__file__).parents[2] / "examples" / "transformer_8r" / "transformer")
    for argv in (
        ("--version",),
        ("--help",),
        (
            "--store",
            str(tmp_path / "s"),
            "sim",
            prefix,
            "--topo",
            "ring:8,bw=1",
            "--no-record",
            "--format",
            "json",
        ),
    ):
        code, out, err, loaded = _probe(*argv, watch=("rich",))
        assert code == 0 and "rich" not in loaded, (argv, err)
    assert err.startswith("warning: physically impossible under the congestion-unaware model")
    assert json.loads(out)[0]["overloaded_links"] > 0
    out, loaded = _run("topo", "show", "ring:4", watch=("rich",))
    assert "rich" in loaded and "ring:4" in out


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


# what ``etstore ls`` must not load: the engines, the array libraries, the readers, the full store
LS_AVOIDS = (
    *HEAVY,
    "pandas",
    "numpy",
    "etstore.formats",
    "etstore.model",
    "etstore.store.base",
    "etstore.store.embedded",
    "etstore.store.warehouse",
)


def _listed_by_the_store(path: Path) -> list[dict[str, object]]:
    with store.EmbeddedStore(path, read_only=True) as s:
        return [t.as_row() for t in s.traces()]


def test_ls_reads_the_catalog_alone_and_lists_what_the_store_lists(tmp_path: Path) -> None:
    path = tmp_path / "s"
    small, wide = transformer(ranks=2, layers=1, tp=1), transformer(ranks=4, layers=2, tp=2)
    with store.EmbeddedStore(path) as s:
        s.ingest(small, name="small")
        s.ingest(wide, name="wide", parent="small")
        s.ingest(small, name="again")  # a second name of the first content
    out, loaded = _run("--store", str(path), "ls", "--format", "json", watch=LS_AVOIDS)
    assert loaded == ["etstore.cli._common", "etstore.cli._render", "etstore.cli.listing"]
    rows = json.loads(out)
    assert rows == json.loads(json_text(_listed_by_the_store(path)))
    # the counts are the generated traces' own, names in the order they were stored
    got = [(r["name"], r["ranks"], r["ops"], r["deps"], r["parent"], r["trace_id"]) for r in rows]
    assert got == [
        ("small", 2, small.num_ops, small.num_deps, None, 1),
        ("wide", 4, wide.num_ops, wide.num_deps, "small", 2),
        ("again", 2, small.num_ops, small.num_deps, None, 1),
    ]
    for fmt in ("table", "csv"):
        _out, loaded = _run("--store", str(path), "ls", "--format", fmt, watch=LS_AVOIDS)
        assert loaded == ["etstore.cli._common", "etstore.cli._render", "etstore.cli.listing"], fmt


def test_listing_answers_only_where_the_catalog_alone_can(tmp_path: Path) -> None:
    said: list[str] = []
    assert list_traces("bolt://localhost:1", notify=said.append) is None  # a server: nothing opened
    assert list_traces(tmp_path / "absent", notify=said.append) is None
    assert not (tmp_path / "absent").exists()  # the store's own open creates it, not the listing
    with pytest.raises(StoreError, match=r"^unknown store URL scheme 'http'; use a directory path"):
        list_traces("http://localhost", notify=said.append)
    _small_store(tmp_path / "s")
    listed = list_traces(tmp_path / "s", notify=said.append)
    assert listed is not None and [t.as_row() for t in listed] == _listed_by_the_store(tmp_path / "s")
    assert said == []


def test_ls_on_a_new_directory_creates_the_store_as_before(tmp_path: Path) -> None:
    out, _ = _run("--store", str(tmp_path / "new"), "ls", "--format", "csv")
    assert out == "name,kind,ranks,ops,deps,missing,messages,parent,created\n"
    assert (tmp_path / "new" / "warehouse.duckdb").is_file()
    assert list_traces(tmp_path / "new", notify=print) == []


_KILLED_MID_INGEST = """
import os, sys
from etstore.store import EmbeddedStore
from etstore.workloads import transformer
s = EmbeddedStore(sys.argv[1], purpose="test")
s.ingest(transformer(ranks=2, layers=2, tp=1), name="ghost", progress=lambda *a: os._exit(3))
"""


def test_ls_after_an_interrupted_ingest_recovers_then_reads_the_catalog_alone(tmp_path: Path) -> None:
    path = tmp_path / "s"
    _small_store(path)
    killed = subprocess.Popen(
        [sys.executable, "-c", _KILLED_MID_INGEST, str(path)], stderr=subprocess.PIPE, text=True
    )
    _, killed_err = killed.communicate(timeout=120)
    assert killed.returncode == 3, killed_err
    assert '"op": "ingest"' in (path / "journal.json").read_text()
    # the catalog holds the half-written content: only the store can roll it back, so ls opens it
    code, out, err, loaded = _probe("--store", str(path), "ls", "--format", "csv", watch=LS_AVOIDS)
    assert code == 0, err
    what = f"ingest of 'ghost' (PID {killed.pid}, test)"
    assert err == f"etstore: recovering from an interrupted {what} in {path} ...\n"
    assert [line.split(",")[0] for line in out.splitlines()[1:]] == ["small"]
    assert "etstore.store.embedded" in loaded and not (path / "journal.json").exists()
    # nothing left to recover: the next ls reads the catalog alone, and lists the same
    code, again, err, loaded = _probe("--store", str(path), "ls", "--format", "csv", watch=LS_AVOIDS)
    assert (code, again, err) == (0, out, "")
    assert loaded == ["etstore.cli._common", "etstore.cli._render", "etstore.cli.listing"]


def test_ls_waits_for_a_writer_like_any_reader(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with store.EmbeddedStore(path, purpose="test") as s:  # this process writes; ls comes
        s.ingest(transformer(ranks=2, layers=1, tp=1), name="a")
        code, out, err, loaded = _probe("--store", str(path), "--wait", "1", "ls", watch=LS_AVOIDS)
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f"etstore: waiting for PID {os.getpid()} (test) to finish writing {path} ...",
        f"etstore: error: {path}: gave up after 1 s waiting for PID {os.getpid()} (test) to finish "
        f"writing {path}; nothing was done (set ETSTORE_WAIT to wait longer)",
    ]
    assert loaded == ["etstore.cli._common", "etstore.cli._render", "etstore.cli.listing"]


def test_ls_on_a_format1_store_says_what_to_run_then_lists_it(tmp_path: Path) -> None:
    path = tmp_path / "old"
    path.mkdir()
    with tarfile.open(FORMAT1_STORE) as tar:
        tar.extractall(path, filter="data")
    code, out, err, _ = _probe("--store", str(path), "ls")
    assert (code, out) == (1, "")
    assert err == (
        f"etstore: error: {path} is store format 1 (written by an older etstore) and is open "
        f"read-only; upgrade it in place first: python -m etstore.store.upgrade {path}\n"
    )
    upgrade_store(path)
    out, loaded = _run("--store", str(path), "ls", "--format", "json", watch=LS_AVOIDS)
    assert loaded == ["etstore.cli._common", "etstore.cli._render", "etstore.cli.listing"]
    # the four traces the format-1 store holds (tests/store/data/README.md)
    got = {r["name"]: (r["kind"], r["ops"], r["parent"]) for r in json.loads(out)}
    assert got == {
        "transformer": ("workload", 20, None),
        "ring-allreduce-2r-1c": ("algorithm", 10, None),
        "transformer-expanded": ("expanded", 28, "transformer"),
        "ll": ("algorithm", 1120, None),
    }
    assert json.loads(out) == json.loads(json_text(_listed_by_the_store(path)))


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


def test_ls_of_a_server_lists_what_was_published_there(
    neo4j_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ETSTORE_WAREHOUSE", str(tmp_path / "warehouse"))  # the child's too
    small = transformer(ranks=2, layers=1, tp=1)
    serve(neo4j_url, tmp_path / "published", {"small": small})
    try:
        out, loaded = _run("--store", neo4j_url, "ls", "--format", "json", watch=("neo4j",))
        with store.open_store(neo4j_url) as s:
            listed = [t.as_row() for t in s.traces()]
        assert "neo4j" in loaded  # a server's listing is read from the server
        assert json.loads(out) == json.loads(json_text(listed))
        assert [(r["name"], r["ops"], r["deps"]) for r in listed] == [
            ("small", small.num_ops, small.num_deps)
        ]
    finally:
        clear_server(neo4j_url)


def test_the_command_hides_pandas_from_pyarrow_and_answers_the_same(tmp_path: Path) -> None:
    """pyarrow loads pandas (≈ 0.2 s) at its first numpy conversion wherever pandas is installed;
    the command's own process hides it, and every answer stays the same."""
    pytest.importorskip("pandas")  # where pandas is not installed there is nothing to hide
    prefix = str(Path(__file__).parents[2] / "examples" / "transformer_8r" / "transformer")
    sim = ("sim", prefix, "--topo", "ring:8", "--no-record", "--format", "json")
    hidden, loaded = _run("--store", str(tmp_path / "a"), *sim, watch=("pandas",), command_process=True)
    plain, loaded_plain = _run("--store", str(tmp_path / "b"), *sim, watch=("pandas",))
    assert "pandas" not in loaded and "pandas" in loaded_plain
    assert {**json.loads(hidden)[0], "wall_s": 0, "events_per_s": 0} == {
        **json.loads(plain)[0],
        "wall_s": 0,
        "events_per_s": 0,
    }
    # Ladybug imports pandas before each Arrow scan wherever find_spec finds it: the scans see it absent
    store = ("--store", str(tmp_path / "a"))
    _, loaded = _run(*store, "ingest", prefix, watch=("pandas",), command_process=True)
    assert "pandas" not in loaded
    count = "MATCH (o:Op)-[d:DEP]->(:Op) RETURN count(DISTINCT o) AS srcs, count(d) AS deps"
    out, _ = _run(*store, "cypher", count, "--format", "json", command_process=True)
    stored = json.loads(out)
    out, _ = _run(*store, "show", "transformer", "--format", "json", "--table", "trace", command_process=True)
    assert stored[0]["deps"] == json.loads(out)[0]["deps"] == 288
