"""NCCL's ring and double binary tree as generators: specs, structure, and the checker's proof."""

from __future__ import annotations

import pytest

from etstore.algorithms import check_algorithm, generate
from etstore.algorithms.nccl import (
    MAX_LOOPS,
    NCCL_GENERATORS,
    NcclSpec,
    chunk_bytes,
    generate_nccl,
    loops_for,
    parse_nccl,
    resolve_nccl,
    tree_links,
    wire_ratio,
)
from etstore.algorithms.specs import algorithms_by_type, parse_generator
from etstore.errors import OptionError, UnsatisfiableError

# (spec, ranks): channels 1-4, every protocol, the tree on 1, 2, 3 and 4 nodes (odd: the shifted tree)
RING_CASES = [("nccl-ring:1:simple:1", 2), ("nccl-ring:3:ll:2", 5), ("nccl-ring:4:ll128:1", 8)]
TREE_CASES = [
    ("nccl-tree:1:simple:1:2", 3),
    ("nccl-tree:2:ll:1:2", 8),
    ("nccl-tree:4:ll128:2:1", 8),
    ("nccl-tree:3:simple:3:2", 6),
    ("nccl-tree:2:simple:4:1", 16),
]


@pytest.mark.parametrize(("spec", "ranks"), RING_CASES)
@pytest.mark.parametrize("coll", NCCL_GENERATORS["nccl-ring"])
def test_check_proves_nccl_ring(spec: str, ranks: int, coll: str) -> None:
    report = check_algorithm(generate_nccl(spec, coll=coll, ranks=ranks))
    assert report.ok, report.problems[:3]


@pytest.mark.parametrize(("spec", "ranks"), TREE_CASES)
def test_check_proves_nccl_tree(spec: str, ranks: int) -> None:
    report = check_algorithm(generate_nccl(spec, coll="allreduce", ranks=ranks))
    assert report.ok, report.problems[:3]


def test_ring_has_nccl_structure() -> None:
    t = generate_nccl("nccl-ring:3:LL", coll="allreduce", ranks=4, loops=2)
    p = t.params
    assert p["nchunksperloop"] == 4 * 3 * 2  # N · channels · loops
    assert p["nccl"] == {"algorithm": "ring", "protocol": "LL", "channels": 3, "nodes": 1, "loops": 2}
    assert p["wire_bytes_ratio"] == [2, 1] and p["proto"] == "LL" and p["nchannels"] == 3
    ops = t.ops.to_pandas()
    sends = ops[ops["type"] == "COMM_SEND_NODE"]
    # each rank, channel and loop: 2(N-1) sends to its ring successor, on the channel's tag
    assert len(sends) == 4 * 3 * 2 * 2 * 3
    assert set(sends["comm_tag"]) == {0, 1, 2}
    assert ((sends["comm_dst"] - sends["rank"]) % 4 == 1).all()


def test_tree_is_a_chain_in_a_node_and_nccls_double_binary_tree_across_nodes() -> None:
    # one node: a chain 0 -> 1 -> 2 -> 3 (treeIntra), both trees
    assert tree_links(4, 1, 0) == tree_links(4, 1, 1) == ([-1, 0, 1, 2], [[1], [2], [3], []])
    # ncclGetBtree's illustration (trees.cc) over 14 nodes: 0-8, 8-4, 8-12, 4-2, 4-6, 12-10, 12-13, ...
    parent, _ = tree_links(14, 14, 0)
    assert parent == [-1, 2, 4, 2, 8, 6, 4, 6, 0, 10, 12, 10, 8, 12]
    # the second tree mirrors the first for an even count: 11 is its root, 3 its child
    parent1, _ = tree_links(12, 12, 1)
    assert parent1[11] == -1 and parent1[3] == 11
    # 2 nodes of 4: node 1's head (rank 4) hangs under node 0's first rank; chains inside
    parent2, kids2 = tree_links(8, 2, 0)
    assert parent2 == [-1, 0, 1, 2, 0, 4, 5, 6] and sorted(kids2[0]) == [1, 4]


def test_tree_channels_split_between_the_two_trees() -> None:
    t = generate_nccl("nccl-tree:2:simple:4", coll="allreduce", ranks=4)  # one rank per node
    ops = t.ops.to_pandas()
    sends = ops[ops["type"] == "COMM_SEND_NODE"]
    for tag, g in sends.groupby("comm_tag"):  # channel 0 runs tree 0 (btree), channel 1 tree 1 (mirror)
        parent, _ = tree_links(4, 4, int(tag))
        edges = {frozenset((r, p)) for r, p in enumerate(parent) if p >= 0}
        assert {frozenset(e) for e in zip(g["rank"], g["comm_dst"], strict=True)} == edges
    assert tree_links(4, 4, 0)[0] == [-1, 2, 0, 2] and tree_links(4, 4, 1)[0] == [1, 3, 1, -1]


