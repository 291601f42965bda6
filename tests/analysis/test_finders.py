"""The finders' passes against a plain reference: the same opportunities, estimates and order.

The reference below is the overlap and reorder passes as they were before they scaled
(issue 30): every op's descendants as a set, every pair tested, quadratic and short enough to
read against ``docs/overlap.md``. The package's passes look only where edges changed
(:mod:`etstore.analysis._reach`) and must agree with it exactly: the pairs freed, the sends
moved, every edge of the rewritten rank in the same order; on generated rank graphs, and on
expanded transformer workloads, where the finders' tables (gains by the SQL) must be the
reference's too. The chunk finder is checked the same way against the loops it replaced.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from etstore.algorithms._instances import find_collectives
from etstore.algorithms.expand import expand
from etstore.analysis._chunks import ChunkConsumer, chunk_consumers
from etstore.analysis._finders import chunk_rows
from etstore.analysis._rankgraph import (
    EdgeArrays,
    RankGraph,
    iter_graphs_with_arrays,
    overlap_rank,
    rank_graphs,
    reorder_rank,
)
from etstore.analysis.split import SplitCost
from etstore.app.overlap import expansions_of, find_opportunities
from etstore.app.runs import record_run
from etstore.model import Trace, deps_table
from etstore.sim import simulate
from etstore.store import EmbeddedStore
from etstore.topology import parse_topology
from etstore.workloads import transformer

COMM = ("COMM_SEND_NODE", "COMM_COLL_NODE")
Edges = dict[tuple[int, int], str]

# ---------------------------------------------------------------- the reference


def _reach(n: int, edges: Edges, kind: str | None = None) -> list[set[int]]:
    """Per op, the ops it reaches (itself included), through ``kind`` edges only when given."""
    succ: list[list[int]] = [[] for _ in range(n)]
    for (u, v), k in edges.items():
        if kind is None or k == kind:
            succ[u].append(v)
    out = []
    for u in range(n):
        seen, walk = {u}, [u]
        while walk:
            for w in succ[walk.pop()]:
                if w not in seen:
                    seen.add(w)
                    walk.append(w)
        out.append(seen)
    return out


def _restore(types: list[str], edges: Edges, before: list[set[int]]) -> None:
    """A ctrl edge for every two comm ops ordered before and not now."""
    after = _reach(len(types), edges)
    comm = [c for c, t in enumerate(types) if t in COMM]
    for v in comm:
        for c in comm:
            if c != v and v in before[c] and v not in after[c]:
                edges.setdefault((c, v), "ctrl")


def ref_overlap(types: list[str], edges: Edges, only: set[int] | None) -> tuple[list[tuple[int, int]], Edges]:
    n, edges = len(types), dict(edges)
    data, before = _reach(n, edges, "data"), _reach(n, edges)
    preds = [[u for u, w in edges if w == v] for v in range(n)]

    def candidate(u: int, v: int) -> bool:
        coll = types[u] == "COMM_COLL_NODE" and types[v] == "COMP_NODE"
        return coll and v not in data[u] and (only is None or u in only)

    work = [e for e, k in edges.items() if k == "ctrl" and candidate(*e)]
    bypassed = set()
    while work:
        u, v = work.pop()
        if edges.get((u, v)) != "ctrl":
            continue
        del edges[(u, v)]
        bypassed.add((u, v))
        for p in preds[u]:
            if (p, v) not in edges and (p, v) not in bypassed:
                edges[(p, v)] = "ctrl"
                if candidate(p, v):
                    work.append((p, v))
    _restore(types, edges, before)
    after = _reach(n, edges)
    colls = [c for c, t in enumerate(types) if t == "COMM_COLL_NODE"]
    comp = [v for v, t in enumerate(types) if t == "COMP_NODE"]
    return [(c, v) for v in comp for c in colls if v in before[c] and v not in after[c]], edges


def ref_reorder(
    types: list[str], edges: Edges, only: set[int] | None
) -> tuple[list[tuple[int, int]], dict[int, int], Edges]:
    n, edges = len(types), dict(edges)
    data, before = _reach(n, edges, "data"), _reach(n, edges)
    preds = [[u for u, w in edges if w == v] for v in range(n)]
    succs = [[w for u, w in edges if u == v] for v in range(n)]

    def candidate(x: int, s: int) -> bool:
        return (
            types[x] == "COMP_NODE" and types[s] in COMM and s not in data[x] and (only is None or s in only)
        )

    work = [e for e, k in edges.items() if k == "ctrl" and candidate(*e)]
    bypassed, passed = set(), {}
    while work:
        x, s = work.pop()
        if edges.get((x, s)) != "ctrl":
            continue
        del edges[(x, s)]
        bypassed.add((x, s))
        passed.setdefault(s, []).append(x)
        for b in succs[s]:
            edges.setdefault((x, b), "ctrl")
        for p in preds[x]:
            if (p, s) not in edges and (p, s) not in bypassed:
                edges[(p, s)] = "ctrl"
                if candidate(p, s):
                    work.append((p, s))
    _restore(types, edges, before)
    after = _reach(n, edges)
    comm = [c for c, t in enumerate(types) if t in COMM]
    comp = [v for v, t in enumerate(types) if t == "COMP_NODE"]
    freed = [(s, v) for s in comm for v in comp if s in before[v] and s not in after[v]]
    msgs = [m for m, t in enumerate(types) if t in (*COMM, "COMM_RECV_NODE")]
    moved = {}
    for s, xs in passed.items():
        target = max(min(xs), max((m + 1 for m in msgs if m < s), default=0))
        if target < s:
            moved[s] = target
    return freed, moved, edges


# ---------------------------------------------------------------- the passes, one rank


def _check_rank(types: list[str], edges: Edges, only: set[int] | None) -> dict[str, bool]:
    """Both passes against the reference on one rank; what the case exercised."""
    ids = np.arange(len(types), dtype=np.uint64)
    freed, want = ref_overlap(types, edges, only)
    g = RankGraph(0, 0, ids, list(types), dict(edges))
    assert overlap_rank(g, only).freed == freed
    assert list(g.edges.items()) == list(want.items())
    finder = RankGraph(0, 0, ids, list(types), dict(edges))
    assert overlap_rank(finder, only, edges=False).freed == freed  # the finder's shortcut
    restored = any(e not in edges and k == "ctrl" and types[e[0]] in COMM for e, k in want.items())
    rfreed, moved, rwant = ref_reorder(types, edges, only)
    g = RankGraph(0, 0, ids, list(types), dict(edges))
    got = reorder_rank(g, only)
    assert (got.freed, got.moved) == (rfreed, moved)
    assert list(g.edges.items()) == list(rwant.items())
    assert {s: sorted(ps) for s, ps in got.preds.items()} == {
        s: sorted(u for u, w in rwant if w == s) for s in dict.fromkeys(s for s, _ in rfreed)
    }
    return {"overlap": bool(freed), "restored": restored, "reorder": bool(rfreed), "moved": bool(moved)}


def _random_rank(rng: random.Random) -> tuple[list[str], Edges]:
    """A rank of up to 24 ops: a chain in issue order or not, a topological order that is file
    order or not, data and ctrl edges."""
    n = rng.randint(1, 24)
    at = list(range(n))
    if rng.random() < 0.5:
        rng.shuffle(at)
    kinds = ["COMP_NODE"] * 5 + ["COMM_SEND_NODE", "COMM_RECV_NODE", "COMM_COLL_NODE", "COMM_COLL_NODE"]
    types = [rng.choice(kinds) for _ in range(n)]
    density, chain = rng.choice([0.05, 0.1, 0.2, 0.4]), rng.random() < 0.5
    edges: Edges = {}
    for i in range(n):
        for j in range(i + 1, n):
            if (chain and j == i + 1) or rng.random() < density:
                edges[(at[i], at[j])] = "data" if rng.random() < 0.4 else "ctrl"
    return types, edges


def test_passes_match_the_reference_on_generated_ranks() -> None:
    rng = random.Random(30)
    seen = dict.fromkeys(("overlap", "restored", "reorder", "moved"), 0)
    for _ in range(1500):
        types, edges = _random_rank(rng)
        only = {i for i in range(len(types)) if rng.random() < 0.3} if rng.random() < 0.3 else None
        for k, hit in _check_rank(types, edges, only).items():
            seen[k] += hit
    # the cases reach what can go wrong: pairs freed, the comm order restored, sends moved
    assert min(seen.values()) >= 100, seen


def test_finder_keeps_the_comm_order_with_an_edge_per_next_comm_op() -> None:
    """Each gradient all-reduce of the chained transformer is read only by the optimizer step:
    bypassed, it loses its order to every later comm op. The rewrite puts back an edge for
    each (quadratic in the layers); the finder one per all-reduce, to the reduce-scatter
    after it, and frees the same pairs."""
    g = rank_graphs(_chained(transformer(ranks=4, layers=24, tp=2, hidden=1024, seq_tokens=512)), {0})[0]
    before = len(g.edges)
    rewritten = RankGraph(g.rank, g.first, g.ids, list(g.types), dict(g.edges))
    applied = overlap_rank(rewritten)
    finder = overlap_rank(g, edges=False)
    assert finder.freed == applied.freed
    assert len(applied.freed) == 2 * 23  # each all-reduce but layer 0's frees the layer below's 2 ops
    assert len(rewritten.edges) - before > 23 * 22  # an edge to every later comm op
    assert len(g.edges) - before == 2 * 23  # the bypass's own, and one to the next comm op


# ---------------------------------------------------------------- workloads


def _chained(t: Trace) -> Trace:
    """``t`` with each rank's ops in an issue-order chain (ctrl), as one stream issues them."""
    ids = t.ops["id"].to_numpy()
    r, s, d = [], [], []
    for rank, (a, b) in t.rank_slices().items():
        r += [rank] * (b - a - 1)
        s += ids[a : b - 1].tolist()
        d += ids[a + 1 : b].tolist()
    return t.replace(deps=pa.concat_tables([t.deps, deps_table(np.asarray(r), s, d, "ctrl")]))


