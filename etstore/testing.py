"""Test helpers: trace equality that names the first difference, and small hand-built inputs.

Used by ``tests/`` and ``bench/`` only; no module of the package imports it (the layering
test checks). Everything here is deterministic and small enough to check on paper.

- :func:`assert_trace_equal`: two traces hold the same ops and deps, or an
  :class:`AssertionError` naming the first differing (rank, id, column).
- MSCCL-IR text: :func:`msccl_doc`, :func:`msccl_tb`, :func:`msccl_step` build a
  2-GPU document line by line; :func:`ring_allreduce_xml` writes the N-rank ring
  all-reduce in the shape of ASTRA-sim's ``custom_allreduce.xml``.
- Traces: :func:`trace_from_nodes` (node dicts and edges), :func:`two_rank_allreduce`,
  :func:`p2p_trace`, :func:`slot_policy_trace`, and the 2-rank overlap workload
  :func:`hand_workload` with its expansion (:func:`hand_parent`, :func:`hand_expanded`,
  :func:`ingest_hand_expanded`).
- :func:`rank_parts`: a trace split into consecutive rank ranges, as a streamed ingest takes it.
- :func:`require_extension`: a C extension, or a skip (a failure under CI).
- Stores: :class:`RecordedStore` (what a store of recorded runs holds); servers:
  :func:`clear_server`, :func:`serve` (a test server holding what a store published) and
  :class:`Backend` (a store, and what it holds as a backend under test reads it).
"""

from __future__ import annotations

import importlib
import os
import unittest
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import pairwise
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa

from etstore.app.publish import publish
from etstore.ingest.pytorch_et import read_pytorch_et
from etstore.model import DEPS_SCHEMA, Trace, deps_table, ops_table
from etstore.store import EmbeddedStore, Store, open_store
from etstore.store._neo4j_bolt import Bolt
from etstore.store._neo4j_target import parse_url

__all__ = [
    "MSCCL_HEAD",
    "Backend",
    "ExtensionMissingError",
    "RecordedStore",
    "assert_trace_equal",
    "clear_server",
    "hand_expanded",
    "hand_parent",
    "hand_workload",
    "ingest_hand_expanded",
    "msccl_doc",
    "msccl_step",
    "msccl_tb",
    "p2p_trace",
    "rank_parts",
    "recorded_trace",
    "require_extension",
    "ring_allreduce_xml",
    "serve",
    "slot_policy_trace",
    "trace_from_nodes",
    "two_chains",
    "two_rank_allreduce",
]

_MIB = 1 << 20

# ---------------------------------------------------------------- equality


def _first_difference(a: pa.Table, b: pa.Table, columns: Sequence[str]) -> tuple[int, str] | None:
    """(row, column) of the first cell that differs between two equally long tables."""
    best: tuple[int, str] | None = None
    for col in columns:
        x, y = a[col], b[col]
        if x.equals(y):
            continue
        left, right = x.to_pylist(), y.to_pylist()
        row = next(i for i, (u, v) in enumerate(zip(left, right, strict=True)) if u != v)
        if best is None or row < best[0]:
            best = (row, col)
    return best


def _keys(table: pa.Table, names: Sequence[str]) -> list[tuple[Any, ...]]:
    return list(zip(*(table[n].to_pylist() for n in names), strict=True))


def _compare(a: pa.Table, b: pa.Table, key: Sequence[str], columns: Sequence[str] | None, what: str) -> None:
    """Sort both tables by ``key`` and raise AssertionError at the first difference."""
    cols = list(columns) if columns is not None else list(a.column_names)
    wanted = set(cols) | (set() if columns is not None else set(b.column_names))
    only_left, only_right = sorted(wanted - set(b.column_names)), sorted(wanted - set(a.column_names))
    if only_left or only_right:
        raise AssertionError(
            f"{what}: columns only in the left trace {only_left}, only in the right {only_right}"
        )
    for c in cols:
        if a.schema.field(c).type != b.schema.field(c).type:
            raise AssertionError(
                f"{what}: column {c!r} is {a.schema.field(c).type} vs {b.schema.field(c).type}"
            )
    order = [(k, "ascending") for k in key]
    a, b = a.select(cols).sort_by(order), b.select(cols).sort_by(order)
    if a.equals(b):
        return
    ka, kb = _keys(a, key), _keys(b, key)
    if ka != kb:
        only_a, only_b = sorted(set(ka) - set(kb)), sorted(set(kb) - set(ka))
        if only_a or only_b:
            first = min(
                [*(("left", k) for k in only_a[:1]), *(("right", k) for k in only_b[:1])], key=lambda t: t[1]
            )
            raise AssertionError(
                f"{what}: {dict(zip(key, first[1], strict=True))} is only in the {first[0]} trace "
                f"({a.num_rows} vs {b.num_rows} rows)"
            )
        raise AssertionError(f"{what}: the same keys with different multiplicities")
    diff = _first_difference(a, b, [c for c in cols if c not in key])
    if diff is not None:
        row, col = diff
        where = ", ".join(f"{k} {v}" for k, v in zip(key, ka[row], strict=True))
        raise AssertionError(
            f"{what}: {where}, column {col!r}: {a[col][row].as_py()!r} != {b[col][row].as_py()!r}"
        )


