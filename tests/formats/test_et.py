"""Reading and writing Chakra .et files against the real fixtures."""

from __future__ import annotations

import gzip
import threading
from pathlib import Path
from typing import Any

import networkx as nx
import pyarrow.compute as pc
import pytest

from etstore.errors import TraceFormatError
from etstore.formats import et, read_et, read_trace, write_et
from etstore.formats._frames import varint
from etstore.formats.files import resolve_rank_files
from etstore.model import decode_attrs
from etstore.proto import AttributeProto, Node


def test_pytorch_trace_counts_and_dangling_ctrl_deps(feeder: Path) -> None:
    t = read_et(feeder)
    assert t.num_ops == 3664
    assert t.num_missing == 1277
    assert set(t.missing["kind"].to_pylist()) == {"ctrl"}
    assert t.name == "feeder_tests_trace"
    # ids start at 216 and are not contiguous
    ids = t.ops["id"].to_pylist()
    assert min(ids) == 216 and max(ids) - min(ids) + 1 > len(ids)
    row = t.ops.slice(0, 1).to_pylist()[0]
    assert row["id"] == 216 and row["is_cpu_op"] is True and row["duration_micros"] == 318
    extra = decode_attrs(row["attrs"])
    assert extra["op_schema"].startswith("aten::flatten_dense_tensors") and extra["seq_id"] == -1


@pytest.mark.shared_files("**/*.et")
def test_every_fixture_round_trips_to_equal_messages(shared_file: Path, tmp_path: Path) -> None:
    path = shared_file
    t = read_et(path)
    (out,) = write_et(t, tmp_path / "x")
    original, written = path.read_bytes(), out.read_bytes()
    assert _messages(original) == _messages(written)
    again = read_et(out)
    assert again.ops.equals(t.ops) and again.deps.equals(t.deps) and again.missing.equals(t.missing)


def _messages(data: bytes) -> list[bytes]:
    """Each frame parsed and re-serialized deterministically (equal parsed messages)."""
    from etstore.formats._frames import varint

    out, pos, first = [], 0, True
    while pos < len(data):
        n, pos = varint(data, pos, Path("x"))
        frame = data[pos : pos + n]
        pos += n
        out.append(frame if first else Node.FromString(frame).SerializeToString(deterministic=True))
        first = False
    return out


def test_pytorch_trace_writes_back_byte_for_byte(feeder: Path, tmp_path: Path) -> None:
    (out,) = write_et(read_et(feeder), tmp_path / "f")
    assert out.read_bytes() == feeder.read_bytes()


def test_directory_of_ranks_and_gzip(rt_template: Path, tmp_path: Path) -> None:
    t = read_et(rt_template)
    assert t.ranks == list(range(8)) and t.num_ops == 8
    assert t.ops["comm_type"].to_pylist() == ["ALL_REDUCE"] * 8
    assert t.ops["comm_size"].to_pylist() == [1048576] * 8
    paths = write_et(t, tmp_path / "z" / "w", gzip_output=True)
    assert all(p.name.endswith(".et.gz") and p.read_bytes()[:2] == b"\x1f\x8b" for p in paths)
    again = read_trace(tmp_path / "z")
    assert again.ops.equals(t.ops)


def test_glob_and_prefix_specs(custom_allreduce: Path) -> None:
    by_glob = read_et(str(custom_allreduce / "custom_allreduce.*.et"))
    by_prefix = read_et(custom_allreduce / "custom_allreduce")
    assert by_glob.ops.equals(by_prefix.ops)
    assert by_glob.num_ranks == 8 and by_glob.num_ops == 8 * 35


def test_zero_length_node_is_not_eof(tmp_path: Path) -> None:
    body = b"\x00" + b"\x02\x08\x05"  # empty GlobalMetadata, then Node{} (0 bytes), then Node{id:5}
    zero = b"\x00"
    path = tmp_path / "z.0.et"
    path.write_bytes(body[:1] + zero + body[1:])
    t = read_et(path)
    assert t.ops["id"].to_pylist() == [0, 5]


