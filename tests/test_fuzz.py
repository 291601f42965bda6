"""Seeded fuzzing of every reader: mutated real files give a trace or one specific one-line error.

Each case takes a real input (a Chakra ``.et`` and JSON trace, MSCCL-IR XML, a PyTorch execution
trace, Kineto traces, an nccl-tests log, tuner logs in CSV and JSON lines, communicator groups),
mutates its bytes (truncate, flip, splice in another seed, duplicate or delete a stretch, insert
junk or invalid UTF-8, swap a number for a huge, negative or non-finite one or for a value
nested 150 to 5,000 lists deep, turn a name, category, phase, process or thread into a list or
an object, stack two of those, sometimes gzip the result) and reads it. The outcome must be a
trace (or log, or groups) or an :class:`~etstore.errors.EtstoreError` whose message is one line;
any other exception is a failure, reported with the seed and case number that reproduce it.
Traces that read are ingested (a sample in the default run) and the store must still agree
with itself: ``ls`` and SQL see the same traces, and a refused ingest leaves the count alone.

The default run is sized for CI: :data:`CI_CASES` (3,000) cases, ~30 s; ``-m slow`` runs
:data:`SLOW_CASES` (20,000) more.
"""

from __future__ import annotations

import gzip
import random
import re
import resource
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from etstore.errors import EtstoreError
from etstore.formats import read_trace
from etstore.formats.files import read_comm_groups
from etstore.formats.nccl_tests import read_nccl_tests
from etstore.formats.tuner import read_tuner_log
from etstore.store import EmbeddedStore

from .conftest import ROOT, SHARED

CI_CASES = 3000
SLOW_CASES = 20000
CI_INGESTS = 40  # ingests cost ~50 ms each; the slow run ingests every trace that reads
READ_MEMORY = 2 << 30  # address space a single read may add: a memory bomb fails, it cannot swap


@dataclass(frozen=True)
class Seed:
    """One real input: its format, bytes and the file name a mutant is written under."""

    kind: str
    data: bytes
    filename: str
    text: bool


