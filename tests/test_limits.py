"""Upfront limits: what an input declares (sizes, frame counts, ranks) is checked against the memory
budget before anything is allocated, and the refusal is one line naming the limit and its knob."""

from __future__ import annotations

import gzip
import time
import zlib
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import pytest

from etstore.algorithms import generators
from etstore.algorithms.generators import GENERATORS, generate
from etstore.errors import OptionError, StoreError, TopologyError, TraceFormatError, UnsatisfiableError
from etstore.formats import read_et
from etstore.formats._frames import read_bytes, write_varint
from etstore.formats.et import _decode_py, decode_rank
from etstore.store import open_store
from etstore.topology import Topology
from etstore.units import MAX_SIZE, format_bytes, memory_budget, parse_size
from etstore.workloads import transformer

KNOB = r"set the environment variable ETSTORE_MEMORY_BUDGET"


@pytest.fixture
def budget(monkeypatch: pytest.MonkeyPatch) -> object:
    """``budget("1GiB")`` sets the memory budget for this test."""

    def set_budget(size: str) -> None:
        monkeypatch.setenv("ETSTORE_MEMORY_BUDGET", size)

    return set_budget


# ---------------------------------------------------------------- sizes and the budget


def test_sizes_stop_at_int64() -> None:
    assert parse_size(str(MAX_SIZE)) == 2**63 - 1 and parse_size("7EiB") == 7 << 60
    with pytest.raises(UnsatisfiableError, match=r"size '8EiB' is larger than the largest supported size"):
        parse_size("8EiB")
    with pytest.raises(UnsatisfiableError, match=r"'99999999999999999999999' is larger than"):
        parse_size("99999999999999999999999")
    with pytest.raises(UnsatisfiableError, match=r"^not a size: '1{60}'"):
        parse_size("1" * 5000)  # not a 5000-digit Fraction


def test_budget_comes_from_the_environment(budget: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ETSTORE_MEMORY_BUDGET", raising=False)
    assert 1 << 30 <= memory_budget() <= 8 << 30
    budget("64GiB")  # type: ignore[operator]
    assert memory_budget() == 64 << 30
    budget("lots")  # type: ignore[operator]
    with pytest.raises(UnsatisfiableError, match=r"^ETSTORE_MEMORY_BUDGET: not a size: 'lots'"):
        memory_budget()
    assert [format_bytes(x) for x in (512, 1536, 512 << 30, 8 << 40)] == [
        "512 B",
        "1.5 KiB",
        "512 GiB",
        "8 TiB",
    ]


# ---------------------------------------------------------------- topologies


def test_huge_built_in_shapes_are_described_by_closed_forms(budget: object) -> None:
    budget("1GiB")  # type: ignore[operator]
    ring = Topology.from_spec("ring:1048576").describe()  # the advertised maximum
    assert (ring["npus"], ring["links"], ring["diameter_hops"], ring["connected"]) == (
        1 << 20,
        2 << 20,
        1 << 19,
        True,
    )
    torus = Topology.from_spec("torus3d:64x64x64").describe()
    # 3 rings of 64: 32 hops each; bisection cuts one ring axis twice on each of 64 x 64 rings
    assert (torus["diameter_hops"], torus["bisection_bandwidth_gb_per_s"]) == (96, 2 * 64 * 64 * 50.0)


@pytest.mark.parametrize(
    "spec",
    ["mesh2d:4x5", "torus2d:4x6", "ring:7", "uniring:5", "fc:4+ring:6", "hypercube:16", "switch:4+mesh:3"],
)
def test_closed_form_diameter_matches_the_breadth_first_search(spec: str) -> None:
    t = Topology.from_spec(spec)
    bfs = Topology.from_links(t.num_npus, list(zip(t.src.tolist(), t.dst.tolist(), strict=True)))
    assert t.is_regular() and not bfs.is_regular()
    assert t.diameter == int(bfs.hop_distances().max()) == bfs.diameter


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "fc:1048576",
            r"^topology spec 'fc:1048576': topology fc:1048576,bw=50,lat=500: building its 1,099,510,579,200 "
            rf"links needs about 96\.0 TiB, more than the memory budget of 1 GiB \({KNOB}",
        ),
        # int32 hops + three bitsets of N/8 + in-neighbour bits E/N = 2 per NPU: 4.625 B per pair
        ("ring:65536,fail=3", rf"the 65,535 x 65,535 hop-distance table needs about 18\.5 GiB, .*\({KNOB}"),
    ],
)
def test_topologies_over_budget_are_refused_upfront(budget: object, spec: str, message: str) -> None:
    budget("1GiB")  # type: ignore[operator]
    start = time.perf_counter()
    with pytest.raises(TopologyError, match=message):
        Topology.from_spec(spec).describe()
    assert time.perf_counter() - start < 10


# ---------------------------------------------------------------- generators and workloads


def test_generator_estimates_bound_the_real_op_counts() -> None:
    for name, info in GENERATORS.items():
        for coll in info.collectives:
            for ranks, chunks in ((4, 3), (8, 1), (16, 2), (32, 1)):
                ops = generate(name, coll=coll, ranks=ranks, chunks=chunks).num_ops
                assert ops <= generators._OPS_ESTIMATE[name](ranks, chunks), (name, coll, ranks, chunks)


