"""The columnar trace: what every stage of etstore passes to the next.

A :class:`Trace` is a few Arrow tables, never one Python object per node:

``ops`` (:data:`OPS_SCHEMA`), one row per Chakra node, ranks ascending and each
rank's nodes in file order. Attributes that consumers read are promoted to
columns under their Chakra names; every other attribute, plus ``inputs`` and
``outputs``, stays byte-exact in ``attrs`` (the raw protobuf records of the
node's fields 8, 9 and 10), and ``attr_order`` remembers where the promoted
attributes stood and which oneof member they used. Export rebuilds the node
from both, so ingest → export is lossless while columns stay editable.

``deps`` (:data:`DEPS_SCHEMA`), one row per dependency ``src → dst`` on one rank
(``src`` must finish before ``dst`` issues); ``kind`` is ``data`` or ``ctrl``
and ``pos`` the index within the node's list. ``missing`` has the same schema
and holds dependencies whose ``src`` is not in the rank's file (kept, reported,
written back on export, never walked).

``meta`` (:data:`META_SCHEMA`), one row per rank: the raw GlobalMetadata message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.proto import COLLECTIVE_COMM_TYPES, NODE_TYPES, ONEOF_FIELDS, AttributeProto, Node

__all__ = [
    "ATTR_COLUMNS",
    "CHUNK_COLUMNS",
    "CORE_OP_COLUMNS",
    "DEPS_SCHEMA",
    "DEP_KINDS",
    "LANE_KINDS",
    "META_SCHEMA",
    "OPS_SCHEMA",
    "DepKind",
    "Trace",
    "TraceKind",
    "chakra_deps",
    "decode_attrs",
    "dep_kind_codes",
    "encode_attrs",
    "node_type_code",
    "node_type_name",
]


class TraceKind(str, Enum):
    """What a trace is; the store keeps the string value."""

    WORKLOAD = "workload"
    ALGORITHM = "algorithm"
    EXPANDED = "expanded"
    REWRITTEN = "rewritten"
    RESCALED = "rescaled"

    def __str__(self) -> str:  # the value, as in SQL rows and messages (not "TraceKind.WORKLOAD")
        return self.value


class DepKind(str, Enum):
    """Why a dependency holds (``deps.kind``).

    Chakra's two kinds, ``data`` (the consumer reads bytes the producer wrote) and ``ctrl``
    (issue order), are all a Chakra file can say. A recorded trace (PyTorch ET + Kineto)
    knows more, and a rewrite needs it: an op may move within its lane (``thread``,
    ``stream``), never ahead of what launched it or what it waited for. Every kind but
    ``data`` is a ``ctrl`` dependency to Chakra (:func:`chakra_deps`).
    """

    DATA = "data"
    CTRL = "ctrl"
    THREAD = "thread"
    """The op its CPU thread ran before it."""
    STREAM = "stream"
    """The activity its GPU stream ran before it."""
    LAUNCH = "launch"
    """What handed it its work: a kernel's launching runtime call; for gloo's worker thread,
    what ran before the call that enqueued it."""
    WAIT = "wait"
    """What it waited for on another lane: a synchronize or blocking copy released by device
    work, a stream waiting on another stream's event, a thread woken by another thread's op."""
    GROUP = "group"
    """The previous collective of its process group on the rank (calls are matched by order)."""
    OVERWRITE = "overwrite"
    """It overwrites bytes the earlier op read (or wrote, unread since): write after read."""

    def __str__(self) -> str:  # the value, as stored in ``deps.kind``
        return self.value


DEP_KINDS: tuple[str, ...] = tuple(k.value for k in DepKind)
LANE_KINDS: frozenset[str] = frozenset({"thread", "stream"})
"""Kinds that only order a lane: an op may be moved within its lane past such an edge."""


def dep_kind_codes(kinds: Any) -> np.ndarray:
    """Each kind's index in :data:`DEP_KINDS` (``int8``; an unknown kind gets ``len(DEP_KINDS)``).

    >>> dep_kind_codes(pa.array(["data", "ctrl", "wait", "nope"])).tolist()
    [0, 1, 5, 8]
    """
    idx = pc.index_in(kinds, value_set=pa.array(DEP_KINDS, pa.string()))
    return pc.fill_null(idx, len(DEP_KINDS)).to_numpy(zero_copy_only=False).astype(np.int8)


def chakra_deps(deps: pa.Table) -> pa.Table:
    """``deps`` with Chakra's two kinds: ``data`` kept, every other kind ``ctrl``.

    Positions are renumbered within each (rank, dst, kind), the extended kinds' edges after
    the ``ctrl`` ones in :data:`DEP_KINDS` order, so a writer gets one ordered list per kind.

    >>> d = deps_table(0, [1, 2, 3], [4, 4, 4], ["wait", "ctrl", "data"])
    >>> chakra_deps(d).select(["src", "kind", "pos"]).to_pylist()  # doctest: +NORMALIZE_WHITESPACE
    [{'src': 1, 'kind': 'ctrl', 'pos': 1}, {'src': 2, 'kind': 'ctrl', 'pos': 0},
     {'src': 3, 'kind': 'data', 'pos': 0}]
    """
    if deps.num_rows == 0:
        return deps
    codes = dep_kind_codes(deps["kind"])
    if int(codes.max()) <= 1:
        return deps
    chakra = np.where(codes == 0, "data", "ctrl")
    pos = deps["pos"].to_numpy(zero_copy_only=False)
    order = np.lexsort((pos, codes))  # within a dst and Chakra kind: by kind, then position
    src, dst = deps["src"].to_numpy()[order], deps["dst"].to_numpy()[order]
    out = deps_table(deps["rank"].to_numpy()[order], src, dst, chakra[order].tolist())
    back = np.empty_like(order)
    back[order] = np.arange(len(order))
    return out.take(pa.array(back))


# Promoted attributes: column name -> (arrow type, oneof member written for new nodes).
ATTR_COLUMNS: dict[str, tuple[pa.DataType, str]] = {
    "is_cpu_op": (pa.bool_(), "bool_val"),
    "comm_type": (pa.string(), "int64_val"),  # stored as the CollectiveCommType name
    "comm_size": (pa.int64(), "int64_val"),
    "comm_src": (pa.int32(), "int32_val"),
    "comm_dst": (pa.int32(), "int32_val"),
    "comm_tag": (pa.int32(), "int32_val"),
    "pg_name": (pa.string(), "string_val"),
    # chunk attributes of algorithm DAGs (collectiveapi convention)
    "msg_chunk_cnt": (pa.int64(), "int64_val"),
    "msg_chunk_idx": (pa.int64(), "int64_val"),
    "total_chunk_cnt": (pa.int64(), "int64_val"),
    "chunk_offset": (pa.int64(), "int64_val"),
    "tb_id": (pa.int64(), "int64_val"),
    "local_time_step": (pa.int64(), "int64_val"),
}

# What every op has to be walked and timed: identity, type, duration and the communication
# fields (the graph store's op properties; what generators fill for each op).
CORE_OP_COLUMNS: tuple[str, ...] = (
    "rank",
    "id",
    "name",
    "type",
    "duration_micros",
    "comm_type",
    "comm_size",
    "comm_src",
    "comm_dst",
    "comm_tag",
    "pg_name",
)

# Chunk attributes of algorithm DAGs (collectiveapi convention), in their column order.
CHUNK_COLUMNS: tuple[str, ...] = (
    "msg_chunk_cnt",
    "msg_chunk_idx",
    "total_chunk_cnt",
    "chunk_offset",
    "tb_id",
    "local_time_step",
)


OPS_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("id", pa.uint64()),
        ("name", pa.string()),
        ("type", pa.string()),
        ("duration_micros", pa.uint64()),
        ("start_time_micros", pa.uint64()),
        *[(name, typ) for name, (typ, _) in ATTR_COLUMNS.items()],
        ("attrs", pa.binary()),
        ("attr_order", pa.string()),
    ]
)
DEPS_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("src", pa.uint64()),
        ("dst", pa.uint64()),
        ("kind", pa.string()),
        ("pos", pa.int32()),
    ]
)
META_SCHEMA = pa.schema([("rank", pa.int32()), ("metadata", pa.binary())])

_INT_MEMBERS = frozenset(
    {
        "int32_val",
        "int64_val",
        "uint32_val",
        "uint64_val",
        "sint32_val",
        "sint64_val",
        "fixed32_val",
        "fixed64_val",
        "sfixed32_val",
        "sfixed64_val",
    }
)
_MEMBER_NUMBER = {name: number for number, name in ONEOF_FIELDS.items()}


def node_type_name(code: int) -> str:
    """Chakra NodeType name for a wire value (``NODE_TYPE_<n>`` if out of range)."""
    return NODE_TYPES[code] if 0 <= code < len(NODE_TYPES) else f"NODE_TYPE_{code}"


def node_type_code(name: str) -> int:
    """Inverse of :func:`node_type_name`."""
    if name.startswith("NODE_TYPE_"):
        return int(name[10:])
    return NODE_TYPES.index(name)


def promotable(column: str, member: str, value: Any) -> bool:
    """Whether an attribute (name, oneof member, value) fits its promoted column."""
    if column == "is_cpu_op":
        return member == "bool_val"
    if column == "pg_name":
        return member == "string_val"
    if member not in _INT_MEMBERS:
        return False
    if column == "comm_type":
        return 0 <= value < len(COLLECTIVE_COMM_TYPES)
    if ATTR_COLUMNS[column][0] == pa.int32():
        return -(2**31) <= value < 2**31
    return -(2**63) <= value < 2**63


def encode_attrs(attrs: Iterable[tuple[str, str, Any]]) -> bytes:
    """Raw field-10 records for ``(name, oneof member, value)`` attributes.

    The result is what ``attrs`` holds for extra attributes of generated nodes,
    e.g. ``encode_attrs([("srcbuf", "string_val", "i")])``. List members take a
    Python sequence.
    """
    node = Node()
    for name, member, value in attrs:
        a = node.attr.add(name=name)
        if member.endswith("_list"):
            getattr(a, member).values.extend(value)
        else:
            setattr(a, member, value)
    return node.SerializeToString()


def decode_attrs(blob: bytes | None) -> dict[str, Any]:
    """The extra attributes in an ``attrs`` cell as ``{name: value}`` (lists as lists)."""
    if not blob:
        return {}
    out: dict[str, Any] = {}
    for a in Node.FromString(blob).attr:
        member = a.WhichOneof("value")
        if member is None:
            out[a.name] = None
        elif member.endswith("_list"):
            out[a.name] = list(getattr(a, member).values)
        else:
            out[a.name] = getattr(a, member)
    return out


def _empty(schema: pa.Schema) -> pa.Table:
    return schema.empty_table()


@dataclass(frozen=True)
class Trace:
    """One multi-rank trace in columnar form (see the module docstring).

    ``name`` is a suggestion; the store may keep it or not. ``kind`` is one of
    ``workload``, ``algorithm``, ``expanded``, ``rewritten``. ``params`` holds
    producer parameters (an algorithm's collective, chunk counts, ...), JSON-able.
    """

    ops: pa.Table
    deps: pa.Table = field(default_factory=lambda: _empty(DEPS_SCHEMA))
    missing: pa.Table = field(default_factory=lambda: _empty(DEPS_SCHEMA))
    meta: pa.Table = field(default_factory=lambda: _empty(META_SCHEMA))
    name: str = "trace"
    kind: str = TraceKind.WORKLOAD.value  # a TraceKind value
    source: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # every per-rank pass (writers, the simulator, rank_slices) reads a rank's ops as one
        # block of rows; rows given out of rank order are put in order, each rank's own kept
        ranks = self.ops["rank"].to_numpy() if self.ops.num_rows else np.empty(0, np.int64)
        if len(ranks) > 1 and bool((np.diff(ranks) < 0).any()):
            order = np.argsort(ranks, kind="stable")
            object.__setattr__(self, "ops", self.ops.take(pa.array(order)))

    @property
    def num_ops(self) -> int:
        return self.ops.num_rows

    @property
    def num_deps(self) -> int:
        return self.deps.num_rows

    @property
    def num_missing(self) -> int:
        return self.missing.num_rows

    @property
    def ranks(self) -> list[int]:
        """Distinct ranks, ascending."""
        return sorted(pc.unique(self.ops["rank"]).to_pylist())

    @property
    def num_ranks(self) -> int:
        return len(pc.unique(self.ops["rank"])) if self.ops.num_rows else 0

    def rank_slices(self) -> dict[int, tuple[int, int]]:
        """``{rank: (first_row, end_row)}`` of each rank's block in ``ops``."""
        ranks = self.ops["rank"].to_numpy()
        if len(ranks) == 0:
            return {}
        cuts = np.flatnonzero(np.diff(ranks)) + 1
        starts = np.concatenate([[0], cuts])
        ends = np.concatenate([cuts, [len(ranks)]])
        return {int(ranks[s]): (int(s), int(e)) for s, e in zip(starts, ends, strict=True)}

    def replace(self, **changes: Any) -> Trace:
        """A copy with some fields changed (the trace itself is immutable)."""
        values = {f: getattr(self, f) for f in self.__dataclass_fields__}
        values.update(changes)
        return Trace(**values)


def ops_table(columns: Mapping[str, Any], *, num_rows: int | None = None) -> pa.Table:
    """Build an ``ops`` table from a partial mapping of columns; the rest are null.

    Generators use this: give ``rank``, ``id``, ``name``, ``type`` and whatever
    promoted attributes apply; ``attrs`` may carry :func:`encode_attrs` output.
    """
    n = num_rows
    if n is None:
        n = len(next(iter(columns.values())))
    arrays = []
    for f in OPS_SCHEMA:
        if f.name in columns:
            arrays.append(pa.array(columns[f.name], type=f.type))
        elif f.name in ("duration_micros", "start_time_micros"):
            arrays.append(pa.array(np.zeros(n, dtype=np.uint64)))
        elif f.name == "name":
            arrays.append(pa.array([""] * n, type=pa.string()))
        else:
            arrays.append(pa.nulls(n, type=f.type))
    return pa.Table.from_arrays(arrays, schema=OPS_SCHEMA)


def deps_table(rank: Any, src: Any, dst: Any, kind: Any = "data", pos: Any = None) -> pa.Table:
    """Build a ``deps`` table; ``pos`` defaults to each edge's index in its dst's list."""
    src = np.asarray(src, dtype=np.uint64)
    dst = np.asarray(dst, dtype=np.uint64)
    rank = np.broadcast_to(np.asarray(rank, dtype=np.int32), src.shape)
    kinds = pa.array([kind] * len(src), pa.string()) if isinstance(kind, str) else pa.array(kind, pa.string())
    if pos is None:
        pos = _positions_within(rank, dst, kinds)
    return pa.Table.from_arrays(
        [pa.array(rank), pa.array(src), pa.array(dst), kinds, pa.array(np.asarray(pos, dtype=np.int32))],
        schema=DEPS_SCHEMA,
    )


def _positions_within(rank: np.ndarray, dst: np.ndarray, kinds: pa.Array) -> np.ndarray:
    """Index of each edge among the edges sharing its (rank, dst, kind), in input order."""
    n = len(dst)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    kind_code = dep_kind_codes(kinds)
    order = np.lexsort((np.arange(n), kind_code, dst, rank))
    r, d, k = rank[order], dst[order], kind_code[order]
    new_group = np.ones(n, dtype=bool)
    new_group[1:] = (r[1:] != r[:-1]) | (d[1:] != d[:-1]) | (k[1:] != k[:-1])
    group_start = np.maximum.accumulate(np.where(new_group, np.arange(n), 0))
    pos_sorted = np.arange(n) - group_start
    pos = np.empty(n, dtype=np.int32)
    pos[order] = pos_sorted
    return pos


def op_row_map(ops: pa.Table) -> dict[tuple[int, int], int]:
    """``{(rank, id): row}`` of ``ops``: for lookups one at a time of ids that may be absent
    (a rewrite's detail, a block's members); many at once that must exist: :func:`op_rows`.

    >>> op_row_map(ops_table({"rank": [0, 0, 1], "id": [5, 7, 5]}))
    {(0, 5): 0, (0, 7): 1, (1, 5): 2}
    """
    pairs = zip(ops["rank"].to_pylist(), ops["id"].to_pylist(), strict=True)
    return {(int(r), int(i)): k for k, (r, i) in enumerate(pairs)}


def op_rows(ops: pa.Table, rank: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Row in ``ops`` of each ``(rank[i], ids[i])``; every pair must exist.

    O((V + E) log V): one lexsort of the ops and one stable sort of the queries by
    rank (each skipped when already in order, as readers and generators emit them),
    then a binary search per rank over that rank's slice.
    """
    rank = np.asarray(rank, dtype=np.int64)
    op_rank = ops["rank"].to_numpy().astype(np.int64)
    op_id = ops["id"].to_numpy()
    if _sorted_by_rank_id(op_rank, op_id):  # the usual layout: readers and generators emit it
        order = np.arange(len(op_id))
        sorted_rank, sorted_id = op_rank, op_id
    else:
        order = np.lexsort((op_id, op_rank))
        sorted_rank, sorted_id = op_rank[order], op_id[order]
    ids = np.asarray(ids)
    # queries grouped by rank: contiguous already when they come rank by rank (deps do)
    qorder = None if len(rank) < 2 or bool(np.all(np.diff(rank) >= 0)) else np.argsort(rank, kind="stable")
    q_rank = rank if qorder is None else rank[qorder]
    q_ids = ids if qorder is None else ids[qorder]
    found = np.empty(len(ids), dtype=np.int64)
    ranks = np.unique(q_rank)
    q_lo = np.searchsorted(q_rank, ranks, side="left")
    q_hi = np.searchsorted(q_rank, ranks, side="right")
    o_lo = np.searchsorted(sorted_rank, ranks, side="left")
    o_hi = np.searchsorted(sorted_rank, ranks, side="right")
    for ql, qh, a, b in zip(q_lo.tolist(), q_hi.tolist(), o_lo.tolist(), o_hi.tolist(), strict=True):
        found[ql:qh] = order[a + np.searchsorted(sorted_id[a:b], q_ids[ql:qh])]
    if qorder is None:
        return found
    out = np.empty(len(ids), dtype=np.int64)
    out[qorder] = found
    return out


def _sorted_by_rank_id(rank: np.ndarray, ids: np.ndarray) -> bool:
    """Whether rows are already in ascending (rank, id) order (O(n), no sort)."""
    if len(rank) < 2:
        return True
    dr = np.diff(rank)
    return bool(np.all((dr > 0) | ((dr == 0) & (ids[1:] > ids[:-1]))))


def member_number(member: str) -> int:
    """Field number of an AttributeProto oneof member (``"int64_val"`` → 9)."""
    return _MEMBER_NUMBER[member]


def attribute(name: str, member: str, value: Any) -> Any:
    """One AttributeProto message (used by writers)."""
    a = AttributeProto(name=name)
    if member.endswith("_list"):
        getattr(a, member).values.extend(value)
    else:
        setattr(a, member, value)
    return a
