"""nccl-tests logs: real logs from public repositories (tests/data/nccl_tests/SOURCES.md).

Every pinned value below was read off the log text by hand; the arithmetic checks use
nccl-tests' own definitions (algbw = size / time with GB = 10^9 bytes; busbw = algbw x
2(n-1)/n for all-reduce, (n-1)/n for all-gather, 1 for broadcast). Variants no licensed
real log covers (rccl-tests version lines, several hosts, no footer) are made in the
test from a real log by inserting or dropping lines, and say so.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import pyarrow.compute as pc
import pytest

from etstore.app.ingest_files import ingest_paths
from etstore.app.measured import store_measured_run
from etstore.cli import main
from etstore.errors import StoreError, TraceFormatError
from etstore.formats.nccl_tests import is_nccl_tests_log, read_nccl_tests
from etstore.store import EmbeddedStore

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl_tests"
ALLREDUCE = DATA / "superbench_nccl_allreduce.log"
BROADCAST = DATA / "superbench_nccl_broadcast.log"
ALLGATHER = DATA / "superbench_nccl_allgather.log"
DEEPOPS = DATA / "deepops_network_operator_allreduce.md"
AWSOME = DATA / "awsome_batch_p5_allreduce.md"
LOGS = (ALLREDUCE, BROADCAST, ALLGATHER, DEEPOPS, AWSOME)


def _row(parsed, size: int, in_place: bool) -> dict:  # type: ignore[no-untyped-def]
    rows = [
        r for r in parsed.measurements.to_pylist() if r["size_bytes"] == size and r["in_place"] == in_place
    ]
    assert len(rows) == 1
    return rows[0]


def _line_of(path: Path, needle: str) -> int:
    """1-based number of the only line of ``path`` that starts with ``needle`` (after an MPI tag)."""
    text = path.read_bytes().decode()
    hits = [
        i for i, line in enumerate(text.splitlines(), 1) if re.match(rf"(\S*>:)?\s*{re.escape(needle)}", line)
    ]
    assert len(hits) == 1
    return hits[0]


# ---------------------------------------------------------------- each real log


def test_older_layout_with_error_column_na_cells_and_an_info_line() -> None:
    log = read_nccl_tests(ALLREDUCE)
    # 34 sizes (0, 0, then 4 B to 8 GiB by doubling), each out-of-place and in-place
    assert log.measurements.num_rows == 68
    assert (log.collective, log.ranks, log.nodes, log.gpu_model) == ("ALL_REDUCE", 8, 1, "A100-SXM4-40GB")
    assert (log.errors_kind, log.avg_busbw_gb_per_s, log.out_of_bounds) == ("error", 68.4048, 0)
    assert log.header == {
        "n_threads": 1,
        "gpus_per_thread": 8,
        "min_bytes": 1,
        "max_bytes": 8589934592,
        "step": 2,
        "step_kind": "factor",
        "warmup_iters": 5,
        "iters": 20,
        "validation": 0,
    }
    line = _line_of(ALLREDUCE, "1073741824 ")
    oop = _row(log, 1073741824, False)
    assert oop == {
        "size_bytes": 1073741824,
        "count": 268435456,
        "dtype": "float",
        "redop": "sum",
        "root": None,
        "in_place": False,
        "time_us": 8159.5,
        "algbw_gb_per_s": 131.59,
        "busbw_gb_per_s": 230.29,
        "errors": None,  # N/A: validation off
        "line": line,
    }
    ip = _row(log, 1073741824, True)
    assert (ip["time_us"], ip["algbw_gb_per_s"], ip["busbw_gb_per_s"]) == (8176.5, 131.32, 229.81)
    assert log.devices.num_rows == 8 and set(log.devices["host"].to_pylist()) == {"localhost"}


def test_bandwidths_are_gb_of_ten_to_the_nine_bytes() -> None:
    log = read_nccl_tests(ALLREDUCE)
    big = [r for r in log.measurements.to_pylist() if r["size_bytes"] >= 1 << 20]
    for r in big:
        algbw = r["size_bytes"] / (r["time_us"] * 1e3)  # bytes per ns = GB/s with GB = 1e9
        # times carry 4-5 significant digits: 0.1% covers the rounding; GB = 2^30 would be 7.4% off
        assert r["algbw_gb_per_s"] == pytest.approx(algbw, rel=1e-3)
        assert r["busbw_gb_per_s"] == pytest.approx(r["algbw_gb_per_s"] * 2 * 7 / 8, rel=1e-3)


def test_root_without_redop_is_a_broadcast() -> None:
    log = read_nccl_tests(BROADCAST)
    assert (log.collective, log.measurements.num_rows, log.avg_busbw_gb_per_s) == ("BROADCAST", 68, 64.8653)
    r = _row(log, 4294967296, True)
    assert (r["count"], r["redop"], r["root"], r["time_us"], r["algbw_gb_per_s"], r["busbw_gb_per_s"]) == (
        1073741824,
        None,
        0,
        18381.0,
        233.66,
        233.66,
    )


def test_no_redop_no_root_leaves_the_collective_open_unless_named() -> None:
    log = read_nccl_tests(ALLGATHER)
    assert log.collective is None  # all-gather and all-to-all print the same columns
    assert read_nccl_tests(ALLGATHER, collective="all_gather").collective == "ALL_GATHER"
    r = _row(log, 32, False)
    assert (r["count"], r["time_us"]) == (1, 35.03)  # 1 float per rank x 8 ranks = 32 B
    last = _row(log, 8589934592, False)
    assert last["busbw_gb_per_s"] == pytest.approx(last["algbw_gb_per_s"] * 7 / 8, abs=0.01)


def test_a_log_pasted_under_a_markdown_heading_with_crlf_line_ends() -> None:
    assert b"\r\n" in DEEPOPS.read_bytes()
    log = read_nccl_tests(DEEPOPS)
    assert log.measurements.num_rows == 60  # 8 B .. 4 GiB: 30 sizes
    assert (log.collective, log.ranks, log.nodes, log.gpu_model) == ("ALL_REDUCE", None, None, None)
    assert (log.errors_kind, log.avg_busbw_gb_per_s, log.header) == ("error", 53.7098, {})
    r = _row(log, 4294967296, True)
    assert (r["time_us"], r["algbw_gb_per_s"], r["busbw_gb_per_s"], r["errors"]) == (
        42677.0,
        100.64,
        188.70,
        5e-07,
    )
    assert r["line"] == _line_of(DEEPOPS, "4294967296 ")


def test_open_mpi_tagged_lines_in_the_current_layout() -> None:
    log = read_nccl_tests(AWSOME)
    assert (log.measurements.num_rows, log.collective, log.errors_kind) == (64, "ALL_REDUCE", "wrong")
    assert log.avg_busbw_gb_per_s == 156.742
    r = _row(log, 17179869184, False)
    assert (r["count"], r["root"], r["time_us"], r["algbw_gb_per_s"], r["busbw_gb_per_s"], r["errors"]) == (
        4294967296,
        -1,
        62239.0,
        276.03,
        483.05,
        0.0,
    )
    assert r["line"] == _line_of(AWSOME, "17179869184 ")


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name)
def test_every_fixture_is_recognised_by_content(path: Path) -> None:
    assert is_nccl_tests_log(path)


def test_other_files_are_not_logs(tmp_path: Path) -> None:
    assert not is_nccl_tests_log(DATA / "SOURCES.md")
    assert not is_nccl_tests_log(tmp_path)  # a directory
    binary = tmp_path / "x.et"
    binary.write_bytes(b"\x00\x01# nThread 1 nGpus 1\n")
    assert not is_nccl_tests_log(binary)


# ---------------------------------------------------------------- variants made from real logs


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    out = tmp_path / name
    out.write_text("\n".join(lines) + "\n")
    return out


def test_rccl_tests_version_lines_and_the_launch_command(tmp_path: Path) -> None:
    # the lines rccl-tests prints (src/common.cu) and a launch command, inserted into a real log
    lines = _lines(ALLREDUCE)
    lines.insert(2, "rccl-tests: Version develop:a7809b3")
    lines.insert(12, "RCCL version : 2.22.3-develop:f5b15f2")
    lines.insert(13, "HIP version  : 6.3.42131-fa1d09cbd")
    lines.insert(0, "$ mpirun -np 1 ./build/all_reduce_perf -b 1 -e 8G -f 2 -g 8")
    log = read_nccl_tests(_write(tmp_path, "rccl.txt", lines))
    assert (log.tool, log.tool_version, log.library_version) == (
        "rccl-tests",
        "develop:a7809b3",
        "RCCL 2.22.3-develop:f5b15f2",
    )
    assert (log.benchmark, log.collective, log.measurements.num_rows) == ("all_reduce_perf", "ALL_REDUCE", 68)


def test_the_nccl_tests_version_line(tmp_path: Path) -> None:
    # the first line nccl-tests >= 2.17 prints, inserted into a real log
    lines = ["# nccl-tests version 2.18.0 nccl-headers=22907 nccl-library=22907", *_lines(ALLREDUCE)]
    log = read_nccl_tests(_write(tmp_path, "v.txt", lines))
    assert (log.tool, log.tool_version, log.library_version) == ("nccl-tests", "2.18.0", "NCCL 2.29.7")


def test_an_in_place_only_table(tmp_path: Path) -> None:
    # rccl-tests can print the in-place group alone: the real rows cut to their in-place cells
    lines = []
    for ln in _lines(ALLREDUCE):
        cells = ln.split()
        if ln.startswith("#") and "out-of-place" in ln:
            lines.append("#                                                     in-place")
        elif ln.startswith("#       size"):
            lines.append("#       size         count    type   redop     time   algbw   busbw  error")
        elif cells and cells[0].isdigit() and len(cells) == 12:
            lines.append("  ".join(cells[:4] + cells[8:]))
        else:
            lines.append(ln)
    log = read_nccl_tests(_write(tmp_path, "ip.txt", lines))
    assert log.measurements.num_rows == 34 and pc.all(log.measurements["in_place"]).as_py()
    assert _row(log, 1073741824, True)["time_us"] == 8176.5


def test_the_binary_name_decides_over_the_columns(tmp_path: Path) -> None:
    lines = ["# Collective test starting: all_gather_perf_mpi", *_lines(ALLGATHER)]
    log = read_nccl_tests(_write(tmp_path, "ag.txt", lines))
    assert (log.benchmark, log.collective) == ("all_gather_perf", "ALL_GATHER")


def test_devices_on_two_hosts_and_no_footer(tmp_path: Path) -> None:
    # ranks 4-7 moved to a second host; the footer (last three lines) cut off
    lines = [
        ln.replace("on localhost", "on node2") if any(f"Rank  {r} " in ln for r in (4, 5, 6, 7)) else ln
        for ln in _lines(ALLREDUCE)[:-3]
    ]
    log = read_nccl_tests(_write(tmp_path, "two.txt", lines))
    assert (log.ranks, log.nodes, log.avg_busbw_gb_per_s, log.out_of_bounds) == (8, 2, None, None)
    assert log.measurements.num_rows == 68
    assert json.loads(log.run_row()["header"])["gpus_per_thread"] == 8
    assert log.run_row()["hosts"] == "localhost,node2"


# ---------------------------------------------------------------- bad logs


def _broken(tmp_path: Path, edit_line: int, new: str | None) -> Path:
    lines = _lines(ALLREDUCE)
    if new is None:
        del lines[edit_line - 1]
    else:
        lines[edit_line - 1] = new
    return _write(tmp_path, "bad.log", lines)


def test_a_row_with_a_missing_cell_names_the_line(tmp_path: Path) -> None:
    n = _line_of(ALLREDUCE, "1073741824 ")
    row = _lines(ALLREDUCE)[n - 1].replace(" N/A ", " ", 1)
    with pytest.raises(TraceFormatError, match=rf"bad\.log:{n}: 11 cells in a table row; .* has 12"):
        read_nccl_tests(_broken(tmp_path, n, row))


def test_a_cell_that_is_not_a_number_names_line_and_column(tmp_path: Path) -> None:
    n = _line_of(ALLREDUCE, "1073741824 ")
    row = _lines(ALLREDUCE)[n - 1].replace("8159.5", "8159.5x")
    with pytest.raises(
        TraceFormatError, match=rf"bad\.log:{n}: column time is '8159\.5x', expected a number"
    ):
        read_nccl_tests(_broken(tmp_path, n, row))


def test_rows_without_a_column_header(tmp_path: Path) -> None:
    n = _line_of(ALLREDUCE, "#       size ")
    with pytest.raises(TraceFormatError, match=r"bad\.log:\d+: a table row before any column header"):
        read_nccl_tests(_broken(tmp_path, n, None))


def test_an_unknown_column_header(tmp_path: Path) -> None:
    n = _line_of(ALLREDUCE, "#       size ")
    with pytest.raises(TraceFormatError, match=rf"bad\.log:{n}: unknown column header"):
        read_nccl_tests(_broken(tmp_path, n, "#  size  count  type  redop  time  algbw  speed  error"))


def test_no_header_and_no_rows(tmp_path: Path) -> None:
    only_header = _write(tmp_path, "h.log", _lines(ALLREDUCE)[:16])
    with pytest.raises(TraceFormatError, match=r"h\.log: a column header but no table rows"):
        read_nccl_tests(only_header)
    prose = _write(tmp_path, "p.log", ["# nThread 1 nGpus 8 minBytes 1", "nothing else"])
    with pytest.raises(TraceFormatError, match=r"p\.log: no nccl-tests column header"):
        read_nccl_tests(prose)


def test_two_runs_in_one_file(tmp_path: Path) -> None:
    both = _write(tmp_path, "two.log", _lines(ALLREDUCE) + _lines(BROADCAST))
    first = len(_lines(ALLREDUCE)) + 1
    with pytest.raises(TraceFormatError, match=rf"two\.log:{first}: a second run starts"):
        read_nccl_tests(both)


def test_binary_and_unknown_collective(tmp_path: Path) -> None:
    raw = tmp_path / "raw.log"
    raw.write_bytes(b"# nThread 1 nGpus 1\n\xff\xfe\n")
    with pytest.raises(TraceFormatError, match=r"raw\.log: not a text log \(byte 20 is not UTF-8\)"):
        read_nccl_tests(raw)
    with pytest.raises(TraceFormatError, match=r"'ring' is not a collective name"):
        read_nccl_tests(ALLREDUCE, collective="ring")
    with pytest.raises(TraceFormatError, match=r"missing\.log: cannot read the log"):
        read_nccl_tests(tmp_path / "missing.log")


# ---------------------------------------------------------------- into the store


def test_ingest_stores_each_log_once(tmp_path: Path) -> None:
    with EmbeddedStore(tmp_path / "s") as store:
        stats = ingest_paths(store, [str(p) for p in LOGS])
        assert (stats.files_ok, len(stats.measured), stats.reports) == (5, 5, ())
        wh = store.warehouse
        assert wh.query("SELECT count(*) FROM measured_runs").scalar() == 5
        assert wh.query("SELECT count(*) FROM measurements").scalar() == 68 * 3 + 60 + 64
        row = wh.query(
            "SELECT m.time_us, m.busbw_gb_per_s, m.ranks, m.gpu_model, r.errors_kind FROM measurements m "
            "JOIN measured_runs r USING (run_id) WHERE r.name = 'superbench_nccl_allreduce' "
            "AND m.size_bytes = 1073741824 AND NOT m.in_place"
        ).to_pylist()
        assert row == [
            {
                "time_us": 8159.5,
                "busbw_gb_per_s": 230.29,
                "ranks": 8,
                "gpu_model": "A100-SXM4-40GB",
                "errors_kind": "error",
            }
        ]
        again = ingest_paths(store, [str(ALLREDUCE)])
        assert [(m.name, m.created) for m in again.measured] == [("superbench_nccl_allreduce", False)]
        copy = tmp_path / "elsewhere" / "renamed.txt"
        copy.parent.mkdir()
        copy.write_bytes(ALLREDUCE.read_bytes())
        assert not ingest_paths(store, [str(copy)]).measured[0].created  # the content decides
        assert wh.query("SELECT count(*) FROM measurements").scalar() == 68 * 3 + 60 + 64


def test_a_name_taken_by_another_log(tmp_path: Path) -> None:
    other = tmp_path / "d" / "superbench_nccl_allreduce.log"
    other.parent.mkdir()
    other.write_bytes(BROADCAST.read_bytes())
    with EmbeddedStore(tmp_path / "s") as store:
        ingest_paths(store, [str(ALLREDUCE)])
        assert ingest_paths(store, [str(other)]).measured[0].name == "superbench_nccl_allreduce-2"
        with pytest.raises(
            StoreError, match=r"measured run 'superbench_nccl_allreduce' already holds another log"
        ):
            store_measured_run(store.warehouse, read_nccl_tests(AWSOME), name="superbench_nccl_allreduce")
        assert store.warehouse.query("SELECT count(*) FROM measured_runs").scalar() == 2


def test_a_bad_log_stores_nothing_and_the_error_starts_with_its_path(tmp_path: Path) -> None:
    n = _line_of(ALLREDUCE, "1073741824 ")
    bad = _broken(tmp_path, n, _lines(ALLREDUCE)[n - 1].replace("8159.5", "oops"))
    with EmbeddedStore(tmp_path / "s") as store:
        with pytest.raises(
            TraceFormatError, match=rf"^{bad}:{n}: column time is 'oops'.*stored before this failure: deepops"
        ):
            ingest_paths(store, [str(DEEPOPS), str(bad)])
        names = store.warehouse.query("SELECT name FROM measured_runs").to_arrow()["name"].to_pylist()
        assert names == ["deepops_network_operator_allreduce"]
        assert store.warehouse.query("SELECT count(*) FROM measurements").scalar() == 60
        stats = ingest_paths(store, [str(bad), str(AWSOME)], on_error="skip")
        assert [m.name for m in stats.measured] == ["awsome_batch_p5_allreduce"]
        assert stats.skipped[0][0] == str(bad) and f":{n}: column time is 'oops'" in stats.skipped[0][1]


def test_cli_ingest_renders_measured_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["--store", str(tmp_path / "s"), "ingest", str(AWSOME), "--name", "p5", "--format", "json"])
    out = capsys.readouterr().out
    assert code == 0
    assert json.loads(out) == [
        {
            "measured_run": "p5",
            "run_id": 1,
            "status": "new",
            "collective": "ALL_REDUCE",
            "ranks": None,
            "nodes": None,
            "gpu_model": None,
            "rows": 64,
        }
    ]
    code = main(
        [
            "--store",
            str(tmp_path / "s"),
            "sql",
            "SELECT max(busbw_gb_per_s) AS b FROM measurements",
            "--format",
            "json",
        ]
    )
    assert code == 0 and json.loads(capsys.readouterr().out) == [{"b": 483.35}]
    in_place = pc.sum(read_nccl_tests(AWSOME).measurements["in_place"]).as_py()
    assert in_place == 32


# ---------------------------------------------------------------- docs/measured.md


def _doc_examples() -> list[str]:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "measured.md").read_text()
    section = doc.split("## Example SQL: measured runs", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sql\n(.*?)```", section, re.S)


def test_the_doc_has_examples() -> None:
    examples = _doc_examples()
    assert len(examples) >= 5
    assert all(t in "".join(examples) for t in ("measured_runs", "measurements"))


@pytest.mark.parametrize("sql", _doc_examples(), ids=lambda s: s.split("\n")[0][:40])
def test_doc_example_runs_on_the_fixture_logs(tmp_path: Path, sql: str) -> None:
    with EmbeddedStore(tmp_path / "s") as store:
        ingest_paths(store, [str(p) for p in LOGS])
    con = duckdb.connect(str(tmp_path / "s" / "warehouse.duckdb"), read_only=True)
    try:
        rows = con.sql(sql).fetchall()
    finally:
        con.close()
    assert rows, f"example returned no rows:\n{sql}"