def test_generators_over_budget_are_refused_upfront(budget: object) -> None:
    budget("64MiB")  # type: ignore[operator]
    with pytest.raises(OptionError, match=rf"the ring allreduce over 100,000 ranks .*\({KNOB}"):
        generate("ring", coll="allreduce", ranks=100_000, chunks=100_000)
    # 5 * 64^2 * 64 = 1,310,720 ops at 700 B: 875 MiB > 64 MiB; a small one still builds
    with pytest.raises(OptionError, match=r"about 1,310,720 ops\) needs about 875 MiB"):
        generate("ring", coll="allreduce", ranks=64, chunks=64)
    small = generate("ring", coll="allreduce", ranks=8, chunks=2)
    # per channel 2(N-1) sends per rank: 8 · 2 · 14 = 224 sends
    assert small.ops["type"].to_pylist().count("COMM_SEND_NODE") == 224


def test_workloads_over_budget_are_refused_upfront(budget: object) -> None:
    assert transformer(ranks=64, layers=16).num_ops <= 64 * (8 * 16 + 4)  # the estimate bounds it
    budget("1GiB")  # type: ignore[operator]
    with pytest.raises(
        OptionError, match=rf"^transformer: 100,000 ranks x 1,000 layers needs about .*\({KNOB}"
    ):
        transformer(ranks=100_000, layers=1000)


# ---------------------------------------------------------------- .et frames and gzip bombs


def _zeros_gz(path: Path, mib: int) -> Path:
    """A gzip of ``mib`` MiB of zero bytes: one empty GlobalMetadata and empty node frames."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    path.write_bytes(b"".join(z.compress(bytes(1 << 20)) for _ in range(mib)) + z.flush())
    return path


def test_gzip_bomb_stops_at_the_decompressed_limit(tmp_path: Path, budget: object) -> None:
    bomb = _zeros_gz(tmp_path / "bomb.0.et.gz", 200)
    assert bomb.stat().st_size < 250_000  # ~1000:1
    budget("64MiB")  # type: ignore[operator]
    start = time.perf_counter()
    with pytest.raises(
        TraceFormatError, match=rf"bomb\.0\.et\.gz: decompresses to more than 32 MiB, .*\({KNOB}"
    ):
        read_bytes(bomb)
    assert time.perf_counter() - start < 5
    # as a trace, its frames are counted while it inflates: refused long before 32 MiB
    with pytest.raises(TraceFormatError, match=r"bomb\.0\.et\.gz: at least 209,716 node frames, more than"):
        read_et(bomb)


def test_too_many_frames_are_refused_before_decoding(tmp_path: Path, budget: object) -> None:
    bomb = _zeros_gz(tmp_path / "bomb.0.et.gz", 64)  # 1 metadata frame + 67,108,863 empty nodes
    budget("1GiB")  # type: ignore[operator]  # 512 MiB of bytes may be read, 3,355,443 nodes decoded
    with pytest.raises(
        TraceFormatError, match=rf"at least 3,355,444 node frames, more than the 3,355,443 .*\({KNOB}"
    ):
        read_et(bomb)
    budget("16MiB")  # type: ignore[operator]
    data = bytes(100_000)
    # the reference decoder counts as it goes
    with pytest.raises(
        TraceFormatError, match=r"p: byte 52429: at least 52,429 node frames, more than the 52,428"
    ):
        _decode_py(data, 0, Path("p"))
    with pytest.raises(TraceFormatError, match=r"99,999 node frames, more than the 52,428"):
        decode_rank(data, 0, Path("p"))


def test_plain_file_over_the_limit_is_refused_by_its_size(tmp_path: Path, budget: object) -> None:
    path = tmp_path / "big.0.et"
    path.write_bytes(bytes(3 << 20))
    budget("4MiB")  # type: ignore[operator]
    with pytest.raises(TraceFormatError, match=rf"big\.0\.et: holds 3 MiB, more than 2 MiB, .*\({KNOB}"):
        read_bytes(path)


def test_frame_lengths_beyond_the_file(tmp_path: Path) -> None:
    path = tmp_path / "f.0.et"
    path.write_bytes(write_varint(0) + write_varint(500) + b"\x08\x01")
    with pytest.raises(TraceFormatError, match=r"byte 1: node frame 1 claims 500 bytes but only 2 remain"):
        read_et(path)


def test_multi_member_and_truncated_gzip(tmp_path: Path) -> None:
    path = tmp_path / "m.gz"
    path.write_bytes(gzip.compress(b"ab") + gzip.compress(b"cd"))
    assert read_bytes(path, sniff=False) == b"abcd"
    path.write_bytes(gzip.compress(bytes(np.arange(4096, dtype=np.uint8)))[:-20])
    with pytest.raises(TraceFormatError, match=r"m\.gz: truncated gzip stream"):
        read_bytes(path)
    path.write_bytes(b"\x1f\x8b\x08\x00garbage-garbage")
    with pytest.raises(TraceFormatError, match=r"m\.gz: corrupt gzip stream"):
        read_bytes(path)


# ---------------------------------------------------------------- Neo4j lockout


def test_neo4j_lockout_is_named(neo4j_url: str) -> None:
    parts = urlsplit(neo4j_url)
    user = parts.username or "neo4j"
    wrong = urlunsplit(parts._replace(netloc=f"{user}:wrong-password@{parts.hostname}:{parts.port or 7687}"))
    messages = []
    for _ in range(6):  # Neo4j locks the account after 3 failures (dbms.security.auth_max_failed_attempts)
        with pytest.raises(StoreError) as info:
            open_store(wrong)
        messages.append(str(info.value))
    try:
        assert "refused the credentials" in messages[0]
        assert any("has locked the account after too many wrong passwords" in m for m in messages)
        assert not any("cannot reach" in m for m in messages)
    finally:
        time.sleep(6)  # the lock (5 s by default) also holds the right password out: let it expire
