"""Chunk-level overlap on expanded recordings: a consumer split into per-chunk pieces in its lane.

The recording ``tests/data/torch_tp_layers_2r`` (tensor parallel, two column/row pairs on 2
ranks) all-reduces each row-parallel output; expanded with ``ring:2`` (two channels, each a
2-rank ring), a rank's own chunks are final after the ring's reduction step and the peer's
after the next step's receive. A consumer of the all-reduce (the loss, the ReLU after the first
pair, its backward) can start on the rank's own chunks while the others are in flight.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from etstore.algorithms.expand import expand
from etstore.analysis.lane_split import (
    ChunkSplit,
    apply_splits,
    find_splits,
    split_candidates,
    splits_from_detail,
)
from etstore.analysis.lanes import lanes_of, op_times
from etstore.analysis.rewrite import check_rewrite, rewrite_recording
from etstore.analysis.split import SplitCost
from etstore.errors import RewriteError
from etstore.model import Trace
from etstore.sim.replay import Replay, replay
from etstore.testing import recorded_trace

DATA = Path(__file__).parent.parent / "data"
_CACHE: dict[str, tuple[Trace, Replay]] = {}


def _expanded(name: str = "torch_tp_layers_2r") -> tuple[Trace, Replay]:
    if name not in _CACHE:
        t = expand(recorded_trace(DATA / name), "ring:2").trace
        _CACHE[name] = (t, replay(t))
    return _CACHE[name]


def _candidates(t: Trace, base: Replay, cost: SplitCost | None = None) -> list[ChunkSplit]:
    start, end = op_times(t, base.result.ops)
    return split_candidates(t, lanes_of(t), start, end, cost=cost)


def test_pieces_wait_for_their_chunks_in_arrival_order_own_chunks_first() -> None:
    """Each piece waits for the final writers of its chunks: first the rank's own chunks, which
    its reduction finished, then the peer's, which arrive by a receive one step later."""
    t, base = _expanded()
    cands = _candidates(t, base)
    assert cands
    types = t.ops["type"].to_pylist()
    reads = t.params["chunk_reads"]
    ids, ranks = t.ops["id"].to_pylist(), t.ops["rank"].to_pylist()
    for c in cands:
        first, last = c.groups[0], c.groups[-1]
        assert {types[w] for w in first} == {"COMP_NODE"}  # the ring's reduction step
        assert {types[w] for w in last} == {"COMM_RECV_NODE"}  # the all-gather step's receive
        assert c.arrival_ns[0] < c.arrival_ns[-1]
        mine = {
            w
            for r, o, w in zip(reads["rank"], reads["op"], reads["writer"], strict=True)
            if (r, o) == (ranks[c.op], ids[c.op])
        }
        assert {ids[w] for g in c.groups for w in g} == mine  # every chunk it reads, once


def test_split_replays_pieces_after_their_chunks_and_the_first_before_the_last_chunk() -> None:
    """In the replay of the split trace every piece starts after its chunks' writers end, the
    first before the last chunk lands (that is the overlap), and the consumer (the last piece)
    after every piece; no dependency of the recording is lost."""
    t, base = _expanded()
    c = max(find_splits(t, base=base)[1][0].splits, key=lambda sp: sp.estimate_ns)  # one that gains
    y = apply_splits(t, lanes_of(t), [c])
    check_rewrite(t, y)
    res = replay(y).result.ops.to_pandas().set_index(["rank", "id"])
    ids = t.ops["id"].to_pylist()
    rank = int(t.ops["rank"][c.op].as_py())
    pieces = y.params["split_pieces"]
    made = [i for r, i, o in zip(pieces["rank"], pieces["id"], pieces["op"], strict=True) if o == ids[c.op]]
    assert len(made) == len(c.groups) - 1
    names = dict(
        zip(
            zip(y.ops["rank"].to_pylist(), y.ops["id"].to_pylist(), strict=True),
            y.ops["name"].to_pylist(),
            strict=True,
        )
    )
    for j, pid in enumerate(made):
        assert names[(rank, pid)] == f"{names[(rank, ids[c.op])]}.chunk{j + 1}"
        for w in c.groups[j]:
            assert res.loc[(rank, pid), "start_ns"] >= res.loc[(rank, ids[w]), "end_ns"]
        assert res.loc[(rank, ids[c.op]), "start_ns"] >= res.loc[(rank, pid), "end_ns"]
    last_chunk = max(res.loc[(rank, ids[w]), "end_ns"] for w in c.groups[-1])
    assert res.loc[(rank, made[0]), "start_ns"] < last_chunk


