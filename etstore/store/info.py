"""What a store says about one stored trace (:class:`TraceInfo`): a name and its content's counts.

Every backend returns it (``Store.traces``, ``Store.info``, ingest reports) and
``etstore ls`` lists it, so it needs nothing but the standard library: listing an
embedded store reads it from the catalog alone (:mod:`etstore.store.listing`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = ["FORMAT_VERSION", "TraceInfo"]

FORMAT_VERSION = 3
"""Version of the embedded store's layout this etstore writes (1: before names; 2: names and
contents in a SQLite catalog beside DuckDB; 3: DuckDB alone holds the store, the graph is a
derived index; :mod:`etstore.store._format`)."""


@dataclass(frozen=True)
class TraceInfo:
    """A stored trace as the catalog knows it."""

    name: str
    kind: str
    source: str
    content_hash: str
    ranks: int
    ops: int
    deps: int
    missing: int
    messages: int
    parent: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    created: datetime | None = None
    trace_id: int | None = None
    """The stored content this name points at; names with equal ``trace_id`` share one content."""

    def as_row(self) -> dict[str, Any]:
        """JSON-able dict (for ``--format json``)."""
        return {
            "name": self.name,
            "kind": self.kind,
            "ranks": self.ranks,
            "ops": self.ops,
            "deps": self.deps,
            "missing": self.missing,
            "messages": self.messages,
            "parent": self.parent,
            "source": self.source,
            "content_hash": self.content_hash,
            "trace_id": self.trace_id,
            "params": json.dumps(dict(self.params), sort_keys=True),
            "created": self.created.isoformat(timespec="seconds") if self.created else None,
        }
