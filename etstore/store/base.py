"""The store interface every backend implements (embedded Ladybug+DuckDB, Neo4j)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from etstore.model import Trace
from etstore.store.result import Result

__all__ = ["IngestReport", "Store", "TraceInfo"]


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
            "params": json.dumps(dict(self.params), sort_keys=True),
            "created": self.created.isoformat(timespec="seconds") if self.created else None,
        }


@dataclass(frozen=True)
class IngestReport:
    """What one ingest did: the trace and whether it was new."""

    trace: TraceInfo
    created: bool
    cycles: int = 0
    unmatched_sends: int = 0
    unmatched_recvs: int = 0
    seconds: float = 0.0


ProgressFn = Callable[[str, int, int], None]  # (stage, done, total)


@runtime_checkable
class Store(Protocol):
    """What every backend offers. Traces are addressed by name."""

    location: str
    duck: Any
    """The DuckDB warehouse connection (SQL tables and simulation metrics); both backends keep one."""

    def ingest(
        self,
        trace: Trace,
        *,
        name: str | None = None,
        parent: str | None = None,
        lineage: pa.Table | None = None,
        progress: ProgressFn | None = None,
    ) -> IngestReport:
        """Store a trace atomically; the same content twice returns the existing trace.

        ``parent`` names the stored trace it derives from; ``lineage`` (``rank``,
        ``id``, ``parent_id``) links parent ops to the ops replacing them
        (``BECOMES`` edges, ``lineage`` table).
        """
        ...

    def traces(self) -> list[TraceInfo]:
        """Every stored trace, oldest first."""
        ...

    def info(self, name: str) -> TraceInfo:
        """One trace's catalog entry; UnknownTraceError if absent."""
        ...

    def load(self, name: str) -> Trace:
        """The full columnar trace back (ops, deps, missing, meta)."""
        ...

    def remove(self, name: str) -> None:
        """Delete a trace everywhere; UnknownTraceError if absent."""
        ...

    def cypher(self, query: str, params: Mapping[str, Any] | None = None) -> Result:
        """Run Cypher on the graph store."""
        ...

    def sql(self, query: str, params: Mapping[str, Any] | None = None) -> Result:
        """Run SQL on the DuckDB warehouse (tables ops, deps, missing_deps, messages, traces)."""
        ...

    def close(self) -> None: ...
