"""A trace too large to hold at once, staged part by part for the embedded store.

The parts are consecutive rank ranges (:meth:`Store.ingest_parts
<etstore.store.base.Store.ingest_parts>`). Each part's rows go into the warehouse, one
DuckDB transaction each, then the part is dropped: what stays in memory across parts is the
digest's state and the compact endpoints of the sends and receives (about 24 bytes each),
which are paired once every part is in. The content stays ``loading`` (no name points at
it, so no view shows it) until its name commits.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import pyarrow as pa

from etstore.dag import Endpoints, cycle_members, message_endpoints, pair_endpoints
from etstore.digest import ContentDigest
from etstore.errors import StoreError
from etstore.model import Trace
from etstore.progress import ProgressFn
from etstore.store import _trace_rows as rows
from etstore.store._identity import upgraded_identity
from etstore.store.base import checked_kind
from etstore.store.graph import UID_SHIFT, dep_edges, message_rows
from etstore.store.warehouse import Warehouse

__all__ = [
    "Staged",
    "first_part",
    "gather",
    "memory_limit",
    "stage_parts",
]

_TABLES = ("ops", "deps", "missing", "meta")

log = logging.getLogger(__name__)


def head(trace: Trace) -> Trace:
    """The trace without its rows: what names it (name, kind, source, params)."""
    return trace.replace(**{t: getattr(trace, t).slice(0, 0) for t in _TABLES})


def first_part(parts: Iterable[Trace], what: str) -> tuple[Trace, Trace | None, Iterator[Trace]]:
    """The head of the trace (:func:`head` of the first part), the first part itself when it is
    the only one (a whole trace), and an iterator over all parts.

    Raises
    ------
    StoreError
        There is no part.
    """
    it = iter(parts)
    first = next(it, None)
    if first is None:
        raise StoreError(f"{what}: no parts to store")
    second = next(it, None)
    if second is None:
        return head(first), first, iter([first])
    return head(first), None, chain([first, second], it)


@dataclass
class Staged:
    """What staging found: the counts, the content digest, the cycles and unmatched messages."""

    ops: int = 0
    deps: int = 0
    missing: int = 0
    messages: int = 0
    ranks: int = 0
    cycles: int = 0
    unmatched_sends: int = 0
    unmatched_recvs: int = 0
    digest: str = ""  # the store's identity of the content (etstore.store._identity)
    sends: list[Endpoints] = field(default_factory=list)
    recvs: list[Endpoints] = field(default_factory=list)
    comm_sizes: list[pa.Array] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in ("ops", "deps", "missing", "messages", "ranks")}


def _check(part: Trace, first: Trace, index: int, last_rank: int, what: str) -> int:
    """The last rank the part holds rows of (``last_rank`` for a part with none); refuses a part
    that does not continue the trace (``first`` is its head: name, kind, source, params and
    table schemas) or holds an unknown dependency kind."""
    if (part.name, part.kind, part.source, dict(part.params)) != (
        first.name,
        first.kind,
        first.source,
        dict(first.params),
    ):
        raise StoreError(f"{what}: part {index} has another name, kind, source or params than part 0")
    for table in _TABLES:
        if getattr(part, table).schema != getattr(first, table).schema:
            raise StoreError(f"{what}: part {index} has another {table} schema than part 0")
    checked_kind(part)
    ranks = [getattr(part, t)["rank"].to_numpy() for t in _TABLES]
    ranks = [r for r in ranks if len(r)]
    if not ranks:
        return last_rank
    lo, hi = min(int(r.min()) for r in ranks), max(int(r.max()) for r in ranks)
    if lo <= last_rank:
        raise StoreError(
            f"{what}: part {index} starts at rank {lo}, not after the previous part's last rank {last_rank}"
        )
    return hi


def gather(parts: Iterable[Trace], what: str) -> Trace:
    """The parts as one trace, checked as :func:`stage_parts` checks them (for a backend that
    loads a whole trace at once)."""
    first, _, it = first_part(parts, what)
    kept, last_rank = [], -1
    for index, part in enumerate(it):
        last_rank = _check(part, first, index, last_rank, what)
        kept.append(part)
    tables = {t: pa.concat_tables([getattr(p, t) for p in kept]) for t in _TABLES}
    return first.replace(**tables)


def stage_parts(
    wh: Warehouse,
    first: Trace,
    parts: Iterable[Trace],
    *,
    trace_id: int,
    base: int,
    name: str,
    ops: int | None = None,
    progress: ProgressFn | None = None,
) -> Staged:
    """Write every part's warehouse rows (one transaction each: the caller removes them on
    failure, and bounds DuckDB's cache with :func:`memory_limit`), then the messages;
    returns what was found. ``first`` is the trace's head
    (:func:`first_part`), which every part is checked against.

    Raises
    ------
    StoreError
        A part does not continue the trace (another name, kind, source, params or table
        schema, ranks not after the previous part's), or the trace has more ops than a
        content may hold.
    """
    what = f"trace {name!r}"
    staged = Staged()
    digest = ContentDigest(str(first.kind))
    last_rank = -1
    for index, part in enumerate(parts):
        last_rank = _check(part, first, index, last_rank, what)
        off = staged.ops
        if off + part.num_ops >= 1 << UID_SHIFT:
            raise StoreError(f"{what}: more than 2^40 ops, the per-trace limit")
        digest.update(part)
        deps = dep_edges(part, base + off)
        with wh.transaction():
            rows.insert_part(wh, part, trace_id, base + off, deps, staged.deps, staged.missing)
        pairs = (deps["from"].to_numpy() - base - off, deps["to"].to_numpy() - base - off)
        staged.cycles += len(cycle_members(part, pairs))
        sends, recvs, n_sends, n_recvs = message_endpoints(part, off)
        staged.sends.append(sends)
        staged.recvs.append(recvs)
        staged.comm_sizes.append(part.ops["comm_size"].combine_chunks().take(pa.array(sends.row - off)))
        staged.unmatched_sends += n_sends
        staged.unmatched_recvs += n_recvs
        staged.ops += part.num_ops
        staged.deps += part.num_deps
        staged.missing += part.num_missing
        staged.ranks += len(np.unique(part.ops["rank"].to_numpy()))
        del deps, part
        if progress:
            progress("parts", staged.ops, max(ops or 0, staged.ops) if ops else 0)
    staged.digest = upgraded_identity(digest.hexdigest(), str(first.kind), first.params)
    _stage_messages(wh, staged, trace_id, base)
    return staged


@contextmanager
def memory_limit(wh: Warehouse, limit: str) -> Iterator[None]:
    """DuckDB's memory limit set to ``limit`` for the block (it caches what it wrote up to it)."""
    wh.execute(f"SET memory_limit = '{limit}'")
    try:
        yield
    finally:
        wh.execute("RESET memory_limit")


def _stage_messages(wh: Warehouse, staged: Staged, trace_id: int, base: int) -> None:
    """Pair the sends of each part with the receives from its ranks (the receives sorted by
    source rank once), in send order: the same messages, in the same order, as one pairing
    of the whole trace."""
    recvs = Endpoints(*(np.concatenate(cols) for cols in zip(*staged.recvs, strict=True)))
    staged.recvs.clear()
    order = np.argsort(recvs.src, kind="stable")
    recvs = Endpoints(*(col[order] for col in recvs))
    del order
    for sends, sizes in zip(staged.sends, staged.comm_sizes, strict=True):
        if len(sends.row):
            lo, hi = int(sends.src.min()), int(sends.src.max())
            a, b = np.searchsorted(recvs.src, [lo, hi + 1])
            mine = Endpoints(*(col[a:b] for col in recvs))
            send_row, recv_row, tag = pair_endpoints(sends, mine)
            size = sizes.take(pa.array(np.searchsorted(sends.row, send_row)))
        else:
            send_row = recv_row = tag = np.zeros(0, dtype=np.int64)
            size = pa.array([], pa.int64())
        msgs = message_rows(base, send_row, recv_row, tag, size)
        with wh.transaction():
            rows.insert_messages(wh, trace_id, msgs)
        staged.messages += msgs.num_rows
    staged.unmatched_sends -= staged.messages
    staged.unmatched_recvs -= staged.messages
    staged.sends.clear()
    staged.comm_sizes.clear()
    pa.default_memory_pool().release_unused()  # hand the endpoints' pages back