def assert_trace_equal(
    a: Trace, b: Trace, *, columns: Sequence[str] | None = None, check_deps: bool = True
) -> None:
    """Assert two traces hold the same ops (and deps), naming the first difference.

    Parameters
    ----------
    a, b
        The traces; their row order does not matter (ops are compared by (rank, id),
        deps by (rank, dst, src, kind)).
    columns
        The op columns to compare (default: all, and both traces must have the same).
    check_deps
        Also compare ``deps`` (rank, src, dst, kind).

    Raises
    ------
    AssertionError
        At the first differing (rank, id, column) of ``ops`` in (rank, id) order, or
        the first (rank, src, dst) of ``deps`` only one trace has.

    Notes
    -----
    O(V log V + E log E) to sort and compare in Arrow; only when the traces differ,
    O(V) Python work per key column and per differing column to locate the difference.
    """
    cols = None if columns is None else ["rank", "id", *(c for c in columns if c not in ("rank", "id"))]
    _compare(a.ops, b.ops, ["rank", "id"], cols, "ops")
    if check_deps:
        _compare(a.deps, b.deps, ["rank", "dst", "src", "kind"], ["rank", "dst", "src", "kind"], "deps")


# ---------------------------------------------------------------- C extensions


class ExtensionMissingError(AssertionError):
    """A C extension is not built where the build is required (CI)."""


def rank_parts(trace: Trace, cuts: Sequence[int]) -> list[Trace]:
    """``trace`` split before each rank in ``cuts``: every part holds its ranks' rows of every
    table (what :meth:`Store.ingest_parts <etstore.store.base.Store.ingest_parts>` takes)."""
    bounds = [0, *cuts, max(trace.ranks) + 1]
    out = []
    for lo, hi in pairwise(bounds):
        tables = {}
        for name in ("ops", "deps", "missing", "meta"):
            t = getattr(trace, name)
            r = t["rank"].to_numpy()
            tables[name] = t.filter(pa.array((r >= lo) & (r < hi)))
        out.append(trace.replace(**tables))
    return out


