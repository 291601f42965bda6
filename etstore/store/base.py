"""The store interface every backend implements (embedded Ladybug+DuckDB, Neo4j)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.compute as pc

from etstore.errors import StoreError
from etstore.model import DepKind, Trace, TraceKind
from etstore.progress import ProgressFn
from etstore.store.info import TraceInfo
from etstore.store.result import Result
from etstore.store.warehouse import Warehouse

__all__ = ["IngestReport", "ProgressFn", "Store", "TraceInfo", "checked_kind"]


@dataclass(frozen=True)
class IngestReport:
    """What one ingest did: the trace and whether it was new."""

    trace: TraceInfo
    created: bool
    """Whether the name is new (its content may still have been stored before: ``same_as``)."""
    same_as: str | None = None
    """When the content was already stored: its oldest other name (nothing was written but the name)."""
    cycles: int = 0
    unmatched_sends: int = 0
    unmatched_recvs: int = 0
    seconds: float = 0.0


def checked_kind(trace: Trace) -> TraceKind:
    """The trace's kind, after checking it and its dependency kinds are ones the store knows.

    Raises
    ------
    StoreError
        ``trace.kind`` is not a :class:`~etstore.model.TraceKind` value, or a ``deps`` or
        ``missing`` row has a ``kind`` that is not a :class:`~etstore.model.DepKind` value.

    Notes
    -----
    O(deps), one vectorised membership test per table.
    """
    try:
        kind = TraceKind(trace.kind)
    except ValueError:
        known = ", ".join(k.value for k in TraceKind)
        raise StoreError(
            f"trace {trace.name!r}: unknown kind {trace.kind!r} (expected one of {known})"
        ) from None
    allowed = pa.array([k.value for k in DepKind], pa.string())
    for table_name, table in (("deps", trace.deps), ("missing", trace.missing)):
        ok = pc.fill_null(pc.is_in(table["kind"], value_set=allowed), False)
        if table.num_rows and not pc.all(ok).as_py():
            bad = pc.filter(table["kind"], pc.invert(ok))[0].as_py()
            raise StoreError(
                f"trace {trace.name!r}: {table_name} row with dependency kind {bad!r} "
                f"(expected {' or '.join(k.value for k in DepKind)})"
            )
    return kind


@runtime_checkable
class Store(Protocol):
    """What every backend offers. Traces are addressed by name; a store is a context
    manager that closes itself."""

    location: str

    @property
    def warehouse(self) -> Warehouse:
        """The DuckDB warehouse: trace tables, the simulator's metrics and analyses (read-only)."""
        ...

    def ingest(
        self,
        trace: Trace,
        *,
        name: str | None = None,
        parent: str | None = None,
        lineage: pa.Table | None = None,
        progress: ProgressFn | None = None,
    ) -> IngestReport:
        """Store a trace atomically under a name; content already stored gets one more name.

        Parameters
        ----------
        trace
            The trace to store; its ``kind`` must be a :class:`~etstore.model.TraceKind`
            value and its dependency kinds :class:`~etstore.model.DepKind` values.
        name
            The stored name. Default: ``trace.name``, or ``trace.name-2``, ``-3``, ... when
            that is taken by other content; an explicit name that is taken by other
            content is an error. A name that already points at this content makes the
            call a no-op (``created`` false); a new name for content stored under
            another name points at that content (``same_as``) and stores nothing twice.
        parent
            The stored trace this one derives from (expanded, rewritten).
        lineage
            Columns ``rank``, ``id``, ``parent_id``: which parent op each op replaces
            (``BECOMES`` edges in the graph, rows of the ``lineage`` table). Needs ``parent``.
        progress
            Called as ``progress(stage, done, total)`` while the trace is written.

        Returns
        -------
        IngestReport
            The stored name's catalog entry, whether the name was new (``created``),
            the other name of its content if it was stored before (``same_as``), the
            dependency cycles and unmatched sends/receives found, and the wall time (s).

        Raises
        ------
        StoreError
            The store is read-only, ``name`` is taken by different content, the kind
            or a dependency kind is unknown, lineage comes without a parent, the
            lineage names absent ops, or an engine fails (nothing is left behind);
            a Neo4j server's reader refuses every ingest (data reaches a server by
            ``etstore publish``).
        UnknownTraceError
            ``parent`` is not a stored trace.

        Notes
        -----
        All or nothing: a failure or an interrupt undoes whatever landed, and a
        partial write left by a crash is removed at the next writable open.
        O(ops + deps) columnar work in both engines; known content costs one content
        hash (see :mod:`etstore.store._identity` for what counts as content).
        """
        ...

    def ingest_parts(
        self,
        parts: Iterable[Trace],
        *,
        name: str | None = None,
        ops: int | None = None,
        progress: ProgressFn | None = None,
    ) -> IngestReport:
        """Store a trace too large to hold at once, given as consecutive rank ranges.

        Parameters
        ----------
        parts
            :class:`~etstore.model.Trace` parts in ascending rank order, none sharing a
            rank with another, each holding its ranks' ops, deps, missing deps and
            metadata, and all with the name, kind, source and params of the first (e.g.
            :meth:`SynthResult.trace_parts <etstore.algorithms.synth.SynthResult.trace_parts>`).
            Read once.
        name
            As for :meth:`ingest`.
        ops
            How many ops the parts hold, when the producer knows (the ``parts`` phase of
            ``progress`` then counts ops against it; otherwise its total is 0).
        progress
            Called as ``progress(stage, done, total)``: ``parts`` (ops staged), ``graph``.

        Returns
        -------
        IngestReport
            As :meth:`ingest` returns for the whole trace: the same identity, counts,
            rows, messages and cycles as if the parts had been one trace.

        Raises
        ------
        StoreError
            As for :meth:`ingest`, or a part does not continue the trace (nothing is
            left behind).

        Notes
        -----
        The embedded store holds one part at a time plus about 24 bytes per send and
        receive; its graph loads table by table from files it spools inside the store,
        each table with a buffer pool sized from its rows.
        """
        ...

    def traces(self) -> list[TraceInfo]:
        """Every stored name, oldest first (names sharing one content each appear)."""
        ...

    def info(self, name: str) -> TraceInfo:
        """One trace's catalog entry; UnknownTraceError if absent."""
        ...

    def load(self, name: str) -> Trace:
        """The full columnar trace back (ops, deps, missing, meta)."""
        ...

    def remove(self, name: str) -> None:
        """Delete a name; its content goes with its last name. UnknownTraceError if absent."""
        ...

    def removed_names(self) -> list[str]:
        """Names removed lately and not stored again, so that a removal run again can say the
        name is gone instead of unknown (empty where the backend keeps no such record)."""
        ...

    def finished_removals(self) -> set[str]:
        """Names whose interrupted removal this open finished before anything else."""
        ...

    def index(self, progress: ProgressFn | None = None) -> bool:
        """Bring the graph Cypher reads up to date with the store (built from the warehouse
        where the graph is a derived index); True when it had to change. :meth:`cypher` does
        it anyway: calling it first lets a command show its progress."""
        ...

    def cypher(self, query: str, params: Mapping[str, Any] | None = None) -> Result:
        """Run Cypher on the graph store."""
        ...

    def sql(self, query: str, params: Mapping[str, Any] | None = None) -> Result:
        """Run SQL on the DuckDB warehouse (tables ops, deps, missing_deps, messages, traces)."""
        ...

    def close(self) -> None:
        """Release the engines (idempotent)."""
        ...

    def __enter__(self) -> Store:
        """The store itself; leaving the block closes it."""
        ...

    def __exit__(self, *exc: object) -> None:
        """Close the store."""
        ...
