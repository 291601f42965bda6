"""The graph shape of a trace, as Arrow tables any backend can bulk-load, and its Ladybug DDL.

Nodes are ops keyed by a store-wide ``uid`` (``trace_id << 40 | row``). Edges:
``DEP`` (``src → dst`` within a rank, kind ``data``/``ctrl``), ``MSG``
(a ``COMM_SEND`` to the ``COMM_RECV`` it matches, across ranks) and ``BECOMES``
(an op of a parent trace to the ops of a derived trace that replace it, e.g. a
collective to its expansion). Sends and receives pair as :func:`etstore.dag.match_messages`
pairs them. Beside the ops: ``Trace`` nodes (one per name) and ``TunerStep`` nodes (one per
logged call of a tuner run).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from etstore.dag import match_messages
from etstore.errors import StoreError
from etstore.model import CORE_OP_COLUMNS, OPS_SCHEMA, Trace, op_rows

__all__ = [
    "GRAPH_OP_COLUMNS",
    "LINEAGE_SCHEMA",
    "TRACE_NODE_COLUMNS",
    "TRACE_NODE_DDL",
    "TUNER_STEP_NODE_DDL",
    "TUNER_STEP_PROPERTIES",
    "UID_SHIFT",
    "dep_edges",
    "graph_ddl",
    "lineage_edges",
    "message_edges",
    "message_rows",
    "op_nodes",
    "uid_base",
]

UID_SHIFT = 40
LINEAGE_SCHEMA = pa.schema([("rank", pa.int32()), ("id", pa.uint64()), ("parent_id", pa.uint64())])
# What Cypher sees of an op: identity, type, timing and the communication fields
# queries walk by. Chunk bookkeeping (msg_chunk_*, chunk_offset, tb_id, ...) and
# raw attributes stay in the DuckDB ``ops`` table: fewer graph columns is the
# largest single saving in the graph bulk load.
GRAPH_OP_COLUMNS: tuple[str, ...] = ("uid", "trace_id", *CORE_OP_COLUMNS)
# A name is a handle on content, not a property of it: ``Trace`` nodes (one per name) carry
# the content's ``trace_id``, which every ``Op`` of that content carries too.
TRACE_NODE_COLUMNS: tuple[str, ...] = ("name", "trace_id", "kind", "ranks", "ops", "parent", "source")
TRACE_NODE_DDL = (
    "CREATE NODE TABLE IF NOT EXISTS Trace(name STRING, trace_id INT64, kind STRING, ranks INT32, "
    "ops INT64, parent STRING, source STRING, PRIMARY KEY(name))"
)

# A tuner run's steps (``etstore.app.tuner`` stores the runs): one node per logged call, so
# Cypher reaches them beside the ops they ran.
TUNER_STEP_PROPERTIES: dict[str, str] = {
    "uid": "INT64",
    "run": "STRING",
    "run_id": "INT64",
    "content_hash": "STRING",
    "step": "INT64",
    "collective": "STRING",
    "size_bytes": "INT64",
    "ranks": "INT32",
    "nodes": "INT32",
    "topology": "STRING",
    "gpu_model": "STRING",
    "algorithm": "STRING",
    "protocol": "STRING",
    "channels": "INT32",
    "chunk_bytes": "INT64",
    "trace_id": "INT64",
    "time_us": "DOUBLE",
    "busbw_gb_per_s": "DOUBLE",
    "reward": "DOUBLE",
}
"""Properties of a ``TunerStep`` node and their Ladybug types: the step's ``tuner_steps``
columns but ``extra`` and ``trace``; ``uid`` is ``run_id · 2^32 + step``; ``trace_id`` is
``Op.trace_id`` of the linked algorithm's ops (null when the step has no link)."""

TUNER_STEP_NODE_DDL = (
    "CREATE NODE TABLE IF NOT EXISTS TunerStep("
    + ", ".join(f"{k} {v}" for k, v in TUNER_STEP_PROPERTIES.items())
    + ", PRIMARY KEY(uid))"
)
"""Ladybug's node table for tuner steps (Neo4j needs no schema)."""


