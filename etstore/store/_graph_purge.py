"""Removing one content's ops and edges from the graph index, and starting the index over.

Ladybug deletes at about 10 µs per node or edge (its primary-key index and both
directions of every edge list are updated one entry at a time): ~24 s for a 1M-op trace
with its 1.5M edges. Building the graph from the warehouse costs ~2 s per 1M ops kept
(with their edges). So the graph index (:mod:`etstore.store._graph_index`) deletes a
removed content in place (:func:`delete_range`) only when what stays is more than
:data:`REBUILD_RATIO` times what goes, and otherwise starts over (:func:`discard_graph`).
Either is safe to cut short: the index's state stays dirty until it is done, and a dirty
index is built over.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["REBUILD_RATIO", "Step", "delete_range", "discard_graph"]

REBUILD_RATIO = 8.0
"""Start over when the ops that stay number fewer than this many times the ops removed
(measured on 1M-op traces: deleting costs ~24 µs per op removed, rebuilding ~2.2 µs per
op kept; the margin covers traces with more edges per op)."""

Step = Callable[[str], None]
"""``step(what)``: one more stage of a removal is starting."""


def delete_range(conn: Any, lo: int, hi: int, step: Step) -> None:
    """Delete the ops with uids in ``[lo, hi)`` and every edge touching them, in place.

    Notes
    -----
    O(removed nodes + edges) at Ladybug's per-entry delete cost; edges first, one table
    at a time (faster than ``DETACH DELETE``), then the nodes, then one checkpoint.
    """
    p = {"lo": lo, "hi": hi}
    for rel, end in (("DEP", "a"), ("MSG", "a"), ("BECOMES", "a"), ("BECOMES", "b")):
        step(f"{rel} edges")
        conn.execute(f"MATCH (a:Op)-[r:{rel}]->(b:Op) WHERE {end}.uid >= $lo AND {end}.uid < $hi DELETE r", p)
    step("ops")
    conn.execute("MATCH (o:Op) WHERE o.uid >= $lo AND o.uid < $hi DETACH DELETE o", p)
    step("checkpoint")
    conn.execute("CHECKPOINT")


def discard_graph(db: Path) -> None:
    """Remove the graph database file ``db`` and every file Ladybug keeps beside it (idempotent;
    the database must be closed)."""
    for f in (db, *_sidecars(db)):
        if f.is_dir():
            shutil.rmtree(f)
        else:
            f.unlink(missing_ok=True)


# the parts of the names Ladybug gives the files beside a database file: <db>.wal,
# <db>.wal.checkpoint, <db>.checkpoint.apply.lock, <db>.checkpoint.intent.lock, <db>.lock, ...
_SIDECAR_PARTS = frozenset({"wal", "checkpoint", "apply", "intent", "lock", "shadow", "tmp"})


def _sidecars(db: Path) -> list[Path]:
    """The files Ladybug keeps beside the database file ``db`` (not another database such as
    ``<db>.rebuild``)."""
    if not db.parent.is_dir():
        return []
    prefix = db.name + "."
    return [
        f
        for f in db.parent.iterdir()
        if f.name.startswith(prefix) and set(f.name[len(prefix) :].split(".")) <= _SIDECAR_PARTS
    ]
