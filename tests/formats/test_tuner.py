"""Tuner trajectories (CSV, JSON lines): rows and values checked against the files' text."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from etstore.errors import TraceFormatError
from etstore.formats.tuner import TUNER_STEP_SCHEMA, is_tuner_log, read_tuner_log

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT / "examples" / "tuner" / "nccl_tuner_4r.csv"
JSONL = ROOT / "examples" / "tuner" / "rl_tuner_4r.jsonl"
NCCL_LOGS = sorted((ROOT / "tests" / "data" / "nccl_tests").glob("*"))

HEADER = "collective,size,nranks,algo,time_us\n"


def _write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------- the examples


def test_csv_example_rows_match_the_text() -> None:
    log = read_tuner_log(CSV)
    text = CSV.read_text().splitlines()
    # 14 lines: one comment, the header, 12 rows (counted in the file)
    assert (len(text), log.steps.num_rows, log.format, log.name) == (14, 12, "csv", "nccl_tuner_4r")
    assert log.steps.schema == TUNER_STEP_SCHEMA
    assert log.content_hash == hashlib.sha256(CSV.read_bytes()).hexdigest()
    assert log.fields[:4] == ("collective", "size", "nranks", "nnodes") and log.fields[-1] == "explore"
    rows = log.steps.to_pylist()
    assert [r["line"] for r in rows] == list(range(3, 15))
    assert [r["step"] for r in rows] == list(range(12))
    # line 11: allreduce,1048576,4,1,dgx-a-4g,Ring,Simple,8,131072,,180.0,8.738,0
    assert rows[8] == {
        "step": 8,
        "line": 11,
        "collective": "ALL_REDUCE",
        "size_bytes": 1048576,
        "ranks": 4,
        "nodes": 1,
        "topology": "dgx-a-4g",
        "gpu_model": None,
        "algorithm": "Ring",
        "protocol": "Simple",
        "channels": 8,
        "chunk_bytes": 131072,
        "algorithm_trace": None,
        "time_us": 180.0,
        "busbw_gb_per_s": 8.738,
        "reward": None,
        "extra": '{"explore": "0"}',
    }
    # line 13: the action names a stored algorithm instead of an algorithm
    assert (rows[10]["algorithm"], rows[10]["algorithm_trace"], rows[10]["time_us"]) == (
        None,
        "ring_allreduce_4r",
        175.0,
    )
    # line 14: NVLS without channels
    assert (rows[11]["algorithm"], rows[11]["channels"], rows[11]["extra"]) == (
        "NVLS",
        None,
        '{"explore": "1"}',
    )
    assert sum(r["time_us"] for r in rows) == 12 + 14 + 10 + 11 + 30 + 40 + 42 + 45 + 180 + 190 + 175 + 200


def test_jsonl_example_flattens_state_action_reward() -> None:
    log = read_tuner_log(JSONL)
    rows = log.steps.to_pylist()
    assert (log.format, len(rows)) == ("jsonl", 4)
    assert [r["line"] for r in rows] == [1, 2, 4, 5]  # line 3 is blank
    assert {r["collective"] for r in rows} == {"ALL_REDUCE"}  # "ncclFuncAllReduce"
    assert [r["size_bytes"] for r in rows] == [4096, 4096, 1048576, 1048576]
    assert [r["algorithm"] for r in rows] == ["Tree", "Ring", "Ring", "Tree"]
    assert [r["channels"] for r in rows] == [2, 2, 8, 8]
    assert [r["chunk_bytes"] for r in rows] == [None, None, 131072, None]
    assert [r["time_us"] for r in rows] == [9.5, 11.25, 182.0, 201.5]  # the last one is "time_ns": 201500
    assert [r["reward"] for r in rows] == [-9.5, -11.25, -182.0, -201.5]
    assert json.loads(rows[2]["extra"]) == {"episode": 1, "channels_available": 8, "epsilon": 0.25}
    assert "time_ns" in log.fields and "epsilon" in log.fields


def test_recognised_by_content(tmp_path: Path) -> None:
    assert is_tuner_log(CSV) and is_tuner_log(JSONL)
    renamed = tmp_path / "whatever.log"
    renamed.write_bytes(CSV.read_bytes())
    assert is_tuner_log(renamed)
    tabs = _write(tmp_path, "coll\tmessage_size\tproto\tlatency_us\nar\t8\tLL\t3.5\n", "t.tsv")
    assert is_tuner_log(tabs)
    assert read_tuner_log(tabs).steps.to_pylist()[0]["protocol"] == "LL"
    assert NCCL_LOGS and not any(is_tuner_log(p) for p in NCCL_LOGS)
    assert not is_tuner_log(ROOT / "examples" / "algorithms" / "ring_allreduce_4r.xml")
    assert not is_tuner_log(_write(tmp_path, "collective,size,time_us\nar,8,1.0\n"))  # no action
    assert not is_tuner_log(_write(tmp_path, '{"traceEvents": []}\n', "k.json"))
    quoted = _write(tmp_path, '"collective","size","algo","time"\n"ar","8","ring","1.5"\n', "q.csv")
    assert is_tuner_log(quoted) and read_tuner_log(quoted).steps["time_us"].to_pylist() == [1.5]
    big = _write(tmp_path, "collective,size,algo,time\nar,9007199254740993,ring,1\n", "big.csv")
    assert read_tuner_log(big).steps["size_bytes"].to_pylist() == [2**53 + 1]  # not rounded through a float
    assert not is_tuner_log(tmp_path)  # a directory
    assert not is_tuner_log(tmp_path / "absent.csv")


def test_aliases_nulls_and_time_ns(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "Collective,Message-Size,NRanks,Algo,Proto,Time_ns,Time_us,Note\n"
        "reduce_scatter,4096,8,pat,N/A,5000,4.5,first\n"
        "allgather,0,8,ring,,,2.0,\n",
    )
    rows = read_tuner_log(path).steps.to_pylist()
    assert [r["collective"] for r in rows] == ["REDUCE_SCATTER", "ALL_GATHER"]
    assert [r["protocol"] for r in rows] == [None, None]
    assert [r["time_us"] for r in rows] == [4.5, 2.0]  # time_us wins; time_ns is kept as an extra
    assert [json.loads(r["extra"]) for r in rows] == [
        {"Time_ns": "5000", "Note": "first"},
        {"Time_ns": "", "Note": ""},
    ]


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("collective,size,algo\nar,8,ring\n", r"t\.csv:1: the header has no 'time_us' column"),
        ("collective,size,time_us\nar,8,1\n", r"t\.csv:1: the header has no action column"),
        (
            "collective,size,size_bytes,algo,time\nar,8,8,ring,1\n",
            r"t\.csv:1: 'size' and 'size_bytes' both give",
        ),
        (HEADER + "ar,8,4,ring,1.0\nar,8,4,ring\n", r"t\.csv:3: 4 cells; the header on line 1 has 5"),
        (
            HEADER + "ar,-8,4,ring,1.0\n",
            r"t\.csv:2: field 'size_bytes': expected a non-negative integer, got '-8'",
        ),
        (HEADER + "ar,8.5,4,ring,1.0\n", r"t\.csv:2: field 'size_bytes': expected a non-negative integer"),
        (HEADER + "ar,8,0,ring,1.0\n", r"t\.csv:2: field 'ranks': expected a positive integer, got '0'"),
        (HEADER + "ar,8,4,ring,fast\n", r"t\.csv:2: field 'time_us': 'fast' is not a number"),
        (HEADER + "ar,8,4,ring,-1\n", r"t\.csv:2: field 'time_us': expected a time of at least 0"),
        (HEADER + "ar,8,4,ring,inf\n", r"t\.csv:2: field 'time_us': 'inf' is not a number"),
        (HEADER + "sendrecv,8,4,ring,1\n", r"t\.csv:2: field 'collective': collective 'sendrecv' is unknown"),
        (HEADER + "ar,8,4,ring,1\n,8,4,ring,1\n", r"t\.csv:3: field 'collective' is empty; it is required"),
        (HEADER + "ar,8,4,,1\n", r"t\.csv:2: no action: one of the fields algorithm, protocol"),
        ("# only a comment\n" + HEADER, r"t\.csv: no rows"),
        ("", r"t\.csv: no rows"),
    ],
)
def test_bad_csv(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(TraceFormatError, match=match):
        read_tuner_log(_write(tmp_path, text))


GOOD = '{"collective": "ar", "size": 8, "algorithm": "ring", "time_us": 1}'


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (GOOD + "\n[1, 2]\n", r"t\.jsonl:2: expected one JSON object per line, got list"),
        (GOOD + '\n{"collective": \n', r"t\.jsonl:2: not a JSON object"),
        (
            '{"size": 8, "state": {"size": 16}, "collective": "ar", "algo": "r", "time": 1}\n',
            r"key 'size' appears",
        ),
        (
            '{"collective": "ar", "size": true, "algorithm": "ring", "time_us": 1}\n',
            r"t\.jsonl:1: field 'size_bytes'",
        ),
        ('{"collective": "ar", "size": 8, "algorithm": "ring"}\n', r"t\.jsonl:1: field 'time_us' is empty"),
        ('{"collective": "ar", "size": 8, "channels": 0, "time_us": 1}\n', r"t\.jsonl:1: field 'channels'"),
    ],
)
def test_bad_jsonl(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(TraceFormatError, match=match):
        read_tuner_log(_write(tmp_path, text, "t.jsonl"))


def test_unreadable_and_not_utf8(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match=r"absent\.csv: cannot read"):
        read_tuner_log(tmp_path / "absent.csv")
    bad = tmp_path / "latin.csv"
    bad.write_bytes(HEADER.encode() + b"ar,8,4,r\xe9,1\n")
    # the header is 36 bytes, "ar,8,4,r" 8 more: the Latin-1 "é" is byte 44
    with pytest.raises(TraceFormatError, match=r"latin\.csv: byte 44: not UTF-8"):
        read_tuner_log(bad)