WORKLOADS = {
    # all-reduces kept, the tensor-parallel collectives in two chunks: every finder finds
    "mixed": (dict(ranks=8, layers=3, tp=4), "ring:2", "comm_type != 'ALL_REDUCE'"),
    "ring": (dict(ranks=4, layers=3, tp=2), "ring", None),  # everything expanded: reorder only
}


@pytest.fixture(params=sorted(WORKLOADS))
def stored(request: pytest.FixtureRequest, store: EmbeddedStore) -> tuple[EmbeddedStore, Trace, int]:
    """A chained transformer and its expansion, stored, with one simulated run of it."""
    shape, alg, where = WORKLOADS[request.param]
    w = _chained(transformer(hidden=1024, seq_tokens=512, **shape))
    e = expand(w, alg, where=where)
    store.ingest(w, name="w")
    store.ingest(e.trace, name="wx", parent="w", lineage=e.lineage)
    res = simulate(e.trace, parse_topology(f"ring:{shape['ranks']}"))
    return store, e.trace, record_run(store.warehouse, res, trace_name="wx")


def test_passes_match_the_reference_on_expanded_workloads(stored: tuple[EmbeddedStore, Trace, int]) -> None:
    _, trace, _ = stored
    seen = dict.fromkeys(("overlap", "restored", "reorder", "moved"), False)
    for g in rank_graphs(trace):
        for k, hit in _check_rank(g.types, g.edges, None).items():
            seen[k] |= hit
    mixed = trace.num_ranks == 8  # its all-reduces are collectives still: the overlap pass frees
    assert seen == {"overlap": mixed, "restored": mixed, "reorder": True, "moved": True}


