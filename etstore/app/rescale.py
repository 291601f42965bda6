"""Rescale a stored trace: load it, rescale it (:mod:`etstore.analysis.rescale`, pure), and store
the result with the trace as its parent (what ``etstore rescale`` runs)."""

from __future__ import annotations

from etstore.analysis.rescale import rescale
from etstore.store.base import IngestReport, Store

__all__ = ["rescale_stored"]


def rescale_stored(
    store: Store,
    trace: str,
    *,
    ranks: int | None = None,
    dp: int | None = None,
    tp: int | None = None,
    pp: int | None = None,
    source_tp: int | None = None,
    name: str | None = None,
) -> IngestReport:
    """Rescale a stored trace (:func:`~etstore.analysis.rescale.rescale`) and store the result with
    ``parent = trace``.

    Returns
    -------
    IngestReport
        Of the stored result; its ``params["rescaled"]`` records the derivation.

    Raises
    ------
    UnknownTraceError
        No such trace.
    OptionError, RewriteError
        As :func:`~etstore.analysis.rescale.rescale`; nothing is stored.
    """
    out = rescale(store.load(trace), ranks=ranks, dp=dp, tp=tp, pp=pp, source_tp=source_tp, name=name)
    return store.ingest(out, name=name or out.name, parent=trace)
