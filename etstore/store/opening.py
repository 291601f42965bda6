"""Opening a store: a location (a directory or a server URL) to the backend that serves it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from etstore.store._location import resolve_location
from etstore.store.base import Store
from etstore.store.embedded import EmbeddedStore
from etstore.store.neo4j import Neo4jStore

__all__ = ["open_store"]


def open_store(
    location: str | os.PathLike[str] | None = None,
    *,
    read_only: bool = False,
    wait_s: float | None = None,
    notify: Callable[[str], None] | None = None,
    purpose: str = "",
) -> Store:
    """Open a store: a directory (embedded) or a ``neo4j://`` / ``bolt://`` URL.

    Parameters
    ----------
    location
        A store directory or a server URL; default ``$ETSTORE_STORE``, then ``./.etstore``.
    read_only
        Open without write access (several readers may share an embedded store).
    wait_s, notify, purpose
        An embedded store: how long to wait for another process's write (seconds; default
        ``$ETSTORE_WAIT``, then 300), a function told once in one line whom it waits for,
        and what this process is doing (shown to processes that wait for it). A server
        serializes writers itself and ignores them.

    Returns
    -------
    Store
        The opened store (a context manager that closes it).

    Raises
    ------
    StoreError
        The URL scheme is unknown, or the store cannot be opened.

    Notes
    -----
    Listing an embedded store needs none of this (:func:`etstore.store.listing.list_traces`).
    """
    loc, backend = resolve_location(location)
    if backend == "neo4j":
        return Neo4jStore(loc, read_only=read_only)
    return EmbeddedStore(Path(loc), read_only=read_only, wait_s=wait_s, notify=notify, purpose=purpose)