def test_cycle_is_reported_not_fatal(feeder: Path) -> None:
    from etstore.dag import cycle_members

    t = read_et(feeder)
    g = nx.DiGraph()
    g.add_edges_from(zip(t.deps["src"].to_pylist(), t.deps["dst"].to_pylist(), strict=True))
    assert not nx.is_directed_acyclic_graph(g)  # the upstream trace really has cycles
    stuck = cycle_members(t)
    on_cycle = {n for c in nx.strongly_connected_components(g) if len(c) > 1 for n in c}
    on_cycle |= {s for s, d in g.edges if s == d}
    stuck_ids = set(pc.take(t.ops["id"], stuck.tolist()).to_pylist())
    assert on_cycle <= stuck_ids


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty file"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "PNG image"),
        (b"\x80\x80\x80\x80\x08" + b"x" * 10, "claims 2147483648 bytes"),
        (b"\x00\x05\x08\x01", "truncated"),
        (b"\x00\x80", "truncated frame length"),
        (b"\x00\x03\xff\xff\xff", "not a Chakra Node"),
    ],
)
def test_bad_files_raise_one_clear_error(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.0.et"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=message) as info:
        read_et(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_truncated_real_file_names_the_byte(feeder: Path, tmp_path: Path) -> None:
    path = tmp_path / "cut.0.et"
    path.write_bytes(feeder.read_bytes()[:100_000])
    with pytest.raises(TraceFormatError, match=r"cut\.0\.et: byte \d+: node frame \d+ claims"):
        read_et(path)


def test_corrupt_gzip(tmp_path: Path, feeder: Path) -> None:
    path = tmp_path / "c.0.et.gz"
    path.write_bytes(gzip.compress(feeder.read_bytes())[:5000])
    with pytest.raises(TraceFormatError, match="gzip"):
        read_et(path)


def test_directory_mixing_two_prefixes(tmp_path: Path, custom_allreduce: Path, rt_template: Path) -> None:
    for p in [*custom_allreduce.glob("*.et"), *rt_template.glob("*.et")]:
        (tmp_path / p.name).write_bytes(p.read_bytes())
    with pytest.raises(TraceFormatError, match="mixes traces with different prefixes"):
        resolve_rank_files(tmp_path)


def test_duplicate_rank_and_missing_path(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="no such file"):
        resolve_rank_files(tmp_path / "nothing")


def test_ids_out_of_topological_order(tmp_path: Path) -> None:
    from etstore.analysis import critical_path
    from etstore.model import Trace, deps_table, ops_table

    ops = ops_table(
        {
            "rank": [0, 0, 0],
            "id": [9, 3, 5],
            "name": ["c", "a", "b"],
            "type": ["COMP_NODE"] * 3,
            "duration_micros": [1, 2, 4],
        }
    )
    t = Trace(ops=ops, deps=deps_table(0, [3, 5], [5, 9]))  # a(3) → b(5) → c(9), written c first
    (path,) = write_et(t, tmp_path / "u")
    back = read_et(path)
    assert back.ops["id"].to_pylist() == [9, 3, 5] and back.num_missing == 0
    assert critical_path(back).path["name"].to_pylist() == ["a", "b", "c"]


# ------------------------------------------------ older Chakra: no GlobalMetadata frame


def _without_metadata(data: bytes) -> bytes:
    """The same file in the 2023 form: the first (GlobalMetadata) frame dropped."""
    length, pos = varint(data, 0, Path("x"))
    return data[pos + length :]


def test_old_form_reads_like_the_current_one(custom_allreduce: Path, tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.mkdir()
    for p in sorted(custom_allreduce.glob("*.et")):
        (old / p.name).write_bytes(_without_metadata(p.read_bytes()))
    current, legacy = read_et(custom_allreduce), read_trace(old)
    assert legacy.num_ops == current.num_ops == 8 * 35
    for name in ("ops", "deps", "missing"):
        assert getattr(legacy, name).equals(getattr(current, name)), name
    assert legacy.meta["metadata"].null_count == 8  # nothing was there to keep
    # export writes the current form, which reads back to the same ops
    write_et(legacy, tmp_path / "new" / "t")
    again = read_et(tmp_path / "new")
    assert again.ops.equals(current.ops) and again.deps.equals(current.deps)


def test_old_form_with_uint64_comm_size(tmp_path: Path) -> None:
    node = Node(
        id=0,
        name="all_reduce_4npus_1MB",
        type=7,  # COMM_COLL_NODE
        attr=[
            AttributeProto(name="is_cpu_op", bool_val=False),
            AttributeProto(name="comm_type", int64_val=0),
            AttributeProto(name="comm_size", uint64_val=1 << 20),
        ],
    ).SerializeToString()
    path = tmp_path / "ar.0.et"
    path.write_bytes(bytes([len(node)]) + node)  # one frame, no GlobalMetadata
    t = read_trace(path)
    row = t.ops.to_pylist()[0]
    assert (row["type"], row["comm_type"], row["comm_size"]) == ("COMM_COLL_NODE", "ALL_REDUCE", 1 << 20)
    assert row["attrs"] is None  # every attribute became a column
    (out,) = write_et(t, tmp_path / "back")
    data = out.read_bytes()
    written = Node.FromString(_without_metadata(data)[1:])
    assert written.attr[2].WhichOneof("value") == "uint64_val"  # the member it came in
    assert read_et(out).ops.equals(t.ops)


def test_small_inputs_decode_in_the_calling_thread_large_ones_on_workers_alike(
    custom_allreduce: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under PARALLEL_DECODE_BYTES the ranks decode in the caller's thread (no pool to start for
    an exported workload's small files), above it on worker threads: the same trace, and the
    same first error (the lowest bad rank's), either way."""
    threads: list[int] = []
    decode_file = et._decode_file

    def watched(path: Path, rank: int) -> Any:
        threads.append(threading.get_ident())
        return decode_file(path, rank)

    monkeypatch.setattr(et, "_decode_file", watched)
    monkeypatch.setattr(et.os, "cpu_count", lambda: 2)  # workers even on a one-core machine
    prefix = custom_allreduce / "custom_allreduce"
    assert sum(p.stat().st_size for p in custom_allreduce.glob("*.et")) < et.PARALLEL_DECODE_BYTES
    small = read_et(prefix)
    assert threads == [threading.get_ident()] * 8  # 8 ranks, each in this thread
    threads.clear()
    monkeypatch.setattr(et, "PARALLEL_DECODE_BYTES", 0)
    large = read_et(prefix)
    assert len(threads) == 8 and threading.get_ident() not in threads
    assert small.num_ops == 8 * 35 and small.ranks == list(range(8))  # the fixture's 8 files of 35 nodes
    for table in ("ops", "deps", "missing", "meta"):
        assert getattr(large, table).equals(getattr(small, table)), table
    for p in custom_allreduce.glob("*.et"):
        (tmp_path / p.name).write_bytes(p.read_bytes())
    for rank in (5, 3):
        (tmp_path / f"custom_allreduce.{rank}.et").write_bytes(b"\x00\x05\x08\x01")  # truncated
    for limit in (0, 1 << 30):  # on workers, then in this thread
        monkeypatch.setattr(et, "PARALLEL_DECODE_BYTES", limit)
        with pytest.raises(TraceFormatError, match=r"custom_allreduce\.3\.et: .*truncated"):
            read_et(tmp_path / "custom_allreduce")
