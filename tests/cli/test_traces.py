"""The CLI end to end: real store, real files; errors are one line, non-zero, and change nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from etstore.cli import main
from etstore.formats import read_trace


def run(capsys: pytest.CaptureFixture[str], store: Path, *args: str) -> tuple[int, str, str]:
    code = main(["--store", str(store), *args])
    out, err = capsys.readouterr()
    return code, out, err


def state(capsys: pytest.CaptureFixture[str], store: Path) -> tuple[str, str]:
    _, listing, _ = run(capsys, store, "ls", "--format", "json")
    _, count, _ = run(capsys, store, "sql", "SELECT count(*) AS n FROM ops", "--format", "json")
    return listing, count


def test_ingest_ls_show_query_export(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, custom_allreduce: Path
) -> None:
    s = tmp_path / "s"
    code, out, _ = run(capsys, s, "ingest", str(custom_allreduce), "--format", "json")
    assert code == 0 and json.loads(out)[0]["ops"] == 280
    code, out, _ = run(capsys, s, "ls", "--format", "csv")
    assert out.splitlines()[0].startswith("name,kind,ranks,ops") and "custom_allreduce,workload,8,280" in out
    code, out, _ = run(capsys, s, "show", "custom_allreduce", "--format", "json")
    assert sum(r["ops"] for r in json.loads(out)) == 280  # the ops per rank and type
    code, out, _ = run(
        capsys,
        s,
        "cypher",
        "MATCH (a:Op)-[:MSG]->(b:Op) WHERE a.rank = $r RETURN DISTINCT b.rank AS peer",
        "--param",
        "r=3",
        "--format",
        "json",
    )
    assert json.loads(out) == [{"peer": 4}]
    code, out, _ = run(capsys, s, "export", "custom_allreduce", "--out", str(tmp_path / "x" / "ar"))
    assert code == 0 and len(list((tmp_path / "x").glob("ar.*.et"))) == 8
    code, out, _ = run(capsys, s, "critical-path", "custom_allreduce", "--format", "json", "--limit", "0")
    rows = json.loads(out)  # the documented form: a list of the path's rows
    assert isinstance(rows, list) and [r["step"] for r in rows] == list(range(len(rows)))
    assert sum(r["duration_micros"] for r in rows) == 49  # 7 reduction steps of 7 µs on the ring
    code, out, _ = run(
        capsys, s, "export", "custom_allreduce", "--format", "json", "--out", str(tmp_path / "j" / "ar")
    )
    assert code == 0
    code, out, _ = run(capsys, s, "rm", "custom_allreduce")
    assert code == 0 and state(capsys, s)[1].strip() == '[\n {\n  "n": 0\n }\n]'


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d.joinpath("t.0.et").write_bytes(b""), "empty file"),
        (lambda d: d.joinpath("p.0.et").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64), "PNG image"),
        (lambda d: d.joinpath("h.0.et").write_bytes(b"\x80\x80\x80\x80\x08abc"), "claims 2147483648 bytes"),
    ],
)
def test_bad_files(capsys: pytest.CaptureFixture[str], tmp_path: Path, make, message: str) -> None:
    s = tmp_path / "s"
    d = tmp_path / "in"
    d.mkdir()
    make(d)
    before = state(capsys, s)
    code, _, err = run(capsys, s, "ingest", str(d))
    assert code == 1 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert state(capsys, s) == before


def test_truncated_file_and_mixed_dir(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    feeder: Path,
    custom_allreduce: Path,
    rt_template: Path,
) -> None:
    s = tmp_path / "s"
    run(capsys, s, "ingest", str(rt_template))
    before = state(capsys, s)
    cut = tmp_path / "cut.0.et"
    cut.write_bytes(feeder.read_bytes()[:50_000])
    code, _, err = run(capsys, s, "ingest", str(cut))
    assert code == 1 and "cut.0.et: byte" in err
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for p in [*custom_allreduce.glob("*.et"), *rt_template.glob("*.et")]:
        (mixed / p.name).write_bytes(p.read_bytes())
    code, _, err = run(capsys, s, "ingest", str(mixed))
    assert code == 1 and "mixes traces with different prefixes" in err
    assert state(capsys, s) == before


def test_bad_queries_and_unknown_trace(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, rt_template: Path
) -> None:
    s = tmp_path / "s"
    run(capsys, s, "ingest", str(rt_template))
    before = state(capsys, s)
    for args, message in [
        (("cypher", "MATCH (o:Op RETURN o"), "Cypher error"),
        (("sql", "SELEC 1"), "SQL error"),
        (("show", "nope"), "no trace named 'nope'"),
        (("critical-path", "nope"), "no trace named 'nope'"),
        (("export", "nope", "--out", str(tmp_path / "o")), "no trace named 'nope'"),
        (("rm", "nope"), "no trace named 'nope'"),
        (("cypher", "MATCH (o:Op) RETURN o", "--param", "oops"), "expected NAME=VALUE"),
    ]:
        code, _, err = run(capsys, s, *args)
        assert code == 1 and message in err and len(err.strip().splitlines()) == 1, (args, err)
    assert state(capsys, s) == before


def test_read_only_query_cannot_write(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, rt_template: Path
) -> None:
    s = tmp_path / "s"
    run(capsys, s, "ingest", str(rt_template))
    code, _, err = run(capsys, s, "sql", "DELETE FROM traces")  # ops is a view (by name) over trace_ops
    assert code == 1 and "read-only" in err.lower()
    assert json.loads(state(capsys, s)[1]) == [{"n": 8}]


def test_workload_generator_reproduces_the_shipped_example(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    shipped = Path(__file__).resolve().parents[2] / "examples" / "transformer_8r"
    code, out, _ = run(capsys, tmp_path / "s", "workload", "--out", str(tmp_path / "gen" / "transformer"))
    assert code == 0 and len(out.split()) == 9  # 8 ranks and the comm-group file
    for name in [*(f"transformer.{r}.et" for r in range(8)), "transformer.comm_groups.json"]:
        assert (tmp_path / "gen" / name).read_bytes() == (shipped / name).read_bytes()
    # integer pg_names for ASTRA-sim: dp0, dp1 (every 2nd rank), tp0..tp3 (rank pairs)
    groups = json.loads((tmp_path / "gen" / "transformer.comm_groups.json").read_text())
    pairs = {str(3 + k): [2 * k, 2 * k + 1] for k in range(4)}
    assert groups == {"1": [0, 2, 4, 6], "2": [1, 3, 5, 7], **pairs}
    code, _, err = run(capsys, tmp_path / "s", "workload", "--ranks", "6", "--tp", "4", "--ingest")
    assert code == 1 and "multiple of tp" in err and err.count("\n") == 1
    code, _, err = run(capsys, tmp_path / "s", "workload")
    assert code == 1 and "--out" in err


def test_exported_comm_groups_come_back_on_ingest(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The ASTRA-sim sidecar beside the rank files is read into the trace's groups, not taken
    for a rank file (the directory and the <dir>/<prefix> forms alike)."""
    code, _, _ = run(capsys, tmp_path / "s", "workload", "--out", str(tmp_path / "gen" / "transformer"))
    assert code == 0
    written = json.loads((tmp_path / "gen" / "transformer.comm_groups.json").read_text())
    for spec in (tmp_path / "gen", tmp_path / "gen" / "transformer"):
        trace = read_trace(spec)
        assert trace.num_ranks == 8 and dict(trace.params["comm_groups"]) == written
    (tmp_path / "gen" / "transformer.comm_groups.json").write_text('{"1": [0, "x"]}')
    code, _, err = run(capsys, tmp_path / "s", "ingest", str(tmp_path / "gen"))
    assert code == 1 and "comm_groups.json: group '1' must be a list of integer ranks" in err


