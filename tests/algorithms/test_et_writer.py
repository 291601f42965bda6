"""Algorithm trace → per-rank .et in the collectiveapi convention ASTRA-sim's custom collectives run."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from etstore.algorithms import generate
from etstore.errors import UnsatisfiableError
from etstore.formats import message_sizes, write_algorithm_et
from etstore.formats._frames import varint
from etstore.formats.et import read_et
from etstore.formats.msccl_xml import read_msccl_xml
from etstore.model import CHUNK_COLUMNS
from etstore.proto import GlobalMetadata, Node
from etstore.units import parse_size


def frames(path: Path) -> list[bytes]:
    data = path.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        n, pos = varint(data, pos, path)
        out.append(data[pos : pos + n])
        pos += n
    return out


def test_custom_allreduce_export_matches_upstream(tmp_path: Path, custom_allreduce: Path) -> None:
    base = custom_allreduce
    trace = read_msccl_xml(base / "custom_allreduce.xml")
    paths = write_algorithm_et(trace, tmp_path / "custom_allreduce", coll_size=1 << 20)
    assert [p.name for p in paths] == [f"custom_allreduce.{r}.et" for r in range(8)]
    ours, upstream = read_et(tmp_path / "custom_allreduce"), read_et(base / "custom_allreduce")
    cols = ["rank", "id", "type", "comm_src", "comm_dst", "comm_tag", "comm_size"]
    assert ours.ops.select(cols).equals(upstream.ops.select(cols))  # 1 MiB / 8 chunks = 131072 bytes each
    assert ours.deps.select(["rank", "src", "dst"]).equals(upstream.deps.select(["rank", "src", "dst"]))


def test_chunk_attributes_are_int32_as_astra_sim_reads_them(tmp_path: Path) -> None:
    trace = generate("ring", coll="allreduce", ranks=4)
    p = write_algorithm_et(trace, tmp_path / "ring")[0]
    meta, first, *_ = frames(p)
    m = GlobalMetadata.FromString(meta)
    assert {a.name: a.string_val for a in m.attr} == {
        "schema": "1.0.2-chakra.0.0.4",
        "collective": "allreduce",
    }
    node = Node.FromString(first)
    members = {a.name: a.WhichOneof("value") for a in node.attr}
    for name in (
        "msg_chunk_cnt",
        "msg_chunk_idx",
        "total_chunk_cnt",
        "chunk_offset",
        "tb_id",
        "local_time_step",
        "comm_dst",
        "comm_tag",
    ):
        assert members[name] == "int32_val", name
    assert "comm_size" not in members  # sizes come from the chunk attributes unless asked for
    values = {a.name: a.int32_val for a in node.attr if a.WhichOneof("value") == "int32_val"}
    assert (values["msg_chunk_cnt"], values["total_chunk_cnt"], values["comm_dst"]) == (1, 4, 1)


def test_round_trip_through_et_keeps_the_algorithm(tmp_path: Path) -> None:
    trace = generate("direct", coll="allreduce", ranks=4, chunks=2)
    write_algorithm_et(trace, tmp_path / "d", coll_size=4096, reduce_duration_micros=3)
    back = read_et(tmp_path / "d")
    cols = ["rank", "id", "name", "type", "comm_src", "comm_dst", "comm_tag", *CHUNK_COLUMNS, "attrs"]
    assert back.ops.select(cols).equals(trace.ops.select(cols))
    assert back.deps.select(["rank", "src", "dst"]).equals(trace.deps.select(["rank", "src", "dst"]))
    comp = pc.equal(back.ops["type"], "COMP_NODE")
    assert set(back.ops.filter(comp)["duration_micros"].to_pylist()) == {3}
    sends = back.ops.filter(pc.equal(back.ops["type"], "COMM_SEND_NODE"))
    assert set(sends["comm_size"].to_pylist()) == {4096 // 8 * 2}  # 8 chunks, 2 per message
    assert back.ops.filter(comp)["comm_size"].null_count == comp.to_numpy(zero_copy_only=False).sum()


def test_message_sizes_scale_and_remainders() -> None:
    ag = generate("ring", coll="allgather", ranks=4)
    sizes = message_sizes(ag, 1000)  # per-rank input 1000 B, buffer 4000 B in 4 chunks
    comm = pc.is_in(ag.ops["type"], pa.array(["COMM_SEND_NODE", "COMM_RECV_NODE"])).to_numpy(
        zero_copy_only=False
    )
    assert set(sizes[comm].tolist()) == {1000} and set(sizes[~comm].tolist()) <= {0}
    assert set(message_sizes(ag, 1000, scale_by_ngpus=False)[comm].tolist()) == {250}
    ar = generate("ring", coll="allreduce", ranks=3)  # 100 B in 3 chunks: 33, 33 and 34
    sizes = message_sizes(ar, 100)
    idx = ar.ops["msg_chunk_idx"].to_numpy()
    comm = pc.is_in(ar.ops["type"], pa.array(["COMM_SEND_NODE", "COMM_RECV_NODE"])).to_numpy(
        zero_copy_only=False
    )
    assert set(sizes[comm & (idx == 2)].tolist()) == {34}
    assert set(sizes[comm & (idx < 2)].tolist()) == {33}


def test_every_rank_gets_a_file(tmp_path: Path) -> None:
    trace = generate("ring", coll="allgather", ranks=3)
    trace = trace.replace(params={**trace.params, "ngpus": 5})
    paths = write_algorithm_et(trace, tmp_path / "x")
    assert [p.name for p in paths] == [f"x.{r}.et" for r in range(5)]
    assert len(frames(paths[4])) == 1  # only the metadata


@pytest.mark.parametrize(
    ("size", "message"),
    [
        (0, r"collective size must be positive, got 0 bytes"),
        (3, r"a collective of 3 bytes cannot be cut into 4 chunks"),
    ],
)
def test_impossible_sizes(tmp_path: Path, size: int, message: str) -> None:
    with pytest.raises(UnsatisfiableError, match=message):
        write_algorithm_et(generate("ring", coll="allreduce", ranks=4), tmp_path / "y", coll_size=size)


def test_sends_need_chunk_columns() -> None:
    t = generate("ring", coll="allreduce", ranks=2)
    n = t.num_ops
    bare = t.replace(
        ops=t.ops.set_column(
            t.ops.schema.get_field_index("msg_chunk_cnt"), "msg_chunk_cnt", pa.nulls(n, pa.int64())
        )
    )
    with pytest.raises(UnsatisfiableError, match=r"rank 0 node 0 is a send/receive without msg_chunk_cnt"):
        message_sizes(bare, 1 << 20)


def test_parse_size() -> None:
    assert parse_size("1MiB") == parse_size("1MB") == parse_size("1 m") == 1 << 20
    assert parse_size("1.5GiB") == 3 << 29 and parse_size("4096") == 4096 and parse_size(7) == 7
    assert parse_size(".5KiB") == 512


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1.3B", r"size '1\.3B' is not a whole number of bytes"),
        ("abc", r"not a size: 'abc' \(expected e\.g\. 1MiB"),
        ("1 XB", r"not a size: '1 XB'"),
        (-5, r"size must not be negative, got -5"),
    ],
)
def test_parse_size_rejects(text: str | int, message: str) -> None:
    with pytest.raises(UnsatisfiableError, match=message):
        parse_size(text)
