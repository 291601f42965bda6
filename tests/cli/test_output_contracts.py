"""The CLI's output contracts: JSON is a list of rows, CSV one table, a cut table says so, global
options go anywhere, a misspelled option or a foreign file is named, and a name added to stored
content says whose content it is."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from etstore.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _workload(ranks: int) -> tuple[str, ...]:
    """``etstore workload``: a synthetic training step of ``ranks`` ranks, tensor-parallel 2, one layer."""
    return ("workload", "--ranks", str(ranks), "--tp", "2", "--layers", "1")


@pytest.fixture
def store(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> str:
    """A store holding ``w``, a 24-rank synthetic training step (more ranks than a table shows)."""
    s = str(tmp_path / "s")
    code, _, err = run(capsys, "--store", s, *_workload(24), "--name", "w", "--ingest")
    assert code == 0, err
    return s


def _one_csv_table(text: str) -> list[list[str]]:
    """The rows of ``text``, which must be one CSV table: a header, then rows as wide as it."""
    rows = list(csv.reader(io.StringIO(text)))
    assert rows and all(len(r) == len(rows[0]) for r in rows), text
    return rows


def _rows(text: str) -> list[dict[str, object]]:
    doc = json.loads(text)
    assert isinstance(doc, list) and all(isinstance(r, dict) for r in doc), text[:200]
    return doc


def test_show_json_is_a_list_of_rows(capsys: pytest.CaptureFixture[str], store: str) -> None:
    code, out, _ = run(capsys, "--store", store, "show", "w", "--format", "json")
    assert code == 0 and {r["rank"] for r in _rows(out)} == set(range(24))
    code, out, _ = run(capsys, "--store", store, "show", "w", "--format", "json", "--table", "trace")
    assert code == 0 and [(r["name"], r["ranks"]) for r in _rows(out)] == [("w", 24)]


def test_show_csv_is_one_table(capsys: pytest.CaptureFixture[str], store: str) -> None:
    code, out, _ = run(capsys, "--store", store, "show", "w", "--format", "csv")
    rows = _one_csv_table(out)
    assert code == 0 and rows[0] == ["rank", "type", "ops", "duration_micros"]
    code, out, _ = run(capsys, "--store", store, "show", "w", "--format", "csv", "--table", "collectives")
    rows = _one_csv_table(out)
    assert code == 0 and rows[0] == ["comm_type", "comm_size", "pg_name", "count"] and len(rows) > 1


def test_sim_json_is_a_list_of_rows(capsys: pytest.CaptureFixture[str], store: str) -> None:
    sim = ("--store", store, "sim", "w", "--topo", "switch:24", "--no-record", "--format", "json")
    code, out, _ = run(capsys, *sim)
    (summary,) = _rows(out)
    assert code == 0 and summary["trace"] == "w" and summary["total_ns"] > 0
    code, out, _ = run(capsys, *sim, "--table", "ranks", "--limit", "0")
    assert code == 0 and [r["rank"] for r in _rows(out)] == list(range(24))


def test_sim_csv_keeps_the_makespan_and_the_collectives(
    capsys: pytest.CaptureFixture[str], store: str
) -> None:
    sim = ("--store", store, "sim", "w", "--topo", "switch:24", "--no-record", "--format", "csv")
    code, out, _ = run(capsys, *sim)
    header, row = _one_csv_table(out)  # the summary: one row
    summary = dict(zip(header, row, strict=True))
    assert code == 0 and float(summary["total_ns"]) > 0 and int(summary["collectives"]) > 0
    code, out, _ = run(capsys, *sim, "--table", "collectives", "--limit", "0")
    header, *rows = _one_csv_table(out)
    assert code == 0 and {"comm_type", "time_ns", "busbw_gb_per_s"} <= set(header)
    assert len(rows) == int(summary["collectives"])


def test_sim_table_says_how_many_rank_rows_it_left_out(
    capsys: pytest.CaptureFixture[str], store: str
) -> None:
    code, out, _ = run(capsys, "--store", store, "sim", "w", "--topo", "switch:24", "--no-record")
    assert code == 0 and "… 4 more rows (24 in all); --limit 0 for all" in out
    code, out, _ = run(
        capsys, "--store", store, "sim", "w", "--topo", "switch:24", "--no-record", "--limit", "0"
    )
    assert code == 0 and "more rows" not in out


def test_critical_path_json_cut_short_says_so(capsys: pytest.CaptureFixture[str], store: str) -> None:
    path = ("--store", store, "critical-path", "w", "--format", "json")
    total = len(_rows(run(capsys, *path, "--limit", "0")[1]))
    code, out, err = run(capsys, *path, "--limit", "3")
    assert code == 0 and len(_rows(out)) == 3 < total  # stdout stays the data alone
    assert err == f"etstore: … {total - 3} more rows ({total} in all); --limit 0 for all\n"


def test_global_options_go_after_the_command_too(capsys: pytest.CaptureFixture[str], store: str) -> None:
    code, out, err = run(capsys, "ls", "--store", store, "--format", "csv", "--wait", "5")
    assert code == 0 and [r[0] for r in _one_csv_table(out)] == ["name", "w"], err
    code, _, err = run(capsys, "algo", "gen", "ring", "--coll", "allreduce", "--ranks", "4", "--store", store)
    assert code == 0, err
    listed = run(capsys, "--store", store, "ls", "--format", "csv")[1]
    assert [r[0] for r in _one_csv_table(listed)] == ["name", "w", "ring-allreduce-4r-1c"]


def test_a_misspelled_option_is_named(capsys: pytest.CaptureFixture[str], store: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--store", store, "show", "--formt", "json", "w"])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err.splitlines()[-1] == "etstore show: error: unknown option --formt; did you mean --format?"


@pytest.mark.parametrize(
    ("name", "content", "what"),
    [
        (
            "nccl_graph.xml",
            '<graphs version="1">\n  <graph id="0" pattern="4" nchannels="2">\n  </graph>\n</graphs>\n',
            r"an NCCL graph dump \(NCCL_GRAPH_DUMP_FILE\), root element <graphs>: not MSCCL-IR",
        ),
        (
            "ranks.json",
            json.dumps(list(range(64))),
            r"a JSON list that is no trace etstore reads \(expected a JSON object",
        ),
    ],
)
def test_a_file_of_an_unknown_kind_is_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, content: str, what: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    code, out, err = run(capsys, "--store", str(tmp_path / "s"), "ingest", str(path))
    assert code == 1 and out == "" and err.count("\n") == 1
    assert re.match(rf"etstore: error: {re.escape(str(path))}: {what}", err), err


def test_ingest_files_with_a_name_reads_them_as_one_trace(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    s, prefix = str(tmp_path / "s"), tmp_path / "in" / "w"
    prefix.parent.mkdir()
    assert run(capsys, "--store", s, *_workload(4), "--out", str(prefix))[0] == 0
    files = sorted(str(p) for p in prefix.parent.glob("w.*.et"))  # as the shell expands w.*.et
    assert len(files) == 4
    code, out, err = run(capsys, "--store", s, "ingest", *files, "--name", "listed", "--format", "json")
    assert code == 0, err
    (row,) = _rows(out)
    assert (row["trace"], row["ranks"], row["status"]) == ("listed", 4, "new")
    glob = f"{prefix}.*.et"  # the same files as a glob etstore expands: the same content
    code, out, err = run(capsys, "--store", s, "ingest", glob, "--name", "globbed", "--format", "json")
    (row,) = _rows(out)
    assert code == 0 and (row["status"], row["same_as"]) == ("new name", "listed"), err


def test_a_new_name_for_stored_content_says_whose_it_is(
    capsys: pytest.CaptureFixture[str], store: str
) -> None:
    code, out, _ = run(capsys, "--store", store, *_workload(24), "--name", "again", "--ingest")
    assert code == 0 and "stored again:" in out and "(new name of w's content)" in out
    ring = (
        "--store",
        store,
        "algo",
        "gen",
        "ring",
        "--coll",
        "allreduce",
        "--ranks",
        "4",
        "--format",
        "json",
    )
    assert run(capsys, *ring)[0] == 0
    code, out, _ = run(capsys, *ring, "--name", "r4")
    (row,) = _rows(out)
    assert code == 0 and (row["trace"], row["status"], row["same_as"]) == (
        "r4",
        "new name",
        "ring-allreduce-4r-1c",
    )


def test_every_command_prints_json_as_a_list_of_rows(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    s = str(tmp_path / "s")
    for argv in (
        ("topo", "show", "ring:4"),
        ("synth", "--topo", "ring:4", "--coll", "allgather", "--no-store"),
        ("sweep", "--algo", "ring", "--topo", "ring:4", "--sizes", "1MiB,2MiB", "--no-record"),
        ("algo", "list"),
        ("runs",),
        ("ls",),
    ):
        code, out, err = run(capsys, "--store", s, *argv, "--format", "json")
        assert code == 0, (argv, err)
        _rows(out)