def test_piece_times_share_the_op_by_bytes_with_a_launch_each() -> None:
    """Pieces share the op's recorded time by the bytes each reads; every piece after the first
    pays one launch (``SplitCost.overhead_us``); the consumer keeps the last piece's time."""
    t, base = _expanded()
    cost = SplitCost(overhead_us=3)
    c = _candidates(t, base, cost)[0]
    dur = int(t.ops["duration_micros"][c.op].as_py())
    assert sum(c.pieces_us) == dur + 3 * (len(c.pieces_us) - 1)
    y = apply_splits(t, lanes_of(t), [c])
    row = {
        (r, i): k
        for k, (r, i) in enumerate(zip(y.ops["rank"].to_pylist(), y.ops["id"].to_pylist(), strict=True))
    }
    key = (int(t.ops["rank"][c.op].as_py()), int(t.ops["id"][c.op].as_py()))
    assert y.ops["duration_micros"][row[key]].as_py() == c.pieces_us[-1]


def test_measured_gains_are_what_applying_each_alone_realises() -> None:
    """Each opportunity's measured gain, applied alone, is the makespan the replay loses; the
    gains add up (applied together they realise their sum) and never exceed the makespan."""
    t, base = _expanded()
    _, found = find_splits(t, base=base)
    assert found
    total = float(base.result.total_ns)
    for o in found:
        details = [o.detail(t, SplitCost())]
        y = rewrite_recording(t, details, name="y")
        assert total - float(replay(y).result.total_ns) == pytest.approx(o.alone_gain_ns, abs=1.0)
    every = rewrite_recording(t, [o.detail(t, SplitCost()) for o in found], name="all")
    assert total - float(replay(every).result.total_ns) == pytest.approx(
        sum(o.gain_ns for o in found), abs=1.0
    )
    assert sum(o.gain_ns for o in found) < total


def test_an_in_place_consumer_waits_for_the_sends_of_its_chunks() -> None:
    """DDP divides each reduced bucket in place: a piece that writes chunks of the buffer must
    not run before the algorithm has sent them on, so it follows those sends as well."""
    t, base = _expanded("torch_ddp_buckets_2r")
    reads = t.params["chunk_reads"]
    assert any(reads["writes"])
    chunk_lo = t.ops["chunk_offset"].to_pylist()
    chunk_n = t.ops["msg_chunk_cnt"].to_pylist()
    types = t.ops["type"].to_pylist()
    ids, ranks = t.ops["id"].to_pylist(), t.ops["rank"].to_pylist()
    writes = {(r, o) for r, o, w in zip(reads["rank"], reads["op"], reads["writes"], strict=True) if w}
    seen = 0
    for c in _candidates(t, base):
        if (ranks[c.op], ids[c.op]) not in writes:
            assert not any(c.after)
            continue
        seen += 1
        for group, after in zip(c.groups, c.after, strict=True):
            slots = {
                s
                for r, o, s, w in zip(reads["rank"], reads["op"], reads["slot"], reads["writer"], strict=True)
                if (r, o) == (ranks[c.op], ids[c.op]) and w in {ids[g] for g in group}
            }
            sends = {
                m
                for m in range(t.num_ops)
                if types[m] == "COMM_SEND_NODE"
                and ranks[m] == ranks[c.op]
                and chunk_lo[m] is not None
                and any(chunk_lo[m] <= s < chunk_lo[m] + (chunk_n[m] or 1) for s in slots)
            }
            block_sends = {m for m in sends if m in _block(t, c.block)}
            assert set(after) == block_sends and block_sends
    assert seen