def test_export_says_what_it_changed_for_astra_sim(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    s = tmp_path / "s"
    ddp = Path(__file__).resolve().parents[1] / "data" / "torch_ddp_2r"
    assert run(capsys, s, "ingest", str(ddp), "--name", "ddp")[0] == 0
    code, out, _ = run(capsys, s, "export", "ddp", "--out", str(tmp_path / "x" / "ddp"))
    assert code == 0
    assert out.splitlines()[1:] == [
        "changed for ASTRA-sim: dropped 6 METADATA_NODEs (ASTRA-sim aborts on them)",
        "changed for ASTRA-sim: 8 communication nodes recorded on a CPU thread written with is_cpu_op false "
        "(ASTRA-sim runs communication on the NPU's communication slot only)",
    ]
    code, out, _ = run(capsys, s, "export", "ddp", "--verbatim", "--out", str(tmp_path / "y" / "ddp"))
    assert code == 0 and "changed" not in out
    assert (
        read_trace(tmp_path / "y" / "ddp").num_ops == 670
        and read_trace(tmp_path / "x" / "ddp").num_ops == 664
    )
    code, _, err = run(
        capsys, s, "export", "ddp", "--verbatim", "--format", "json", "--out", str(tmp_path / "z")
    )
    assert code == 1 and "verbatim applies only to the et format" in err


def test_export_chrome_trace_writes_the_timeline_layout(tmp_path: Path) -> None:
    """`export --format chrome-trace` of a recording: rebased to its start, ranks as processes,
    as `etstore timeline` writes it (not the stored times by op type)."""
    import json

    store = ["--store", str(tmp_path / "s")]
    gloo = Path(__file__).resolve().parents[1] / "data" / "torch_ddp_cuda_gloo_2r"
    assert main([*store, "ingest", str(gloo), "--name", "g"]) == 0
    out = tmp_path / "g.json"
    assert main([*store, "export", "g", "--format", "chrome-trace", "--out", str(tmp_path / "g")]) == 0
    doc = json.loads(out.read_text())
    slices = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    assert min(e["ts"] for e in slices) == 0
    names = {
        e["args"]["name"] for e in doc["traceEvents"] if e.get("ph") == "M" and e["name"] == "thread_name"
    }
    assert any(n.startswith("stream ") for n in names) and any(n.startswith("thread ") for n in names)
