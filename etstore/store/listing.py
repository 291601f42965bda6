"""The list of stored traces, read from an embedded store's catalog without its engines.

``etstore ls`` needs only names and counts, which the catalog (stdlib ``sqlite3``) holds;
opening the whole store would load DuckDB, Ladybug, numpy and pyarrow first. A listing
is a reader like any other: it takes the store's lock shared (waiting for a writer,
:mod:`etstore.store._lock`) and reads only when nothing is left to recover. When the
catalog alone cannot answer as the store would, :func:`list_traces` returns None and
the caller opens the store (:func:`~etstore.store.opening.open_store`), which then does
what it always does: a server URL, a directory that is not a store yet (the open
creates it), a write interrupted in another process (the open rolls it back or finishes
it from the journal, :mod:`etstore.store._journal`), a catalog of another format (the
open refuses it or says how to upgrade it).
"""

from __future__ import annotations

import os
from pathlib import Path

from etstore.store._location import resolve_location, store_exists
from etstore.store._lock import WaitFn
from etstore.store._session import Session
from etstore.store.catalog import FORMAT_VERSION, Catalog
from etstore.store.info import TraceInfo

__all__ = ["catalog_traces", "list_traces"]


def catalog_traces(catalog: Catalog) -> list[TraceInfo]:
    """Every name of a ready content in ``catalog``, oldest first, as the store lists it.

    Parameters
    ----------
    catalog
        An open catalog of format :data:`~etstore.store.catalog.FORMAT_VERSION`.

    Returns
    -------
    list of TraceInfo
        One per name (names sharing one content each appear).

    Raises
    ------
    StoreError
        SQLite refuses the catalog.

    Notes
    -----
    One SQLite query, O(names).
    """
    return [n.info(c) for n, c in catalog.names()]


def list_traces(
    location: str | os.PathLike[str] | None = None,
    *,
    wait_s: float | None = None,
    notify: WaitFn,
    purpose: str = "",
) -> list[TraceInfo] | None:
    """The traces an embedded store holds, from its catalog alone; None when the store must be opened.

    Parameters
    ----------
    location
        As :func:`~etstore.store.opening.open_store` takes it (default ``$ETSTORE_STORE``,
        then ``./.etstore``).
    wait_s
        How long to wait for a writer holding the store, in seconds (default
        ``$ETSTORE_WAIT``, then 300).
    notify
        Told in one line whom the listing waits for.
    purpose
        What this process is doing (shown to processes that wait for it).

    Returns
    -------
    list of TraceInfo or None
        What ``Store.traces`` returns on the same store; None for a server URL, a
        directory without a catalog, a write left to recover, or a catalog of another
        format (see the module docstring): open the store for those.

    Raises
    ------
    StoreError
        The URL scheme is unknown, a writer held the store for longer than ``wait_s``,
        or SQLite refuses the catalog.

    Notes
    -----
    Reads the journal and one SQLite query, O(names); writes nothing.
    """
    loc, backend = resolve_location(location)
    if backend != "directory" or not store_exists(loc):
        return None
    path = Path(loc)
    session = Session(path, write=False, purpose=purpose, wait_s=wait_s, notify=notify)
    try:
        if session.interrupted() is not None:
            return None
        catalog = Catalog(path / "catalog.sqlite", create=False)
        try:
            if catalog.format_version() != FORMAT_VERSION:
                return None
            return catalog_traces(catalog)
        finally:
            catalog.close()
    finally:
        session.close()
