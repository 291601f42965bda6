"""One line and a non-zero exit instead of a traceback (issue 35, round 2, item 6).

Deep JSON that passed the old 1,000-level check still broke later steps (orjson encodes at
most 254 levels; the standard decoder and ``repr`` recurse within the interpreter's limit), a
list where Kineto writes a string was unhashable, a rank past 2^31 in a file name overflowed
its int32 column, a workload shape overflowed int64, a deeply nested ``--param`` exhausted the
recursion limit, and a Ctrl-C while ``etstore.cli`` imported its first module was a traceback.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from etstore.cli import main
from etstore.errors import ConfigError, EtstoreError, TraceFormatError
from etstore.formats import read_trace
from etstore.formats.files import read_comm_groups, resolve_rank_files
from etstore.formats.tuner import is_tuner_log, read_tuner_log

ROOT = Path(__file__).resolve().parents[1]
GLOO = ROOT / "tests/data/pytorch_gloo"
DEPTHS = (250, 600, 995)  # past orjson's encoder, and just under the interpreter's recursion limit


def _lists(depth: int) -> str:
    return "[" * depth + "]" * depth


def _objects(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def _kineto() -> dict:
    return json.loads(gzip.decompress((GLOO / "rank0_kineto.json.gz").read_bytes()))


def _first_op(doc: dict) -> dict:
    return next(e for e in doc["traceEvents"] if e.get("ph") == "X")


def _deep_inputs(tmp_path: Path, depth: int) -> dict[str, Path]:
    """A tuner log, a Kineto trace, a PyTorch execution trace and communicator groups, each with
    one value ``depth`` levels deep where the format allows any JSON."""
    paths: dict[str, Path] = {}
    row = {"collective": "allreduce", "size": 8, "time_us": 1, "algo": "ring", "x": "@"}
    paths["tuner"] = tmp_path / f"tuner{depth}.jsonl"
    paths["tuner"].write_text(json.dumps(row).replace('"@"', _lists(depth)) + "\n")
    doc = _kineto()
    _first_op(doc)["args"]["deep"] = "@"
    paths["kineto"] = tmp_path / f"k{depth}" / "rank0.pt.trace.json"
    paths["kineto"].parent.mkdir()
    paths["kineto"].write_text(json.dumps(doc).replace('"@"', _objects(depth)))
    et = json.loads(gzip.decompress((GLOO / "rank0_et.json.gz").read_bytes()))
    et["nodes"][3]["attrs"].append({"name": "deep", "type": "string", "value": "@"})
    paths["pytorch-et"] = tmp_path / f"e{depth}" / "rank0_et.json"
    paths["pytorch-et"].parent.mkdir()
    paths["pytorch-et"].write_text(json.dumps(et).replace('"@"', _lists(depth)))
    paths["groups"] = tmp_path / f"g{depth}.comm_groups.json"
    paths["groups"].write_text('{"0": ' + _lists(depth) + "}")
    return paths


@pytest.mark.parametrize("depth", DEPTHS)
def test_deep_json_in_every_reader_is_one_line(tmp_path: Path, depth: int) -> None:
    paths = _deep_inputs(tmp_path, depth)
    assert not is_tuner_log(paths["tuner"])  # the sniffer says no rather than raise
    for kind, read in (
        ("tuner", read_tuner_log),
        ("kineto", read_trace),
        ("pytorch-et", read_trace),
        ("groups", read_comm_groups),
    ):
        with pytest.raises(EtstoreError) as err:
            read(paths[kind])
        assert "\n" not in str(err.value) and "nested" in str(err.value), (kind, str(err.value)[:300])
        assert isinstance(err.value, ConfigError if kind == "groups" else TraceFormatError), kind


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "etstore.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


@pytest.mark.parametrize("depth", DEPTHS)
def test_ingest_of_deep_json_is_one_line(tmp_path: Path, depth: int) -> None:
    paths = _deep_inputs(tmp_path, depth)
    for kind in ("tuner", "kineto", "pytorch-et"):
        run = _cli("--store", str(tmp_path / "s"), "ingest", str(paths[kind]))
        assert run.returncode == 1, (kind, run.stderr[-2000:])
        assert run.stderr.count("\n") == 1 and run.stderr.startswith("etstore: error: "), (
            kind,
            run.stderr[-2000:],
        )


@pytest.mark.parametrize("field", ["cat", "name", "ph", "pid", "tid"])
def test_kineto_fields_that_are_lists_or_objects_are_named(tmp_path: Path, field: str) -> None:
    doc = _kineto()
    at = doc["traceEvents"].index(_first_op(doc))
    _first_op(doc)[field] = ["cpu_op"] if field != "tid" else {"x": 1}
    alone = tmp_path / "rank0.pt.trace.json"
    alone.write_text(json.dumps(doc))
    pair = tmp_path / "pair"
    pair.mkdir()
    (pair / "rank0_et.json.gz").write_bytes((GLOO / "rank0_et.json.gz").read_bytes())
    (pair / "rank0_kineto.json").write_text(json.dumps(doc))
    got = "an object" if field == "tid" else "a list"
    for spec, where in ((alone, alone), (pair, pair / "rank0_kineto.json")):
        with pytest.raises(
            TraceFormatError,
            match=rf"^{re.escape(str(where))}: traceEvents\[{at}\]: '{field}' must be a string "
            rf"or a number, got {got}$",
        ):
            read_trace(spec)


def test_ranks_past_int32_in_file_names_are_refused(tmp_path: Path) -> None:
    et = tmp_path / "w.2147483648.et"
    et.write_bytes(b"\x00")
    with pytest.raises(
        TraceFormatError, match=r"w\.2147483648\.et: rank 2147483648 in the file name is past the largest"
    ):
        resolve_rank_files(et)
    long = tmp_path / ("x." + "9" * 30 + ".et")  # more digits than an int converts cheaply
    long.write_bytes(b"\x00")
    with pytest.raises(TraceFormatError, match=r"rank 99999999999999999\.\.\. in the file name"):
        resolve_rank_files(long)
    torch = tmp_path / "rank2147483648_et.json.gz"
    torch.write_bytes((GLOO / "rank0_et.json.gz").read_bytes())
    with pytest.raises(
        TraceFormatError, match=r"rank2147483648_et\.json\.gz: rank 2147483648 in the file name"
    ):
        read_trace(torch)
    stamped = tmp_path / "trace_1694128201545.pt.trace.json.gz"  # a timestamp is no rank: rank 0
    stamped.write_bytes((GLOO / "rank0_kineto.json.gz").read_bytes())
    assert read_trace(stamped).num_ranks == 1


def test_huge_numbers_in_a_tuner_log_are_one_line(tmp_path: Path) -> None:
    cases = {
        "size.csv": "collective,size,time_us,algo\nallreduce,1" + "0" * 5000 + ",1,ring\n",
        "channels.csv": "collective,size,time_us,algo,channels\nallreduce,8,1,ring," + "9" * 30 + "\n",
        "time.jsonl": '{"collective": "allreduce", "size": 8, "time_us": 1e400, "algo": "ring"}\n',
        "ranks.jsonl": '{"collective": "allreduce", "size": 8, "time_us": 1, "algo": "ring", "nranks": 3'
        + "0" * 9
        + "}",
        "size.jsonl": '{"collective": "allreduce", "size": 1' + "0" * 400 + ', "time_us": 1, "algo": "ring"}',
        "time400.jsonl": '{"collective": "allreduce", "size": 8, "time_us": 1'
        + "0" * 400
        + ', "algo": "ring"}',
        "digits.jsonl": '{"collective": "allreduce", "size": 1'
        + "0" * 5000
        + ', "time_us": 1, "algo": "ring"}\n',
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(TraceFormatError) as err:
            read_tuner_log(path)
        assert "\n" not in str(err.value) and len(str(err.value)) < 400, name


def test_option_values_that_overflow_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = ["--store", str(tmp_path / "s")]
    cases = [
        (
            ["workload", "--hidden", "2147483648", "--out", str(tmp_path / "w")],
            "workload: --hidden 2,147,483,648",
        ),
        (["workload", "--seed", "-1", "--out", str(tmp_path / "w")], "workload: --seed must be at least 0"),
        (["sql", "SELECT 1", "--param", "x=" + _lists(5000)], "--param x: the value nests more than 200"),
        (["cypher", "RETURN 1", "--param", "x=" + _objects(300)], "--param x: the value nests more than 200"),
    ]
    for args, message in cases:
        code = main([*store, *args])
        err = capsys.readouterr().err
        assert code == 1 and err.count("\n") == 1 and err.startswith(f"etstore: error: {message}"), err[
            -2000:
        ]


def test_ctrl_c_while_the_cli_imports_its_first_module(tmp_path: Path) -> None:
    """A SIGINT delivered while ``etstore.cli`` imports etstore's own modules (the handler went in
    after them) ends in ``etstore: interrupted`` and 130: the console script, made to interrupt
    itself at that import so that the timing is exact."""
    script = tmp_path / "etstore"  # argv[0] names the console script: the handler is for it only
    script.write_text(
        "import os, signal, sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'etstore.pandas_gate':\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "from etstore.cli import main\n"
        "sys.exit(main())\n"
    )
    run = subprocess.run(
        [sys.executable, str(script), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert (run.returncode, run.stderr) == (130, "etstore: interrupted\n"), run.stderr[-2000:]


@pytest.mark.parametrize("url", ["neo4j://[::1", "bolt://[x]:1", "neo4j://u:secret@[::1/db"])
def test_a_malformed_neo4j_url_is_one_line_without_its_password(url: str) -> None:
    from etstore.errors import StoreError
    from etstore.store._neo4j_target import parse_url

    with pytest.raises(StoreError, match=r"not a valid store URL|bad host or port") as err:
        parse_url(url, env={})
    assert "secret" not in str(err.value) and "\n" not in str(err.value)