def _ref_rows(
    trace: Trace, timings: dict[tuple[int, int], tuple[float, float, float]]
) -> list[dict[str, Any]]:
    """The overlap and reorder rows as docs/overlap.md's table defines them, from the reference."""
    out = []
    for g in rank_graphs(trace):
        t = {k: timings[(g.rank, int(i))] for k, i in enumerate(g.ids.tolist())}
        freed, _ = ref_overlap(g.types, g.edges, None)
        for c in dict.fromkeys(c for c, _ in freed):
            xs = [v for cc, v in freed if cc == c]
            coll, comp = t[c][2] - t[c][1], sum(t[v][2] - t[v][1] for v in xs)
            detail = {"collective_ns": coll, "compute_ns": comp, "compute_ids": [int(g.ids[v]) for v in xs]}
            out.append(("overlap", g.rank, int(g.ids[c]), int(g.ids[xs[0]]), min(coll, comp), detail))
        rfreed, _, after = ref_reorder(g.types, g.edges, None)
        for s in dict.fromkeys(s for s, _ in rfreed):
            xs = [v for ss, v in rfreed if ss == s]
            ready = max((t[u][2] for u, w in after if w == s), default=0.0)
            detail = {"issued_ns": t[s][0], "ready_ns": ready, "compute_ids": [int(g.ids[v]) for v in xs]}
            out.append(
                ("reorder", g.rank, int(g.ids[s]), int(g.ids[xs[-1]]), max(t[s][0] - ready, 0), detail)
            )
    order = {"overlap": 0, "reorder": 1}
    rows = [r for r in out if r[4] > 0]
    rows.sort(key=lambda r: (order[r[0]], r[1], r[2], r[3]))
    keys = ("kind", "rank", "op_id", "other_id", "gain_ns", "detail")
    return [dict(zip(keys, r, strict=True)) for r in rows]