def require_extension(module: str) -> ModuleType:
    """Import a C extension (or the module that wraps one), or skip the calling test.

    Parameters
    ----------
    module
        Dotted module name, e.g. ``etstore.ingest._xmlscan``.

    Returns
    -------
    ModuleType
        The imported module.

    Raises
    ------
    unittest.SkipTest
        The module cannot be imported (pytest reports the test as skipped, with why).
    ExtensionMissingError
        The module cannot be imported and the environment variable ``CI`` is ``true``:
        there a missing build is a failure, not a skip.

    Notes
    -----
    The extensions are optional builds (setup.py): without a C compiler the install
    succeeds and etstore uses its Python fallbacks, so only CI insists on them.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        why = (
            f"{module} is not available ({exc}); the C extensions are built by "
            "`pip install -e .` (`make install`), which needs a C compiler"
        )
        if os.environ.get("CI") == "true":
            raise ExtensionMissingError(f"CI requires the C extensions: {why}") from exc
        raise unittest.SkipTest(why) from exc


# ---------------------------------------------------------------- MSCCL-IR XML text

MSCCL_HEAD = (
    '<algo name="t" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allreduce" '
    'inplace="0" outofplace="1" minBytes="0" maxBytes="0">'
)


def msccl_doc(
    gpu0: str,
    gpu1: str = "",
    head: str = MSCCL_HEAD,
    chunks: str = 'i_chunks="2" o_chunks="2" s_chunks="2"',
) -> str:
    """A 2-GPU MSCCL-IR document: ``head``, then GPUs 0 and 1 holding the given threadblocks."""
    return (
        f'{head}\n  <gpu id="0" {chunks}>\n{gpu0}\n  </gpu>\n'
        f'  <gpu id="1" {chunks}>\n{gpu1}\n  </gpu>\n</algo>\n'
    )


def msccl_step(
    s: int,
    typ: str,
    sb: str = "i",
    so: int = 0,
    db: str = "i",
    do: int = 0,
    cnt: int = 1,
    depid: int = -1,
    deps: int = -1,
) -> str:
    """One ``<step>`` line (source and destination buffer and offset, count, dependency)."""
    return (
        f'      <step s="{s}" type="{typ}" srcbuf="{sb}" srcoff="{so}" dstbuf="{db}" dstoff="{do}" '
        f'cnt="{cnt}" depid="{depid}" deps="{deps}" hasdep="0"/>'
    )


def msccl_tb(i: int, send: int, recv: int, *steps: str, chan: int = 0) -> str:
    """One ``<tb>`` element (send and receive peers, -1 for none) around the given step lines."""
    return f'    <tb id="{i}" send="{send}" recv="{recv}" chan="{chan}">\n' + "\n".join(steps) + "\n    </tb>"


def ring_allreduce_xml(n: int) -> str:
    """Ring all-reduce MSCCL-IR for ``n`` ranks, shaped like ASTRA-sim's ``custom_allreduce.xml``.

    One channel, one threadblock per GPU (send to r+1, receive from r-1), ``n`` chunks;
    per GPU 4n-4 steps: ``s`` of its own chunk, n-1 times (``rrc`` then ``s``), then n-1
    times (``r`` then ``s``) without the last ``s``: only the step types the public
    MSCCL-IR → Chakra converter handles. At n = 8 the steps equal the fixture's line
    for line.

    Parameters
    ----------
    n
        Number of ranks (GPUs), at least 2.

    Returns
    -------
    str
        The XML text, newline-terminated.

    Notes
    -----
    O(n^2) lines.
    """
    out = [
        f'<algo name="allreduce_ring_{n}" proto="Simple" nchannels="1" nchunksperloop="{n}" ngpus="{n}" '
        'coll="allreduce" inplace="1" outofplace="0" minBytes="0" maxBytes="0">'
    ]
    for r in range(n):
        out.append(f'  <gpu id="{r}" i_chunks="{n}" o_chunks="0" s_chunks="0">')
        out.append(f'    <tb id="0" send="{(r + 1) % n}" recv="{(r - 1) % n}" chan="0">')
        seq, c = [("s", r)], r
        for _ in range(n - 1):
            c = (c - 1) % n
            seq += [("rrc", c), ("s", c)]
        for k in range(n - 1):
            c = (c - 1) % n
            seq += [("r", c)] + ([("s", c)] if k < n - 2 else [])
        for i, (typ, c) in enumerate(seq):
            out.append(
                f'      <step s="{i}" type="{typ}" srcbuf="i" srcoff="{c}" dstbuf="i" dstoff="{c}" cnt="1" '
                'depid="-1" deps="-1" hasdep="0"/>'
            )
        out += ["    </tb>", "  </gpu>"]
    out.append("</algo>")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- hand-built algorithm traces


def trace_from_nodes(nodes: list[dict[str, Any]], edges: list[tuple[int, int, int]], **params: Any) -> Trace:
    """An algorithm trace from node dicts (rank, id, type, ...) and (rank, src, dst) edges; no attrs.

    ``params`` override the defaults (a 2-GPU in-place all-reduce of 2 chunks per loop).
    """
    cols: dict[str, list[Any]] = {}
    for k in {k for n in nodes for k in n}:
        cols[k] = [n.get(k) for n in nodes]
    cols.setdefault("name", [n.get("name", "") for n in nodes])
    ops = ops_table(cols)
    deps = (
        deps_table([e[0] for e in edges], [e[1] for e in edges], [e[2] for e in edges])
        if edges
        else DEPS_SCHEMA.empty_table()
    )
    base: dict[str, Any] = {"collective": "allreduce", "ngpus": 2, "nchunksperloop": 2, "inplace": True}
    base.update(params)
    return Trace(ops=ops, deps=deps, name="hand", kind="algorithm", params=base)


def _node(rank: int, id_: int, typ: str, name: str, off: int, **kw: Any) -> dict[str, Any]:
    """One chunk node of a 2-chunk algorithm."""
    return {
        "rank": rank,
        "id": id_,
        "type": typ,
        "name": name,
        "msg_chunk_cnt": 1,
        "chunk_offset": off,
        "total_chunk_cnt": 2,
        **kw,
    }


def two_rank_allreduce(reduce: bool = True) -> tuple[list[dict[str, Any]], list[tuple[int, int, int]]]:
    """Nodes and edges of a 2-rank all-reduce written by hand (input of :func:`trace_from_nodes`).

    Rank r sends chunk 1-r, receives chunk r and reduces it in (one fused step), sends
    the total back and receives the other total. Buffers default to ``i`` at
    ``chunk_offset``; ids 0 send, 1 recv, 2 reduce (when ``reduce``), 3 send, 4 recv,
    chained in that order on one threadblock.
    """
    nodes: list[dict[str, Any]] = []
    edges: list[tuple[int, int, int]] = []
    for r in (0, 1):
        p, mine, other = 1 - r, r, 1 - r
        send = {"comm_dst": p, "comm_tag": 0, "tb_id": 0}
        recv = {"comm_src": p, "comm_tag": 0, "tb_id": 0}
        nodes += [
            _node(r, 0, "COMM_SEND_NODE", "send0", other, **send, local_time_step=0),
            _node(r, 1, "COMM_RECV_NODE", "recv1", mine, **recv, local_time_step=1),
        ]
        if reduce:
            nodes.append(_node(r, 2, "COMP_NODE", "reduce", mine, tb_id=0, local_time_step=1))
        nodes += [
            _node(r, 3, "COMM_SEND_NODE", "send3", mine, **send, local_time_step=2),
            _node(r, 4, "COMM_RECV_NODE", "recv4", other, **recv, local_time_step=3),
        ]
        chain = [0, 1, 2, 3, 4] if reduce else [0, 1, 3, 4]
        edges += [(r, a, b) for a, b in pairwise(chain)]
    return nodes, edges


def p2p_trace(size: int, src: int = 0, dst: int = 1, tag: int = 0) -> Trace:
    """One message of ``size`` bytes: a send (id 1) on ``src`` and its receive (id 1) on ``dst``."""
    ops = ops_table(
        {
            "rank": [src, dst],
            "id": [1, 1],
            "type": ["COMM_SEND_NODE", "COMM_RECV_NODE"],
            "comm_dst": [dst, None],
            "comm_src": [None, src],
            "comm_tag": [tag, tag],
            "comm_size": [size, size],
        }
    )
    return Trace(ops, name="p2p")


def slot_policy_trace() -> Trace:
    """One rank where a compute-slot policy decides the order: X, P and Q compete for the GPU.

    X (GPU, 10 µs) holds the compute slot; the CPU chain c1 (1 µs) → c2 (1 µs) makes
    P (3 µs) ready at 1 µs and Q (3 µs) at 2 µs, both waiting for X.
    """
    ops = ops_table(
        {
            "rank": [0] * 5,
            "id": [1, 2, 3, 4, 5],
            "name": ["X", "c1", "c2", "P", "Q"],
            "type": ["COMP_NODE"] * 5,
            "duration_micros": [10, 1, 1, 3, 3],
            "is_cpu_op": [False, True, True, False, False],
        }
    )
    return Trace(ops, deps=deps_table([0, 0, 0], [2, 3, 2], [3, 5, 4]), name="policy")


# ---------------------------------------------------------------- the 2-rank overlap workload

_COMM = ("comm_type", "comm_size", "comm_src", "comm_dst", "comm_tag", "pg_name", "chunk_offset")
_Rows = Callable[[int, int], list[tuple[Any, ...]]]


def _two_ranks(rows_of: _Rows, edges: list[tuple[int, int, str]], **trace: Any) -> tuple[Trace, pa.Table]:
    """Both ranks from ``rows_of(rank, peer)`` rows (id, name, type, µs, comm, parent) and the
    same edges, with the lineage (rank, id, parent_id) the rows name."""
    cols: dict[str, list[Any]] = {k: [] for k in ("rank", "id", "name", "type", "duration_micros", *_COMM)}
    d: dict[str, list[Any]] = {"rank": [], "src": [], "dst": [], "kind": []}
    lineage: dict[str, list[int]] = {"rank": [], "id": [], "parent_id": []}
    for r in (0, 1):
        for i, name, typ, dur, comm, parent in rows_of(r, 1 - r):
            for k, v in (("rank", r), ("id", i), ("name", name), ("type", typ), ("duration_micros", dur)):
                cols[k].append(v)
            for k in _COMM:
                cols[k].append(comm.get(k))
            for k, v in (("rank", r), ("id", i), ("parent_id", parent)):
                lineage[k].append(v)
        for s, t, kind in edges:
            for k, v in (("rank", r), ("src", s), ("dst", t), ("kind", kind)):
                d[k].append(v)
    deps = deps_table(np.asarray(d["rank"]), d["src"], d["dst"], d["kind"])
    lin = pa.table(
        {
            "rank": pa.array(lineage["rank"], pa.int32()),
            "id": pa.array(lineage["id"], pa.uint64()),
            "parent_id": pa.array(lineage["parent_id"], pa.uint64()),
        }
    )
    return Trace(ops_table(cols), deps, **trace), lin


def hand_workload() -> Trace:
    """A 2-rank workload whose overlap and reorder opportunities can be worked out by hand.

    Both ranks identical, peer p = 1 - r (tests/app/test_overlap.py derives the timeline)::

        id name            type  duration  deps
        0  fwd             COMP  10 µs     -
        1  grad_allreduce  COLL  1 MiB     data 0
        2  indep           COMP  20 µs     data 0, ctrl 1
        3  apply           COMP   5 µs     data 1, ctrl 2
        4  stats           COMP  30 µs     ctrl 3
        5  send_act        SEND  1 MiB     data 0, ctrl 4     (to p, tag 7)
        6  recv_act        RECV  1 MiB     data 0             (from p, tag 7)
        7  final           COMP   1 µs     data 5, data 6, ctrl 4
    """

    def rows(r: int, p: int) -> list[tuple[Any, ...]]:
        ar = {"comm_type": "ALL_REDUCE", "comm_size": _MIB, "pg_name": ""}
        return [
            (0, "fwd", "COMP_NODE", 10, {}, 0),
            (1, "grad_allreduce", "COMM_COLL_NODE", 0, ar, 1),
            (2, "indep", "COMP_NODE", 20, {}, 2),
            (3, "apply", "COMP_NODE", 5, {}, 3),
            (4, "stats", "COMP_NODE", 30, {}, 4),
            (5, "send_act", "COMM_SEND_NODE", 0, {"comm_dst": p, "comm_tag": 7, "comm_size": _MIB}, 5),
            (6, "recv_act", "COMM_RECV_NODE", 0, {"comm_src": p, "comm_tag": 7, "comm_size": _MIB}, 6),
            (7, "final", "COMP_NODE", 1, {}, 7),
        ]

    edges = [
        (0, 1, "data"),
        (0, 2, "data"),
        (1, 2, "ctrl"),
        (1, 3, "data"),
        (2, 3, "ctrl"),
        (3, 4, "ctrl"),
        (0, 5, "data"),
        (4, 5, "ctrl"),
        (0, 6, "data"),
        (5, 7, "data"),
        (6, 7, "data"),
        (4, 7, "ctrl"),
    ]
    return _two_ranks(rows, edges, name="hand")[0]


def hand_parent() -> Trace:
    """fwd (10 µs) → 1 MiB all-reduce → apply (6 µs) on 2 ranks: the parent of :func:`hand_expanded`."""

    def rows(r: int, p: int) -> list[tuple[Any, ...]]:
        ar = {"comm_type": "ALL_REDUCE", "comm_size": _MIB, "pg_name": ""}
        return [
            (0, "fwd", "COMP_NODE", 10, {}, 0),
            (1, "allreduce", "COMM_COLL_NODE", 0, ar, 1),
            (3, "apply", "COMP_NODE", 6, {}, 3),
        ]

    return _two_ranks(rows, [(0, 1, "data"), (1, 3, "data")], name="parent")[0]


def hand_expanded() -> tuple[Trace, pa.Table]:
    """:func:`hand_parent` with its all-reduce expanded by hand, and the lineage to the parent.

    The all-reduce becomes a 2-rank reduce-scatter + all-gather (chunk slot r is this
    rank's half, p the peer's; 512 KiB messages)::

        0 fwd 10 µs | 10 rs_send slot p | 11 rs_recv slot r | 12 rs_reduce 2 µs slot r
        13 ag_send slot r | 14 ag_recv slot p | 3 apply 6 µs (data 13, 14)
    """

    def rows(r: int, p: int) -> list[tuple[Any, ...]]:
        def msg(peer_key: str, tag: int, slot: int) -> dict[str, Any]:
            return {peer_key: p, "comm_tag": tag, "comm_size": _MIB // 2, "chunk_offset": slot}

        return [
            (0, "fwd", "COMP_NODE", 10, {}, 0),
            (10, "rs_send", "COMM_SEND_NODE", 0, msg("comm_dst", 100, p), 1),
            (11, "rs_recv", "COMM_RECV_NODE", 0, msg("comm_src", 100, r), 1),
            (12, "rs_reduce", "COMP_NODE", 2, {"chunk_offset": r}, 1),
            (13, "ag_send", "COMM_SEND_NODE", 0, msg("comm_dst", 101, r), 1),
            (14, "ag_recv", "COMM_RECV_NODE", 0, msg("comm_src", 101, p), 1),
            (3, "apply", "COMP_NODE", 6, {}, 3),
        ]

    edges = [(0, 10, "data"), (0, 11, "data"), (11, 12, "data"), (12, 13, "data"), (0, 14, "data")]
    edges += [(13, 3, "data"), (14, 3, "data")]
    return _two_ranks(rows, edges, name="expanded", kind="expanded")


def ingest_hand_expanded(store: Store) -> str:
    """Store :func:`hand_parent` as ``parent`` and :func:`hand_expanded` under it; the expanded name."""
    store.ingest(hand_parent(), name="parent")
    trace, lineage = hand_expanded()
    return store.ingest(trace, name="expanded", parent="parent", lineage=lineage).trace.name


# ---------------------------------------------------------------- stores


@dataclass(frozen=True)
class RecordedStore:
    """What a store of recorded simulation runs holds (the report tests' fixture store).

    Its directory, the run ids (congestion unaware, aware), the sweep id and the trace name.
    """

    path: Path
    runs: tuple[int, int]
    sweep: int
    trace: str


def clear_server(url: str) -> None:
    """Delete every node and relationship of the Neo4j server at ``url`` (a test server shared
    between cases), in transactions of 10,000 nodes; its constraints and indexes stay."""
    bolt = Bolt(parse_url(url), read_only=False)
    try:
        bolt.run("MATCH (n) CALL { WITH n DETACH DELETE n } IN TRANSACTIONS OF 10000 ROWS", write=True)
    finally:
        bolt.close()


class Backend:
    """A writable embedded store, and what it holds as a backend under test reads it: the store
    itself (``url`` None), or the Neo4j server at ``url`` it is published to (the contract
    suite, ``tests/store/contract/``)."""

    def __init__(self, kind: str, store: EmbeddedStore, url: str | None) -> None:
        self.kind = kind
        self.store = store
        """Where a case writes (always embedded)."""
        self.url = url
        self._reader: Store | None = None

    @property
    def location(self) -> str:
        """What ``open_store`` opens to read this backend: the directory, or the server's URL."""
        return self.url if self.url is not None else str(self.store.path)

    def read(self) -> Store:
        """The store to read from, holding what ``store`` holds now (published first on Neo4j)."""
        if self.url is None:
            return self.store
        publish(self.store, self.url, prune=True)
        if self._reader is None:
            self._reader = open_store(self.url)
        return self._reader

    def close(self) -> None:
        """Close the reader and the store."""
        if self._reader is not None:
            self._reader.close()
        self.store.close()


def serve(url: str, directory: Path, traces: dict[str, Trace]) -> None:
    """Make the test server at ``url`` hold ``traces`` (by name) and nothing else: emptied, then
    published to from a new store in ``directory``."""
    clear_server(url)
    with EmbeddedStore(directory) as store:
        for name, trace in traces.items():
            store.ingest(trace, name=name)
        publish(store, url)


@cache
def recorded_trace(path: Path) -> Trace:
    """A recording (PyTorch ET + Kineto directory) read once per process: linking a pair per
    rank takes a good part of a second, and many tests read the same few. Do not change it."""
    return read_pytorch_et(path)


def two_chains() -> Trace:
    """Rank 0: A (100 µs) → B (200 µs), the critical path; rank 1: C (50) → D (50); nothing
    between the ranks (GPU ops): a straggler or a scaled class moves the makespan by hand."""
    ops = ops_table(
        {
            "rank": [0, 0, 1, 1],
            "id": [1, 2, 1, 2],
            "name": ["A", "B", "C", "D"],
            "type": ["COMP_NODE"] * 4,
            "duration_micros": [100, 200, 50, 50],
            "is_cpu_op": [False] * 4,
        }
    )
    return Trace(ops=ops, deps=deps_table([0, 1], [1, 1], [2, 2], "data"), name="chains")