def _gunzipped(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


_CUSTOM = SHARED / "astra-sim/examples/system/custom_collectives/custom_ring_allreduce_8npus_1MB"
_REDUCE_SCATTER = SHARED / "astra-sim/examples/workload/microbenchmarks/reduce_scatter/4npus_1MB"
_SEEDS = (  # (kind, file, name of the mutant, text format)
    ("et", _REDUCE_SCATTER / "reduce_scatter.0.et", "case.0.et", False),
    ("et", _CUSTOM / "custom_allreduce.0.et", "case.0.et", False),
    ("chakra-json", SHARED / "chakra/json_trace.small_chakra.0.json", "case.0.json", True),
    ("msccl-xml", _CUSTOM / "custom_allreduce.xml", "case.xml", True),
    ("pytorch-et", SHARED / "pytorch/hta/benchmark_simple_add_et.json.gz", "case_et.json", True),
    ("kineto", SHARED / "pytorch/hta/benchmark_simple_add_trace.json.gz", "case.pt.trace.json", True),
    ("nccl-tests", ROOT / "tests/data/nccl_tests/superbench_nccl_allreduce.log", "case.log", True),
    ("kineto", ROOT / "tests/data/pytorch_gloo/rank0_kineto.json.gz", "rank0.pt.trace.json", True),
    ("tuner", ROOT / "examples/tuner/nccl_tuner_4r.csv", "case.csv", True),
    ("tuner", ROOT / "examples/tuner/rl_tuner_4r.jsonl", "case.jsonl", True),
    ("comm-groups", ROOT / "examples/transformer_8r/transformer.comm_groups.json", "case.json", True),
)  # fmt: skip
_READERS: dict[str, Callable[[Path], Any]] = {  # what reads each kind; any other kind is a trace
    "nccl-tests": read_nccl_tests,
    "tuner": read_tuner_log,
    "comm-groups": read_comm_groups,
}


def seeds() -> list[Seed]:
    """The seeds whose files are present (the shared fixtures may be missing)."""
    return [Seed(k, _gunzipped(p), name, text) for k, p, name, text in _SEEDS if p.exists()]


# ---------------------------------------------------------------- mutations

_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?")
_HUGE = (
    b"99999999999999999999999",
    b"9223372036854775808",
    b"18446744073709551616",
    b"4294967296",
    b"2147483647",
    b"2000000000",
    b"-1",
    b"-9223372036854775809",
    b"1e400",
    b"NaN",
    b"Infinity",
    b"0",
    b"0.5",
    b"1" + b"0" * 400,  # past the float range
    b"1" + b"0" * 5000,  # past the digits Python converts
)
_DEPTHS = (150, 199, 201, 254, 600, 995, 5000)  # around the JSON depth limit and the encoders' limits
_FIELD = re.compile(rb'"(?:cat|name|ph|pid|tid)"\s*:\s*')
_STRING = re.compile(rb'"[^"\\]*"')
_ODD = (b"[]", b'["x"]', b"{}", b'{"a": 1}', b"[[1]]")
_BINARY_HUGE = (  # varints: 2^31, 2^63, a ten-byte maximum, an unterminated run
    b"\x80\x80\x80\x80\x08",
    b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
    b"\xff" * 12,
)
_JUNK = (b"\xff\xfe", b"\x00", b"\xc3\x28", b"<", b"{", b"[" * 64, b"]]]", b'"', b"&#0;", b"\xed\xa0\x80")


def _span(rng: random.Random, n: int) -> tuple[int, int]:
    i = rng.randrange(n + 1)
    return i, min(n, i + rng.choice((1, 2, 4, 16, 64, 512)))


def _mutate_once(rng: random.Random, data: bytes, seed: Seed, others: list[Seed]) -> tuple[str, bytes]:
    n = len(data)
    op = rng.choice(
        ("truncate", "flip", "splice", "duplicate", "delete", "junk", "number", "number", "nest", "odd")
    )
    if op == "truncate":
        return op, data[: rng.randrange(max(n, 1))]
    if op == "flip":
        out = bytearray(data)
        for _ in range(rng.choice((1, 1, 2, 8))):
            if out:
                out[rng.randrange(len(out))] ^= rng.randrange(1, 256)
        return op, bytes(out)
    if op == "splice":
        other = rng.choice(others).data
        i, _ = _span(rng, n)
        j, k = _span(rng, len(other))
        return op, data[:i] + other[j:k] + data[i:]
    if op == "duplicate":
        i, j = _span(rng, n)
        return op, data[:j] + data[i:j] * rng.choice((1, 2, 100)) + data[j:]
    if op == "delete":
        i, j = _span(rng, n)
        return op, data[:i] + data[j:]
    if op == "junk":
        i = rng.randrange(n + 1)
        return op, data[:i] + rng.choice(_JUNK) + data[i:]
    if op == "nest" and seed.text:  # a number swapped for lists or objects nested deep
        found = list(_NUMBER.finditer(data))
        if found:
            m, depth = rng.choice(found), rng.choice(_DEPTHS)
            deep = (
                b"[" * depth + b"]" * depth if rng.random() < 0.5 else b'{"a": ' * depth + b"1" + b"}" * depth
            )
            return op, data[: m.start()] + deep + data[m.end() :]
    if op == "odd" and seed.text:  # a field every reader hashes made a list or an object
        found = list(_FIELD.finditer(data))
        if found:
            m = rng.choice(found)
            value = _NUMBER.match(data, m.end()) or _STRING.match(data, m.end())
            end = value.end() if value else m.end()
            return op, data[: m.end()] + rng.choice(_ODD) + data[end:]
    if seed.text:  # a number swapped for a huge, negative or non-finite one
        found = list(_NUMBER.finditer(data))
        if found:
            m = rng.choice(found)
            return op, data[: m.start()] + rng.choice(_HUGE) + data[m.end() :]
    i = rng.randrange(n + 1)
    return op, data[:i] + rng.choice(_BINARY_HUGE) + data[i:]


def mutants(seed_value: int, count: int, pool: list[Seed]) -> Iterator[tuple[int, Seed, str, bytes]]:
    """``count`` cases ``(number, seed, what was done, bytes)``, the same for the same ``seed_value``."""
    rng = random.Random(seed_value)
    for case in range(count):
        seed = pool[case % len(pool)]
        ops, data = [], seed.data
        for _ in range(rng.choice((1, 1, 1, 2))):
            op, data = _mutate_once(rng, data, seed, pool)
            ops.append(op)
        if rng.random() < 0.05:
            data = gzip.compress(data, mtime=0)
            ops.append("gzip")
        yield case, seed, "+".join(ops), data


# ---------------------------------------------------------------- running the cases


def _bounded(read: Callable[[], Any]) -> Any:
    """``read()`` with the address space capped a little above what the process holds now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        used = int(f.read().split()[0]) * resource.getpagesize()
    cap = used + READ_MEMORY
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        return read()
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _store_agrees(store: EmbeddedStore) -> tuple[int, bool]:
    """Traces ``ls`` lists, and whether SQL's ops table holds exactly those with ops."""
    listed = {t.name: t.ops for t in store.traces()}
    rows = store.sql("SELECT DISTINCT trace FROM ops").to_arrow()
    in_sql = set(rows.column(0).to_pylist())
    return len(listed), in_sql == {name for name, ops in listed.items() if ops}


def run_cases(
    seed_value: int, count: int, tmp: Path, store: EmbeddedStore, max_ingests: int
) -> tuple[list[str], dict[str, int]]:
    """Run ``count`` cases; returns the failures (one line each) and outcome counts per kind."""
    pool = seeds()
    if not pool:
        pytest.skip("no fuzz seeds: ../shared/fixtures is missing")
    failures: list[str] = []
    tally: dict[str, int] = {}
    ingests = 0
    for case, seed, ops, data in mutants(seed_value, count, pool):
        where = f"seed {seed_value} case {case} ({seed.kind}: {ops})"
        path = tmp / f"{case}" / seed.filename
        path.parent.mkdir()
        path.write_bytes(data)
        reader = partial(_READERS.get(seed.kind, read_trace), path)
        try:
            result = _bounded(reader)
        except EtstoreError as exc:
            message = str(exc)
            if not message or "\n" in message:
                failures.append(f"{where}: {type(exc).__name__} message is not one line: {message[:200]!r}")
            tally[f"{seed.kind} refused"] = tally.get(f"{seed.kind} refused", 0) + 1
            continue
        except Exception as exc:  # any other exception is what this test looks for
            failures.append(
                f"{where}: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            )
            continue
        tally[f"{seed.kind} read"] = tally.get(f"{seed.kind} read", 0) + 1
        if seed.kind in _READERS or ingests >= max_ingests:
            continue
        ingests += 1
        before, _ = _store_agrees(store)
        try:
            report = store.ingest(result, name=f"fuzz-{case}")
        except EtstoreError as exc:
            after, agrees = _store_agrees(store)
            if after != before or not agrees or "\n" in str(exc):
                failures.append(
                    f"{where}: refused ingest changed the store ({before} → {after} traces): {exc}"
                )
            continue
        except Exception as exc:  # the same: a raw exception from the store
            failures.append(f"{where}: ingest raised {type(exc).__name__}: {str(exc)[:200]}")
            continue
        after, agrees = _store_agrees(store)
        if after != before + int(report.created) or not agrees:
            failures.append(
                f"{where}: ingest left {after} traces (from {before}); ls and SQL agree: {agrees}"
            )
    return failures, tally


def test_mutations_are_deterministic() -> None:
    pool = seeds()
    if not pool:
        pytest.skip("no fuzz seeds: ../shared/fixtures is missing")
    first = [(c, s.kind, o, d) for c, s, o, d in mutants(7, 50, pool)]
    assert first == [(c, s.kind, o, d) for c, s, o, d in mutants(7, 50, pool)]
    assert len({d for *_, d in first}) > 40  # and they differ from each other


def test_fuzzed_inputs_read_or_fail_in_one_line(tmp_path: Path) -> None:
    with EmbeddedStore(tmp_path / "store") as store:
        failures, tally = run_cases(20261124, CI_CASES, tmp_path, store, CI_INGESTS)
    assert not failures, f"{len(failures)} of {CI_CASES} cases failed:\n" + "\n".join(failures[:40])
    # every kind both read and refused something: the mutations reach past the first byte check
    kinds = {key.rsplit(" ", 1)[0] for key in tally}
    assert all(tally.get(f"{k} refused", 0) > 0 for k in kinds), tally


@pytest.mark.slow
def test_fuzzed_inputs_many_more(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("opt-in: pytest -m slow tests/test_fuzz.py")
    with EmbeddedStore(tmp_path / "store") as store:
        failures, _ = run_cases(1, SLOW_CASES, tmp_path, store, SLOW_CASES)
    assert not failures, f"{len(failures)} of {SLOW_CASES} cases failed:\n" + "\n".join(failures[:100])
