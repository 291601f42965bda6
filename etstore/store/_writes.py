"""The embedded store's writes to its warehouse, each one DuckDB transaction: a new content with
its first name, a further name, a removal.

:class:`~etstore.store.embedded.EmbeddedStore` decides what to write (names, identity, the
journal); this module writes it, so that a content's rows, its catalog row and its name
commit together (``docs/store.md``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from etstore.dag import cycle_members
from etstore.model import Trace
from etstore.progress import ProgressFn
from etstore.store import _streamed as streamed
from etstore.store import _trace_rows as rows
from etstore.store._identity import choose_name, identity
from etstore.store.catalog import Catalog, ContentRecord, NameRecord
from etstore.store.graph import dep_edges, lineage_edges, message_edges, uid_base
from etstore.store.warehouse import Warehouse

__all__ = ["add_name", "drop_name", "write_content", "write_parts"]


def write_content(
    wh: Warehouse,
    trace: Trace,
    rec: ContentRecord,
    name: NameRecord,
    lineage: pa.Table | None,
    progress: ProgressFn | None,
) -> tuple[int, int, int]:
    """Store ``trace`` as the new content ``rec`` named ``name`` (with ``lineage`` from
    ``name.parent_trace_id``), in one transaction; returns the ops on dependency cycles and
    the unmatched sends and receives. ``rec.content_hash`` empty: the identity is computed
    here, beside the inserts.

    Notes
    -----
    Three lanes on two cores: DuckDB inserts the ops while one helper computes the edge rows
    and another the identity (DuckDB, numpy and hashlib release the GIL).
    """
    catalog = Catalog(wh)
    with ThreadPoolExecutor(max_workers=2) as pool:
        hashed = pool.submit(identity, trace) if not rec.content_hash else None
        with wh.transaction():
            catalog.claim(rec)
            assert rec.trace_id is not None
            base = uid_base(rec.trace_id)
            edges = pool.submit(_edge_rows, trace, base)
            if progress:
                progress("warehouse", 0, trace.num_ops)
            rows.insert_ops(wh, trace, rec.trace_id, base)
            deps, (msgs, unmatched_sends, unmatched_recvs), cycles = edges.result()
            rows.insert_edges(wh, trace, rec.trace_id, deps)
            rows.insert_messages(wh, rec.trace_id, msgs)
            rec.ops, rec.deps, rec.missing = trace.num_ops, trace.num_deps, trace.num_missing
            rec.messages = msgs.num_rows
            if hashed is not None:
                rec.content_hash = hashed.result()
            catalog.ready(rec)
            name.trace_id = rec.trace_id
            catalog.add_name(name, rec, trace.params)
            pid = name.parent_trace_id
            if lineage is not None and lineage.num_rows and pid is not None:
                child = pa.table(
                    {
                        "rank": trace.ops["rank"],
                        "id": trace.ops["id"],
                        "uid": pa.array(np.arange(base, base + trace.num_ops, dtype=np.int64)),
                    }
                )
                rows.insert_lineage(wh, rec.trace_id, pid, _lineage_rows(wh, lineage, child, name.name, pid))
    if progress:
        progress("warehouse", trace.num_ops, trace.num_ops)
    return cycles, unmatched_sends, unmatched_recvs


def write_parts(
    wh: Warehouse,
    first: Trace,
    parts: Iterable[Trace],
    rec: ContentRecord,
    name: NameRecord,
    *,
    taken: bool,
    ops: int | None,
    progress: ProgressFn | None,
) -> tuple[streamed.Staged, ContentRecord | None]:
    """Store a trace given part by part (``first``: its head) as the claimed content ``rec``
    named ``name``; returns what was staged and the stored content of the same identity, if
    any (then these rows are dropped again and nothing is named). ``taken``: ``name`` is held
    already, which only this very content may do.

    Each part's rows commit on their own (one transaction would hold them all in memory); the
    content stays ``loading``, out of every view, until its name commits with its counts. Any
    failure drops the rows (else the next writable open sweeps them).
    """
    catalog = Catalog(wh)
    assert rec.trace_id is not None
    try:
        with streamed.memory_limit(wh, "512MB"):  # else DuckDB caches up to 80% of RAM
            staged = streamed.stage_parts(
                wh,
                first,
                parts,
                trace_id=rec.trace_id,
                base=uid_base(rec.trace_id),
                name=name.name,
                ops=ops,
                progress=progress,
            )
        known = catalog.by_identity(staged.digest, rec.kind)
        if known is None and taken:
            choose_name(
                catalog.name_ids(), name.name, explicit=True, trace_id=None
            )  # raises: other content holds it
        if known is None:
            for k, v in staged.counts().items():
                setattr(rec, k, v)
            rec.content_hash = staged.digest
            name.trace_id = rec.trace_id
            with wh.transaction():
                catalog.ready(rec)
                catalog.add_name(name, rec, first.params)
    except BaseException:
        with contextlib.suppress(Exception), wh.transaction():
            catalog.delete_content(rec.trace_id)
        raise
    if known is not None:
        with wh.transaction():
            catalog.delete_content(rec.trace_id)
    return staged, known


def add_name(
    wh: Warehouse, content: ContentRecord, name: NameRecord, params: object, lineage: pa.Table | None
) -> None:
    """Point ``name`` at stored ``content``, with ``lineage`` from ``name.parent_trace_id`` when
    the content has none from that parent yet, in one transaction."""
    assert content.trace_id is not None
    catalog, tid, pid = Catalog(wh), content.trace_id, name.parent_trace_id
    name.trace_id = tid
    with wh.transaction():
        catalog.add_name(name, content, params)
        if (
            lineage is not None
            and lineage.num_rows
            and pid is not None
            and catalog.lineage_users(tid, pid) == 1
        ):
            child = wh.query("SELECT rank, id, uid FROM trace_ops WHERE trace_id = $t", {"t": tid}).to_arrow()
            rows.insert_lineage(wh, tid, pid, _lineage_rows(wh, lineage, child, name.name, pid))


def drop_name(wh: Warehouse, name: str) -> bool:
    """Remove ``name``, and its content with its last name (its lineage from a parent with the
    last name derived from it), in one transaction; False when there is no such name."""
    catalog = Catalog(wh)
    got = catalog.name(name)
    if got is None:
        return False
    rec = got[0]
    with wh.transaction():
        catalog.drop_name(name)
        if not catalog.names_of(rec.trace_id):
            catalog.delete_content(rec.trace_id)
        elif rec.parent_trace_id is not None and not catalog.lineage_users(rec.trace_id, rec.parent_trace_id):
            rows.delete_lineage(wh, rec.trace_id, rec.parent_trace_id)
    return True


def _lineage_rows(wh: Warehouse, lineage: pa.Table, child: pa.Table, name: str, parent_id: int) -> pa.Table:
    """``trace_lineage`` rows for a name derived from content ``parent_id`` (``child``: the
    derived content's ``rank``, ``id``, ``uid``)."""
    parent_ops = wh.query(
        "SELECT rank, id, uid FROM trace_ops WHERE trace_id = $p", {"p": parent_id}
    ).to_arrow()
    links = lineage_edges(lineage, child, parent_ops, what=f"trace {name!r}")
    return pa.table(
        {
            "rank": lineage["rank"].cast(pa.int32()),
            "id": lineage["id"].cast(pa.uint64()),
            "parent_id": lineage["parent_id"].cast(pa.uint64()),
            "parent_uid": links["from"],
            "uid": links["to"],
        }
    )


def _op_keys(wh: Warehouse, trace_id: int) -> pa.Table:
    """``rank``, ``id``, ``uid`` of stored content ``trace_id``'s ops."""
    return wh.query("SELECT rank, id, uid FROM trace_ops WHERE trace_id = $t", {"t": trace_id}).to_arrow()


def _edge_rows(trace: Trace, base: int) -> tuple[pa.Table, tuple[pa.Table, int, int], int]:
    """A trace's dependency rows by uid, its message pairs (with the unmatched sends and
    receives) and how many ops lie on dependency cycles, for a content stored from ``base``."""
    deps = dep_edges(trace, base)
    op_pairs = (deps["from"].to_numpy() - base, deps["to"].to_numpy() - base)
    return deps, message_edges(trace, base), len(cycle_members(trace, op_pairs))
