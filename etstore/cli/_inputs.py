"""A command's trace argument: a stored trace's name, or a file or directory to read.

Apart from :mod:`etstore.cli._common` so that commands which read no files (``ls``,
``rm``, ``topo``...) do not import every reader of :mod:`etstore.ingest`.
"""

from __future__ import annotations

from pathlib import Path

from etstore.errors import UnknownTraceError
from etstore.ingest import read_trace
from etstore.ingest.files import names_rank_files
from etstore.model import Trace
from etstore.store import Store

__all__ = ["trace_from"]


def trace_from(store: Store | None, spec: str) -> Trace:
    """A stored trace by name, or, when ``spec`` names an existing file or directory, read it.

    Parameters
    ----------
    store
        The open store whose names are looked up first; None where no store exists yet.
    spec
        A stored trace's name, or a path, glob or ``[<dir>/]<prefix>`` of trace files.

    Returns
    -------
    Trace
        The stored trace, or the one read from the files.

    Raises
    ------
    UnknownTraceError
        ``spec`` is neither stored nor a path (the message names what is stored).
    TraceFormatError
        The files cannot be read as a trace.

    Notes
    -----
    One catalog listing, then one load or one read.
    """
    if store is not None and spec in {t.name for t in store.traces()}:
        return store.load(spec)
    if Path(spec).exists() or "/" in spec or any(ch in spec for ch in "*?[") or names_rank_files(spec):
        return read_trace(spec)
    if store is None:
        raise UnknownTraceError(f"no trace named {spec!r}: no such file, and no store exists yet (--store)")
    return store.load(spec)  # raises UnknownTraceError naming what is stored
