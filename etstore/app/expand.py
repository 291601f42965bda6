"""Expansion against a store: algorithms named by stored trace, the result stored with its lineage.

:func:`resolve_algorithm` turns a name into a stored algorithm trace or a generator
spec; :func:`expand_stored` loads the workload, runs :func:`~etstore.algorithms.expand.expand`
and ingests the expanded trace (and any generated algorithm) all or nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from etstore.algorithms.expand import Expansion, expand
from etstore.algorithms.specs import parse_generator
from etstore.errors import OptionError
from etstore.model import Trace
from etstore.progress import ProgressFn
from etstore.store import IngestReport, Store

__all__ = ["StoredExpansion", "expand_stored", "resolve_algorithm"]


@dataclass(frozen=True)
class StoredExpansion:
    """What :func:`expand_stored` did: the expansion, the ingest report of the new
    trace, and the stored name of each algorithm used (by the expansion's label)."""

    expansion: Expansion
    report: IngestReport
    algorithm_names: Mapping[str, str]


def resolve_algorithm(
    store: Store | None, spec: str | Trace, loaded: dict[str, Trace] | None = None
) -> str | Trace:
    """A stored algorithm trace by name, else a generator spec (``ring``, ``ring:2``), checked.

    Parameters
    ----------
    store
        An open store; None where there is none (only generators resolve).
    spec
        A trace (returned as it is) or a name.
    loaded
        Traces already loaded by name; a loaded one is added here.

    Raises
    ------
    OptionError
        The name is a stored trace that is not an algorithm, or neither a stored
        trace nor a generator spec (the message lists the generators).
    """
    if isinstance(spec, Trace):
        return spec
    loaded = {} if loaded is None else loaded
    if spec in loaded:
        return loaded[spec]
    if store is not None and spec in {t.name for t in store.traces()}:
        trace = store.load(spec)
        if trace.kind != "algorithm":
            raise OptionError(f"{spec!r} is a {trace.kind} trace, not an algorithm")
        loaded[spec] = trace
        return trace
    parse_generator(spec)  # raises naming the generators and the stored traces are not it
    return spec


def expand_stored(
    store: Store,
    workload: str,
    algorithms: str | Trace | Mapping[str, str | Trace],
    *,
    where: str | None = None,
    reduce_duration_micros: int | None = None,
    name: str | None = None,
    progress: ProgressFn | None = None,
) -> StoredExpansion:
    """Expand stored trace ``workload`` and store the result with its lineage.

    ``algorithms`` is as for :func:`expand`, except that a string may also name a
    stored algorithm trace. Generated algorithms are stored too, so the expanded
    trace's ``params["algorithms"]`` names stored traces; if the expanded trace then
    fails to land, the names stored here are removed again (nothing partial).

    The result is stored as ``name`` (default ``<workload>-expanded``, with ``-2``, ...
    when that name holds other content) with ``workload`` as its parent, even when the
    same content is already stored under another name: the new name then shares that
    content (``report.same_as``) and keeps its own parent and parameters.

    ``progress(phase, done, total)`` sees :func:`~etstore.algorithms.expand.expand`'s
    phases, then the store's ingest phases of the expanded trace, each prefixed ``store``.

    Raises
    ------
    UnknownTraceError
        ``workload`` is not stored.
    OptionError, ExpansionError, QueryError
        As :func:`resolve_algorithm` and :func:`~etstore.algorithms.expand.expand`.
    """
    trace = store.load(workload)
    loaded: dict[str, Trace] = {}
    if isinstance(algorithms, Mapping):
        specs: Any = {k: resolve_algorithm(store, v, loaded) for k, v in algorithms.items()}
    else:
        specs = resolve_algorithm(store, algorithms, loaded)
    result = expand(
        trace, specs, where=where, reduce_duration_micros=reduce_duration_micros, name=name, progress=progress
    )
    stored = None if progress is None else _prefixed(progress, "store")
    names: dict[str, str] = {}
    created: list[str] = []
    try:
        for label, alg in result.algorithms.items():
            if any(alg is t for t in loaded.values()):  # already stored: keep its name
                names[label] = alg.name
                continue
            got = store.ingest(alg)
            names[label] = got.trace.name
            if got.created:
                created.append(got.trace.name)
        params = dict(result.trace.params)
        params["algorithms"] = {t: names.get(a, a) for t, a in params["algorithms"].items()}
        report = store.ingest(
            result.trace.replace(params=params),
            name=name,
            parent=workload,
            lineage=result.lineage,
            progress=stored,
        )
    except BaseException:
        for stored_name in created:
            store.remove(stored_name)
        raise
    return StoredExpansion(result, report, names)


def _prefixed(progress: ProgressFn, prefix: str) -> ProgressFn:
    """``progress`` with every phase name prefixed (one bar shows expansion, then storing)."""

    def step(phase: str, done: int, total: int) -> None:
        progress(f"{prefix} {phase}", done, total)

    return step