_GRAPH_TYPES = {
    pa.int32(): "INT32",
    pa.int64(): "INT64",
    pa.uint64(): "UINT64",
    pa.string(): "STRING",
    pa.bool_(): "BOOLEAN",
}


def graph_ddl() -> list[str]:
    """Ladybug DDL of the graph (idempotent): ``Op`` with :data:`GRAPH_OP_COLUMNS`, ``DEP``
    with its ``kind`` string, ``MSG``, ``BECOMES`` and the tuner's step nodes.

    Notes
    -----
    ``DEP.kind`` stays the string (a :class:`~etstore.model.DepKind` value) that Cypher
    queries compare with;
    what each property costs the bulk load is in ``docs/store.md`` ("Ingest speed").
    """
    op_schema = pa.schema(
        [("uid", pa.int64()), ("trace_id", pa.int64())]
        + [(f.name, f.type) for f in OPS_SCHEMA if f.name in GRAPH_OP_COLUMNS]
    )
    columns = ", ".join(f"{f.name} {_GRAPH_TYPES[f.type]}" for f in op_schema)
    return [
        f"CREATE NODE TABLE IF NOT EXISTS Op({columns}, PRIMARY KEY(uid))",
        "CREATE REL TABLE IF NOT EXISTS DEP(FROM Op TO Op, kind STRING)",
        "CREATE REL TABLE IF NOT EXISTS MSG(FROM Op TO Op, tag INT32, comm_size INT64)",
        "CREATE REL TABLE IF NOT EXISTS BECOMES(FROM Op TO Op)",
        TRACE_NODE_DDL,
        TUNER_STEP_NODE_DDL,  # tuner runs' steps (etstore.app.tuner stores the runs)
    ]


def uid_base(trace_id: int) -> int:
    """First uid of the content ``trace_id``."""
    if not 0 < trace_id < (1 << 22):
        raise StoreError(f"trace id {trace_id} out of range")
    return trace_id << UID_SHIFT


def op_nodes(trace: Trace, trace_id: int, base: int, columns: Sequence[str] = GRAPH_OP_COLUMNS) -> pa.Table:
    """Graph node rows: ``uid``, ``trace_id`` and the op ``columns`` (default :data:`GRAPH_OP_COLUMNS`)."""
    n = trace.ops.num_rows
    if n >= 1 << UID_SHIFT:
        raise StoreError(f"trace {trace.name}: {n} ops exceed the per-trace limit of 2^40")
    cols = {
        "uid": pa.array(np.arange(base, base + n, dtype=np.int64)),
        "trace_id": pa.array(np.full(n, trace_id, dtype=np.int64)),
    }
    for name in columns:
        if name not in cols:
            cols[name] = trace.ops[name]
    return pa.table(cols)


def dep_edges(trace: Trace, base: int) -> pa.Table:
    """``DEP`` edge rows ``from``, ``to`` (uids), ``kind``.

    Notes
    -----
    O(V + E) when every rank's ops are its ids ``0 .. n-1`` in order (what readers and
    generators emit: a dependency's row is then its rank's first row plus its id), else
    O((V + E) log V) (:func:`~etstore.model.op_rows`).
    """
    deps = trace.deps
    if deps.num_rows == 0:
        return pa.table(
            {
                "from": pa.array([], pa.int64()),
                "to": pa.array([], pa.int64()),
                "kind": pa.array([], pa.string()),
            }
        )
    rank = deps["rank"].to_numpy()
    src, dst = deps["src"].to_numpy(), deps["dst"].to_numpy()
    rows = _dense_rows(trace.ops, rank, src, dst)
    if rows is None:
        rows = op_rows(trace.ops, rank, src), op_rows(trace.ops, rank, dst)
    return pa.table({"from": base + rows[0], "to": base + rows[1], "kind": deps["kind"]})


