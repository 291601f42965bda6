"""Deeply nested JSON (etstore/formats/_frames.py check_json_depth, load_json): refused in one line.

JSON decoders recurse once per level of nesting: the standard library's raises RecursionError,
orjson's object decoder overflows the C stack (a segmentation fault), and a decoded 100,000-deep
list still breaks whatever walks it later. Every JSON trace form etstore reads nests a few
levels, so the bytes are scanned first and anything deeper than 200 levels is a
TraceFormatError naming the file and the byte. The ingest cases run the CLI in a subprocess, as
a user would, because the old failure was a crash of the interpreter.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from etstore.errors import TraceFormatError
from etstore.formats._frames import MAX_JSON_DEPTH, check_json_depth, load_json

ROOT = Path(__file__).resolve().parents[2]
DEEP = 100_000


def test_100000_nested_lists_are_refused_before_decoding(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * DEEP + "]" * DEEP)
    with pytest.raises(TraceFormatError) as err:
        load_json(path)
    assert str(err.value) == (
        f"{path}: byte 200: JSON nested more than 200 lists and objects deep (100,000 at its "
        "deepest); no trace format etstore reads nests that deep"
    )


def test_the_limit_itself_and_brackets_inside_strings(tmp_path: Path) -> None:
    assert MAX_JSON_DEPTH == 200
    at_limit = tmp_path / "limit.json"
    at_limit.write_text('{"a": ' + "[" * 199 + "]" * 199 + "}")
    inner, levels = load_json(at_limit)["a"], 1
    while inner:
        inner, levels = inner[0], levels + 1
    assert levels == 199  # 200 deep with the object: decoded
    # brackets inside strings do not nest, escaped quotes do not end a string, an escaped
    # backslash before a quote does
    texts = {
        '{"name": "' + "[" * 5000 + '"}': 1,
        '{"name": "\\"' + "{" * 5000 + '"}': 1,
        '["\\\\", ' + "[" * 1000 + "]" * 1000 + "]": 1001,
        '["\\\\\\"]' + "[" * 1000 + '", 1]': 1,
    }
    for text, depth in texts.items():
        orjson.loads(text)  # each is valid JSON
        check_json_depth(text.encode(), "t", limit=depth)
        if depth > 1:
            with pytest.raises(
                TraceFormatError, match=rf"^t: byte \d+: JSON nested more than {depth - 1:,} "
            ):
                check_json_depth(text.encode(), "t", limit=depth - 1)


def _depth(text: str) -> int:
    """The nesting depth of JSON text, one character at a time (the reference)."""
    depth = most = 0
    inside = escaped = False
    for ch in text:
        if inside:
            escaped, inside = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            inside = True
        elif ch in "[{":
            depth += 1
            most = max(most, depth)
        elif ch in "]}":
            depth -= 1
    return most


def test_the_scan_agrees_with_a_reading_one_character_at_a_time() -> None:
    rng = random.Random(7)
    pieces = ["[", "]", "{", "}", '"', "\\", "a", "é", "[[", "]]", '\\"', "\\\\"]

    def value(level: int) -> Any:
        roll = rng.random()
        if level > 10 or roll < 0.3:
            return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 5)))
        if roll < 0.65:
            return [value(level + 1) for _ in range(rng.randint(0, 3))]
        return {"".join(rng.choice(pieces) for _ in range(3)): value(level + 1) for _ in range(3)}

    for _ in range(500):
        text = json.dumps(value(0), ensure_ascii=rng.random() < 0.5)
        depth = _depth(text)
        check_json_depth(text.encode(), "t", limit=depth)
        if depth:
            with pytest.raises(TraceFormatError):
                check_json_depth(text.encode(), "t", limit=depth - 1)


def _nested_lists() -> str:
    return "[" * DEEP + "]" * DEEP


def _nested_objects() -> str:
    return '{"a": ' * DEEP + "1" + "}" * DEEP


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        # a Kineto trace as PyTorch writes it (one key a line): orjson crashed on the objects
        (
            "objects.pt.trace.json",
            '{\n"traceEvents": [\n' + _nested_objects() + "]}\n",
            "byte 1207: JSON nested",
        ),
        ("lists.pt.trace.json", '{\n"traceEvents": ' + _nested_lists() + "\n}\n", "byte 216: JSON nested"),
        # all on one line: the tuner-log sniff decoded it first
        ("one_line.json", '{"traceEvents": ' + _nested_lists() + "}", "byte 215: JSON nested"),
        # small enough to be checked whole by the format sniff
        ("small.json", '{"a": ' * 5000 + "1" + "}" * 5000, "byte 1200: JSON nested"),
        # a tuner trajectory (JSON lines) whose second line nests too deeply
        (
            "steps.jsonl",
            '{"collective": "allreduce", "size": 1, "time": 2, "algorithm": "ring"}\n'
            + '{"a": ' * 5000
            + "1"
            + "}" * 5000
            + "\n",
            ":2: not a JSON object",
        ),
    ],
    ids=["kineto-objects", "kineto-lists", "one-line", "small", "tuner-jsonl"],
)
def test_ingest_of_deeply_nested_json_is_one_line(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    run = subprocess.run(
        [sys.executable, "-m", "etstore.cli", "--store", str(tmp_path / "s"), "ingest", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert run.returncode == 1, run.stderr[-2000:]
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert re.match(rf"etstore: error: {re.escape(str(path))}\S*: ", run.stderr)
    assert message in run.stderr