def test_finders_match_the_reference_on_expanded_workloads(stored: tuple[EmbeddedStore, Trace, int]) -> None:
    store, trace, run = stored
    got = find_opportunities(store, "wx", run_id=run, kinds=("overlap", "reorder"), measure=False)
    t = store.sql("SELECT rank, id, ready_ns, start_ns, end_ns FROM op_timings WHERE run_id = $r", {"r": run})
    timings = {
        (r["rank"], r["id"]): (r["ready_ns"], r["start_ns"], r["end_ns"]) for r in t.to_arrow().to_pylist()
    }
    rows = [{**r, "detail": json.loads(r["detail"])} for r in got.drop(["trace", "id"]).to_pylist()]
    want = _ref_rows(trace, timings)
    assert [_ids(r) for r in rows] == [_ids(r) for r in want]
    got_ns, want_ns = [x for r in rows for x in _ns(r)], [x for r in want for x in _ns(r)]
    assert got_ns == pytest.approx(want_ns, rel=1e-12)  # the SQL sums in its own order
    assert {r["kind"] for r in rows} == ({"overlap", "reorder"} if trace.num_ranks == 8 else {"reorder"})


def _ids(row: dict[str, Any]) -> tuple[Any, ...]:
    return row["kind"], row["rank"], row["op_id"], row["other_id"], row["detail"]["compute_ids"]


def _ns(row: dict[str, Any]) -> list[float]:
    return [row["gain_ns"], *(v for k, v in sorted(row["detail"].items()) if k != "compute_ids")]


# ---------------------------------------------------------------- chunk


def _ref_consumers(trace: Trace, expansions: pa.Table) -> list[ChunkConsumer]:
    """Chunk consumers by loops over every op (what ``chunk_consumers`` replaced)."""
    ops = trace.ops
    off = pc.fill_null(ops["chunk_offset"], -1).to_pylist()
    cnt = pc.fill_null(ops["msg_chunk_cnt"], 1).to_pylist()
    total = pc.fill_null(ops["total_chunk_cnt"], 0).to_pylist()
    exp = expansions.to_pylist()
    of = {(e["rank"], e["id"]): e["coll_id"] for e in exp}
    share = {(e["rank"], e["coll_id"]): e for e in exp if e["coll_type"] == "REDUCE_SCATTER"}
    out = []
    for g in rank_graphs(trace):
        local = {k: of[(g.rank, int(i))] for k, i in enumerate(g.ids.tolist()) if (g.rank, int(i)) in of}
        writers: dict[int, dict[int, list[int]]] = {}
        for k, c in local.items():
            row = g.first + k
            if g.types[k] == "COMM_SEND_NODE" or off[row] < 0:
                continue
            for slot in range(off[row], off[row] + max(cnt[row], 1)):
                rs = share.get((g.rank, c))
                if rs is not None:
                    part = total[row] // rs["group_size"]
                    if not (part > 0 and rs["group_pos"] * part <= slot < (rs["group_pos"] + 1) * part):
                        continue
                writers.setdefault(c, {}).setdefault(slot, []).append(k)
        for v in range(g.n):
            inside = sorted(u for u, w in g.edges if w == v and u in local)
            colls = {local[u] for u in inside}
            if v not in local and g.types[v] == "COMP_NODE" and len(colls) == 1:
                c = colls.pop()
                if len(writers.get(c, {})) >= 2:
                    out.append(ChunkConsumer(g.rank, c, v, writers[c], inside))
    return out