def _block(t: Trace, b: int) -> set[int]:
    blocks = t.params["collective_blocks"]
    first, n, r = blocks["first_id"][b], blocks["ops"][b], blocks["rank"][b]
    ids, ranks = np.asarray(t.ops["id"]), np.asarray(t.ops["rank"])
    return set(np.flatnonzero((ranks == r) & (ids >= first) & (ids < first + n)).tolist())


def test_a_split_that_is_not_one_is_refused_naming_the_op() -> None:
    """An op that reduces across the chunks (a softmax) does not split, and pieces that do not
    read the chunks their op reads are refused; each error names the rank and op."""
    t, base = _expanded()
    c = _candidates(t, base)[0]
    detail = c.detail(t)
    rank, op = detail["rank"], detail["op"]
    wrong = json.loads(json.dumps(detail))
    wrong["pieces"][0]["writers"] = wrong["pieces"][0]["writers"][:1]
    with pytest.raises(RewriteError, match=rf"rank {rank}: op {op} .*not the final writers"):
        apply_splits(t, lanes_of(t), splits_from_detail(t, {"splits": [wrong]}))
    names = t.ops["name"].to_pylist()
    names[c.op] = "aten::_softmax"
    soft = t.replace(ops=t.ops.set_column(t.ops.schema.get_field_index("name"), "name", [names]))
    with pytest.raises(RewriteError, match=rf"rank {rank}: op {op} \(aten::_softmax\) reduces across"):
        apply_splits(soft, lanes_of(soft), [c])
    assert all(x.op != c.op for x in _candidates(soft, base))  # and the finder never proposes it