def _dense_rows(
    ops: pa.Table, rank: np.ndarray, src: np.ndarray, dst: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """Rows in ``ops`` of ``(rank, src)`` and ``(rank, dst)`` when each rank's ops are one block
    of ids ``0 .. n-1`` in order and every pair names one of them; None otherwise."""
    op_rank, ids = ops["rank"].to_numpy(), ops["id"].to_numpy()
    if len(ids) == 0 or int(ids[0]) != 0:
        return None
    cuts = np.flatnonzero(op_rank[1:] != op_rank[:-1]) + 1
    steps_by_one = ids[1:] - ids[:-1] == 1
    steps_by_one[cuts - 1] = ids[cuts] == 0  # a new rank starts again at id 0
    ranks = op_rank[np.concatenate(([0], cuts))]
    if not steps_by_one.all() or not bool(np.all(ranks[1:] > ranks[:-1])):
        return None
    starts = np.concatenate(([0], cuts)).astype(np.int64)
    sizes = np.diff(np.append(starts, len(ids))).astype(np.uint64)
    at = np.minimum(np.searchsorted(ranks, rank), len(ranks) - 1)
    if not bool(np.all(ranks[at] == rank)):
        return None
    first, size = starts[at], sizes[at]
    if not (bool(np.all(src < size)) and bool(np.all(dst < size))):
        return None
    return first + src.astype(np.int64), first + dst.astype(np.int64)


def message_edges(trace: Trace, base: int) -> tuple[pa.Table, int, int]:
    """``MSG`` edge rows (``from`` send uid, ``to`` recv uid, ``tag``, ``comm_size``)
    plus the counts of unmatched sends and receives (see :func:`etstore.dag.match_messages`)."""
    m = match_messages(trace)
    sizes = trace.ops["comm_size"].take(pa.array(m.send_row))
    return message_rows(base, m.send_row, m.recv_row, m.tag, sizes), m.unmatched_sends, m.unmatched_recvs


def message_rows(
    base: int,
    send_row: np.ndarray,
    recv_row: np.ndarray,
    tag: np.ndarray,
    comm_size: pa.Array | pa.ChunkedArray,
) -> pa.Table:
    """``MSG`` edge rows for matched pairs of op rows (the send's ``comm_size`` each)."""
    return pa.table(
        {
            "from": pa.array(base + send_row, pa.int64()),
            "to": pa.array(base + recv_row, pa.int64()),
            "tag": pa.array(np.asarray(tag).astype(np.int32)),
            "comm_size": comm_size,
        }
    )


def lineage_edges(lineage: pa.Table, child: pa.Table, parent: pa.Table, *, what: str) -> pa.Table:
    """``BECOMES`` edge rows (``from`` parent uid, ``to`` child uid) for a lineage table.

    ``lineage`` has :data:`LINEAGE_SCHEMA`: op ``(rank, id)`` of the derived trace
    comes from op ``(rank, parent_id)`` of its parent. ``child`` and ``parent`` map
    ``rank``, ``id`` → ``uid`` for the two traces. Pairs naming an absent op raise
    :class:`StoreError`, so a bad lineage never half-lands.

    Notes
    -----
    O(L + V) expected: two hash joins.
    """
    try:
        lineage = lineage.select(LINEAGE_SCHEMA.names).cast(LINEAGE_SCHEMA)
    except (KeyError, pa.ArrowInvalid) as exc:
        raise StoreError(f"{what}: lineage needs columns rank, id, parent_id ({exc})") from exc
    keyed = lineage.append_column("row", pa.array(np.arange(lineage.num_rows, dtype=np.int64)))
    kid = child.select(["rank", "id", "uid"]).rename_columns(["rank", "id", "to"])
    par = parent.select(["rank", "id", "uid"]).rename_columns(["rank", "parent_id", "from"])
    joined = keyed.join(kid, ["rank", "id"], join_type="inner").join(
        par, ["rank", "parent_id"], join_type="inner"
    )
    if joined.num_rows != lineage.num_rows:
        found = np.zeros(lineage.num_rows, dtype=bool)
        found[joined["row"].to_numpy()] = True
        bad = int(np.flatnonzero(~found)[0])
        r, i, p = (lineage[c][bad].as_py() for c in ("rank", "id", "parent_id"))
        raise StoreError(
            f"{what}: lineage row {bad} links rank {r} op {i} to parent op {p}, "
            f"but one of them does not exist ({lineage.num_rows - joined.num_rows} such rows)"
        )
    joined = joined.sort_by("row")
    return pa.table({"from": joined["from"].cast(pa.int64()), "to": joined["to"].cast(pa.int64())})