def test_specs_parse_and_write_back() -> None:
    assert parse_nccl("nccl-ring") == NcclSpec("ring")
    assert parse_nccl("nccl-tree:24:LL128:2:5") == NcclSpec("tree", 24, "LL128", 2, 5)
    assert parse_nccl("nccl-ring:8:simple:3").text() == "nccl-ring:8:Simple:3"
    assert parse_generator("nccl-ring:8:ll") == ("nccl-ring:8:ll", 1)
    assert parse_generator("nccl:a100:2") == ("nccl:a100:2", 1)
    assert set(algorithms_by_type("nccl-tree")) == {"ALL_REDUCE"}
    assert set(algorithms_by_type("nccl")) >= {"ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "BROADCAST"}


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("nccl-ring:0", "channels must be a positive integer"),
        ("nccl-ring:2:ll64", "protocol 'll64' is not one of"),
        ("nccl-ring:2:ll:1:9", "expected nccl-ring"),
        ("nccl-tree:2:ll:x", "nodes must be a positive integer"),
        ("nccl:b300", "unknown; presets: a100, h100"),
        ("nccl:a100:1:2:3", "expected nccl"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec: str, match: str) -> None:
    with pytest.raises(OptionError, match=match):
        parse_generator(spec)


def test_generate_delegates_and_refuses_what_it_cannot_build() -> None:
    t = generate("nccl-ring:2:ll128", coll="allgather", ranks=3, chunks=2)  # chunks: loops
    assert t.params["nccl"]["loops"] == 2 and t.params["wire_bytes_ratio"] == [16, 15]
    with pytest.raises(UnsatisfiableError, match="picks an NCCL algorithm per collective size"):
        generate("nccl", coll="allreduce", ranks=4)
    with pytest.raises(UnsatisfiableError, match="does not implement 'allgather'"):
        generate_nccl("nccl-tree", coll="allgather", ranks=4)
    with pytest.raises(UnsatisfiableError, match="cannot spread evenly over 3 nodes"):
        generate_nccl("nccl-tree:2:ll:3", coll="allreduce", ranks=8)


def test_protocol_chunks_and_wire_bytes_are_nccls() -> None:
    assert wire_ratio("LL") == (2, 1) and wire_ratio("LL128") == (16, 15) and wire_ratio("Simple") == (1, 1)
    # a step of the protocol's buffer (LL 512 KiB, LL128 4,915,200 B, Simple 4 MiB) / NCCL_STEPS,
    # x4 steps for ring Simple, half data for LL, 120/128 for LL128
    assert chunk_bytes("ring", "Simple", "allreduce") == 2 << 20
    assert chunk_bytes("tree", "Simple", "allreduce") == 512 << 10
    assert chunk_bytes("ring", "Simple", "broadcast") == 512 << 10
    assert chunk_bytes("ring", "LL", "allreduce") == 32 << 10
    assert chunk_bytes("ring", "LL128", "allreduce") == 576_000
    # tree LL128 halves its chunk while a channel has few (1 node of 8, 1 MiB per channel: 576,000 ->
    # 72,000 B), then rounds down to its 1,920-byte grain
    assert chunk_bytes("tree", "LL128", "allreduce", channel_bytes=1 << 20, nodes=1, ppn=8) == 71_040
    ring = parse_nccl("nccl-ring:24:simple")
    assert loops_for(ring, "allreduce", 1 << 30, 8) == 3  # 1 GiB / (24 · 8 · 2 MiB) = 2.67
    assert loops_for(ring, "allreduce", 1 << 40, 8) == MAX_LOOPS


def test_resolve_picks_nccls_choice_and_names_it() -> None:
    small, label = resolve_nccl("nccl", "allreduce", 1024, 8)
    assert (small.algorithm, small.protocol, small.channels, small.loops) == ("ring", "LL", 1, 1)
    assert label == "nccl:a100 ring/LL/1ch"
    tree, _ = resolve_nccl("nccl-tree:4:ll", "allreduce", 1 << 20, 8)
    assert tree.loops == 8  # 1 MiB / 4 channels / 32 KiB chunks
    # NCCL would run NVLS on an H100 node; etstore builds ring and tree, and says so
    _, label = resolve_nccl("nccl:h100", "allreduce", 1 << 30, 8)
    assert label == "nccl:h100 ring/Simple/32ch (NCCL: nvls/Simple, not built)"