def test_chunk_consumers_match_the_reference(stored: tuple[EmbeddedStore, Trace, int]) -> None:
    store, trace, _ = stored
    exp = expansions_of(store, "wx")
    colls = find_collectives(store.load("w"), None)
    want = {
        (int(r), int(i)): (str(t), int(p), int(colls.gsize[k]))
        for r, i, t, p, k in zip(colls.rank, colls.ids, colls.ctype, colls.apos, colls.pg_code, strict=True)
    }
    keys = zip(exp["rank"].to_pylist(), exp["coll_id"].to_pylist(), strict=True)
    got = zip(*(exp[c].to_pylist() for c in ("coll_type", "group_pos", "group_size")), strict=True)
    assert list(got) == [want[k] for k in keys]
    assert chunk_consumers(trace, rank_graphs(trace), exp) == _ref_consumers(trace, exp)


COSTS = {
    "free": (SplitCost(overhead_us=0), 8),
    "priced": (SplitCost(overhead_us=4, interference=1.25), 3),  # launches, interference, fewer pieces
}


@pytest.mark.parametrize("cost", sorted(COSTS))
def test_chunk_rows_are_the_reference_timelines(stored: tuple[EmbeddedStore, Trace, int], cost: str) -> None:
    """Each consumer's pieces in arrival order, piece j starting when its chunks and the piece
    before are in, the last also waiting for the rest of the expansion (docs/overlap.md); a
    piece lasting its share of the op, more by ``interference`` while chunks still arrive (all
    but the last), plus a launch (all but the first)."""
    store, trace, run = stored
    split, max_pieces = COSTS[cost]
    got = find_opportunities(
        store, "wx", run_id=run, kinds=("chunk",), measure=False, split=split, max_pieces=max_pieces
    )
    t = store.sql(
        "SELECT rank, id, start_ns, end_ns FROM op_timings WHERE run_id = $r", {"r": run}
    ).to_arrow()
    end = {(r["rank"], r["id"]): r["end_ns"] for r in t.to_pylist()}
    want = []
    graphs = {g.rank: g for g in rank_graphs(trace)}
    for cc in _ref_consumers(trace, expansions_of(store, "wx")):
        g = graphs[cc.rank]
        e_of = {k: end[(g.rank, int(i))] for k, i in enumerate(g.ids.tolist())}
        arrival = {s: max(e_of[w] for w in ws) for s, ws in cc.writers.items()}
        slots = sorted(arrival, key=lambda s: (arrival[s], s))
        dur = int(trace.ops["duration_micros"][g.first + cc.consumer].as_py())
        k = max(1, min(len(slots), max_pieces, dur))
        if k < 2 or not split.splits(str(trace.ops["name"][g.first + cc.consumer].as_py())):
            continue
        sizes = [len(slots) // k + (j < len(slots) % k) for j in range(k)]
        groups = [slots[sum(sizes[:j]) : sum(sizes[: j + 1])] for j in range(k)]
        e = max(
            (e_of[u] for u, w in g.edges if w == cc.consumer and u not in cc.expansion_preds), default=0.0
        )
        first = None
        for j, grp in enumerate(groups):
            at = max(e, *(arrival[s] for s in grp))
            if j == k - 1:
                at = max(at, *(e_of[u] for u in cc.expansion_preds))
            first = at if first is None else first
            share = dur // k + (j < dur % k)
            piece = (share if j == k - 1 else math.ceil(share * split.interference)) + (
                j > 0
            ) * split.overhead_us
            e = at + piece * 1000.0
        key = (g.rank, int(g.ids[cc.consumer]))
        if end[key] - e > 0:
            want.append(
                (g.rank, cc.coll_id, key[1], end[key] - e, first, [[s, arrival[s]] for s in slots], groups)
            )
    detail = ("chunked_start_ns", "chunks", "pieces")
    rows = [
        (r["rank"], r["op_id"], r["other_id"], r["gain_ns"], *(json.loads(r["detail"])[k] for k in detail))
        for r in got.to_pylist()
    ]
    assert rows == sorted(want)
    assert rows or trace.num_ranks == 4  # the mixed workload's consumers gain


def test_chunk_rows_read_timings_in_any_order(stored: tuple[EmbeddedStore, Trace, int]) -> None:
    """Timings in the trace's own row order are read as they are, others joined by (rank, id):
    the same rows either way, for all consumers or some."""
    store, trace, run = stored
    timings = store.sql(
        "SELECT rank, id, ready_ns, start_ns, end_ns FROM op_timings WHERE run_id = $r", {"r": run}
    ).to_arrow()
    exp = expansions_of(store, "wx")
    shuffled = timings.take(pa.array(np.random.default_rng(7).permutation(timings.num_rows)))
    consumers = {
        (c.rank, int(rank_graphs(trace, {c.rank})[0].ids[c.consumer])) for c in _ref_consumers(trace, exp)
    }
    some = set(sorted(consumers)[::2])
    for wanted in (consumers, some):
        a = chunk_rows(trace, timings, exp, wanted, max_pieces=8, unit_ns=1000.0, split=SplitCost())
        b = chunk_rows(trace, shuffled, exp, wanted, max_pieces=8, unit_ns=1000.0, split=SplitCost())
        assert a == b
        assert {(r["rank"], r["other_id"]) for r in a} <= wanted
    assert consumers or trace.num_ranks == 4


def test_rank_graphs_and_their_arrays_do_not_depend_on_the_deps_grouping(
    stored: tuple[EmbeddedStore, Trace, int],
) -> None:
    """Deps grouped by rank (as stored) or the ranks' interleaved, the same graphs, edges in
    the same order; the arrays a pass starts from are the graph's; a pass given them does the
    same."""
    _, trace, _ = stored
    rank = trace.deps["rank"].to_numpy()
    by_rank = np.argsort(rank, kind="stable")
    assert np.array_equal(by_rank, np.arange(len(rank)))  # expanded, as stored: by rank
    nth = np.zeros(len(rank), dtype=np.int64)  # each dep's place among its rank's
    for r in np.unique(rank).tolist():
        nth[rank == r] = np.arange(int((rank == r).sum()))
    interleaved = trace.replace(deps=trace.deps.take(pa.array(np.lexsort((rank, nth)))))
    for (g, arrays), h in zip(iter_graphs_with_arrays(interleaved), rank_graphs(trace), strict=True):
        assert (g.rank, g.first, g.types, list(g.edges.items())) == (
            h.rank,
            h.first,
            h.types,
            list(h.edges.items()),
        )
        back = EdgeArrays.of(h)
        assert np.array_equal(arrays.src, back.src) and np.array_equal(arrays.dst, back.dst)
        assert [arrays.kinds[k] for k in arrays.kind] == [back.kinds[k] for k in back.kind]
        assert [arrays.types[k] for k in arrays.type] == h.types
        copy = RankGraph(h.rank, h.first, h.ids, list(h.types), dict(h.edges))
        assert overlap_rank(g, edges=False, arrays=arrays).freed == overlap_rank(copy, edges=False).freed
        g, arrays = next(iter_graphs_with_arrays(interleaved, {h.rank}))
        got, want = reorder_rank(g, arrays=arrays), reorder_rank(h)
        assert (got.freed, got.moved, got.preds) == (want.freed, want.moved, want.preds)
        assert list(g.edges.items()) == list(h.edges.items())


def test_piece_durations_on_arrays_are_those_of_one_op() -> None:
    rng = np.random.default_rng(3)
    for cost in (
        SplitCost(),
        SplitCost(overhead_us=0, interference=1.7),
        SplitCost(overhead_us=9, interference=1.0),
    ):
        total = rng.integers(0, 5000, 400)
        k = rng.integers(1, 9, 400)
        table = np.stack([cost.piece(total, k, j) for j in range(8)], axis=1)
        for t, n, row in zip(total.tolist(), k.tolist(), table.tolist(), strict=True):
            assert row == cost.pieces(t, n) + [0] * (8 - n)
