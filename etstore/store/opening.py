"""Opening a store: a location (a directory or a server URL) to the backend that serves it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from etstore.errors import OptionError
from etstore.store._location import resolve_location
from etstore.store.base import Store
from etstore.store.embedded import EmbeddedStore
from etstore.store.neo4j import Neo4jStore

__all__ = ["open_store"]


def open_store(
    location: str | os.PathLike[str] | None = None,
    *,
    write: bool = False,
    read_only: bool | None = None,
    wait_s: float | None = None,
    notify: Callable[[str], None] | None = None,
    purpose: str = "",
) -> Store:
    """Open a store: a directory (embedded), or a ``neo4j://`` / ``bolt://`` URL (what stores
    published to that server, read only); read-only unless ``write=True``.

    Parameters
    ----------
    location
        A store directory or a server URL; default ``$ETSTORE_STORE``, then ``./.etstore``.
    write
        Open for writing (ingest, remove, record runs): a directory only, since a server holds
        what ``etstore publish`` sends it. An embedded store then has this
        handle as its only writer until it is closed: leaving its ``with`` block, ``close()``,
        or, for a handle dropped without either, when it is garbage-collected or the
        interpreter exits. Other processes' commands wait for it meanwhile.
    read_only
        The older spelling: ``read_only=False`` is ``write=True``; ``read_only=True`` is
        the default.
    wait_s, notify, purpose
        An embedded store: how long to wait for another process's write (seconds; default
        ``$ETSTORE_WAIT``, then 300), a function told once in one line whom it waits for,
        and what this process is doing (shown to processes that wait for it). A server
        ignores them.

    Returns
    -------
    Store
        The opened store (a context manager that closes it). A read-only one shares an
        embedded store with other readers (``etstore ls``, ``sql``, ``show`` in other
        processes go on beside it) and refuses ``ingest``, ``remove`` and other writes.

    Raises
    ------
    OptionError
        ``write=True`` together with ``read_only=True``.
    StoreError
        The URL scheme is unknown, a server URL with ``write=True`` (one line saying to
        write a store directory and publish it), or the store cannot be opened.

    Notes
    -----
    Listing an embedded store needs none of this (:func:`etstore.store.listing.list_traces`).

    Examples
    --------
    >>> import tempfile
    >>> from etstore.testing import p2p_trace
    >>> where = tempfile.mkdtemp()
    >>> with open_store(where, write=True) as store:
    ...     _ = store.ingest(p2p_trace(1024))
    >>> with open_store(where) as store:
    ...     [t.name for t in store.traces()]
    ['p2p']
    """
    if read_only is not None:
        if read_only and write:
            raise OptionError("open_store: write=True and read_only=True contradict each other")
        write = not read_only
    loc, backend = resolve_location(location)
    if backend == "neo4j":
        return Neo4jStore(loc, read_only=not write)
    return EmbeddedStore(Path(loc), read_only=not write, wait_s=wait_s, notify=notify, purpose=purpose)
