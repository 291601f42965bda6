"""Names from traces print verbatim, never read as rich markup (issue 35, round 2, item 1).

A trace named ``[/x]`` made every ``etstore ls`` in the table format end in rich's
MarkupError traceback, and DLRM's op ``[pytorch|profiler|execution_graph|thread]`` printed as an
empty cell (rich took it for a style). Every table, title, message, warning and progress line
now takes such names as text.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pyarrow as pa
import pytest
from rich.console import Console

from etstore.cli import main
from etstore.cli._common import phase_step, progress
from etstore.cli._console import DeferredConsole, styled, warn
from etstore.cli._render import Rows, render

TRACE = "[/x]"
OPS = ("[pytorch|profiler|execution_graph|thread]", "[bold]x[/bold]", "[/x]", ":thumbs_up:")


@pytest.fixture
def marked(tmp_path: Path) -> Path:
    """A store holding the trace ``[/x]`` whose ops are named like markup, chained 1 → 2 → 3 → 4."""
    nodes = [
        {
            "Id": i,
            "Name": name,
            "NodeType": 4,
            "ctrlDeps": [],
            "data_deps": [i - 1] if i > 1 else [],
            "runtime": 10 * i,
            "is_cpu_op": True,
        }
        for i, name in enumerate(OPS, start=1)
    ]
    path = tmp_path / "t.0.json"
    path.write_text(json.dumps({"workload_graph": nodes}))
    store = tmp_path / "store"
    assert main(["--store", str(store), "ingest", str(path), "--name", TRACE]) == 0
    return store


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_ls_show_sql_and_critical_path_print_names_verbatim(
    marked: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    store = ["--store", str(marked)]
    code, out, err = _run(capsys, *store, "ls")
    assert code == 0 and "Traceback" not in err
    assert re.search(r"│ \[/x\] +│ workload", out), out
    code, out, err = _run(capsys, *store, "show", TRACE)
    assert code == 0 and out.startswith("[/x] (workload) 1 ranks, 4 ops"), out
    code, out, err = _run(capsys, *store, "sql", "SELECT name FROM ops ORDER BY id")
    assert code == 0, err
    for name in OPS:  # each in its own cell, as written
        assert f"│ {name} " in out, out
    code, out, err = _run(capsys, *store, "critical-path", TRACE)
    assert code == 0, err
    assert "critical path of [/x]" in out  # the title
    for name in OPS:
        assert f"│ {name} " in out, out


def test_errors_name_markup_verbatim(marked: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    code, _, err = _run(capsys, "--store", str(marked), "show", "[bold]nope[/bold]")
    assert code == 1
    assert err == f"etstore: error: no trace named '[bold]nope[/bold]' in {marked}; stored traces: [/x]\n"


def test_render_escapes_cells_headers_and_title_on_any_console() -> None:
    out = io.StringIO()
    table = pa.table({"[red]name[/red]": list(OPS), "n": [1, 2, 3, 4]})
    render(table, "table", title="ops of [/x]", console=Console(file=out, width=120))  # markup on
    text = out.getvalue()
    assert "ops of [/x]" in text and "[red]name[/red]" in text
    assert all(name in text for name in OPS)
    plain = io.StringIO()
    render(Rows(["name"], [{"name": "[/x]"}]), "table", out=plain)
    assert "[/x]" in plain.getvalue()


def test_messages_warnings_and_progress_lines_are_verbatim(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    console = DeferredConsole(file=io.StringIO(), width=120)
    console.print(f"removed {TRACE} {OPS[0]} {OPS[3]}")
    console.print(styled((TRACE, "bold"), ": ", (OPS[1], "green")))
    assert console.file.getvalue().splitlines() == [
        f"removed {TRACE} {OPS[0]} {OPS[3]}",
        f"{TRACE}: {OPS[1]}",
    ]
    monkeypatch.setenv("FORCE_COLOR", "1")  # warn() draws with rich only on a terminal
    warn(f"{TRACE}: a warning about {OPS[0]}")
    err = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().err)
    assert err == f"warning: {TRACE}: a warning about {OPS[0]}\n"
    monkeypatch.delenv("CI", raising=False)
    terminal = DeferredConsole(file=io.StringIO(), force_terminal=True, width=160)
    bar = progress(terminal)
    assert bar is not None
    with bar:
        phase_step(bar, f"rm {TRACE}")("remove [bold]", 1, 2)
        bar.refresh()
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal.file.getvalue())
    assert "rm [/x] (remove [bold])" in drawn