def test_cli_overlap_finds_chunk_splits_and_rewrite_realises_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As a user runs it: expand the recording, ask for chunk opportunities, apply each by its
    id and compare: the makespan drops by the gain reported; the rewrite lists each split op
    before and after, and its pieces' lineage points at the op they split."""
    from etstore import open_store
    from etstore.cli import main

    store = tmp_path / "s"
    s = ["--store", str(store)]
    assert main([*s, "ingest", str(DATA / "torch_tp_layers_2r"), "--name", "tp"]) == 0
    assert main([*s, "expand", "tp", "--algo", "ring:2", "--name", "x"]) == 0
    capsys.readouterr()
    assert main([*s, "overlap", "x", "--kind", "chunk", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(r["kind"] == "chunk" and r["gain_ns"] > 0 for r in rows)
    for r in rows:
        n = str(r["id"])
        assert main([*s, "rewrite", "x", "--opportunity", n, "--name", f"y{n}"]) == 0
        out = capsys.readouterr().out
        assert "split ops" in out and "chunk-split" in out
        assert main([*s, "compare", "x", f"y{n}", "--format", "json"]) == 0
        cmp = json.loads(capsys.readouterr().out)
        realised = max(c["total_a_ns"] for c in cmp) - max(c["total_b_ns"] for c in cmp)
        assert realised == pytest.approx(r["detail"]["alone_gain_ns"], abs=1.0)
    with open_store(store, read_only=True) as st:
        got = st.sql(
            "SELECT o.name, p.name AS parent FROM lineage l JOIN ops o ON o.uid = l.uid "
            "JOIN ops p ON p.uid = l.parent_uid WHERE l.trace = 'y1' AND o.name LIKE '%.chunk1'"
        ).to_pylist()
    assert got and all(g["name"] == f"{g['parent']}.chunk1" for g in got)


def test_the_relu_after_a_tp_all_reduce_carries_its_cut_into_the_next_gemm() -> None:
    """After the first row-parallel layer's all-reduce, the ReLU's output is the next
    column-parallel GEMM's left operand (its rows are the batch rows the chunks cut): the GEMM
    is cut with it, piece j reading the ReLU's piece j, placed right after it in the lane."""
    from etstore.analysis._rowwise import tensor_args
    from etstore.model import decode_attrs

    t, base = _expanded()
    names = t.ops["name"].to_pylist()
    cands = [c for c in _candidates(t, base) if names[c.op] == "aten::clamp_min"]
    assert cands and all([names[y] for y, _ in c.chain] == ["aten::addmm"] for c in cands)
    c = cands[0]
    gemm = c.chain[0][0]

    def node(row: int) -> str:
        return str(decode_attrs(t.ops["attrs"][row].as_py())["pytorch_et_node"])

    left = next(a for a in tensor_args(node(gemm)) if a.index == 1)  # addmm(bias, input, weight)
    assert left.range == tensor_args(node(c.op), "outputs")[0].range
    assert len(c.chain[0][1]) == len(c.groups)
    y = apply_splits(t, lanes_of(t), [c])
    check_rewrite(t, y)
    ids = t.ops["id"].to_pylist()
    rank = int(t.ops["rank"][c.op].as_py())
    p = y.params["split_pieces"]
    relu_pieces = [
        i for r, i, o in zip(p["rank"], p["id"], p["op"], strict=True) if o == ids[c.op] and r == rank
    ]
    gemm_pieces = [
        i for r, i, o in zip(p["rank"], p["id"], p["op"], strict=True) if o == ids[gemm] and r == rank
    ]
    d = y.deps.filter(y.deps["rank"].to_numpy() == rank)
    edges = set(zip(d["src"].to_pylist(), d["dst"].to_pylist(), d["kind"].to_pylist(), strict=True))
    for a, b in zip(relu_pieces, gemm_pieces, strict=True):
        assert (a, b, "data") in edges  # the GEMM's rows j read the ReLU's rows j
    assert (gemm_pieces[-1], ids[gemm], "data") in edges  # the GEMM's result is whole after its pieces
    res = replay(y).result.ops.to_pandas().set_index(["rank", "id"])
    for a, b in zip(relu_pieces, gemm_pieces, strict=True):
        assert res.loc[(rank, b), "start_ns"] >= res.loc[(rank, a), "end_ns"]


def test_the_backward_all_reduce_feeds_a_gemm_cut_per_chunk_and_the_gain_is_real() -> None:
    """The backward all-reduce of the input gradient feeds the ReLU's backward and then the
    GEMM of the layer before it: one opportunity cuts both, and its gain is realised."""
    t, base = _expanded()
    names = t.ops["name"].to_pylist()
    _, found = find_splits(t, base=base)
    cut = [
        o for o in found if any(names[y] in ("aten::mm", "aten::addmm") for s in o.splits for y, _ in s.chain)
    ]
    assert cut and all(o.gain_ns > 0 for o in cut)
    y = rewrite_recording(t, [cut[0].detail(t, SplitCost())], name="y")
    assert float(base.result.total_ns) - float(replay(y).result.total_ns) == pytest.approx(
        cut[0].alone_gain_ns, abs=1.0
    )
    assert any(o["name"] for o in y.params["split_ops"])


def test_a_gemm_cut_along_its_weight_is_not_a_row_cut() -> None:
    """A GEMM reads its right operand (the weight) whole for every output row: cutting that
    operand does not cut the output into runs of bytes, so a chain stops there."""
    from etstore.analysis._rowwise import rowwise

    node = json.dumps(
        {
            "inputs": {
                "values": [[1, 7, 0, 32, 4, "cpu"], [2, 9, 0, 32, 4, "cpu"]],
                "shapes": [[8, 4], [4, 8]],
                "types": ["Tensor(float)", "Tensor(float)"],
            },
            "outputs": {"values": [[3, 11, 0, 64, 4, "cpu"]], "shapes": [[8, 8]], "types": ["Tensor(float)"]},
        }
    )
    assert rowwise("aten::mm", node, (7, 0, 128)) == (16, (11, 0, 256))  # rows of 4 floats in, 8 out
    assert rowwise("aten::mm", node, (9, 0, 128)) is None
    assert rowwise("aten::_softmax", node, (7, 0, 128)) is None
