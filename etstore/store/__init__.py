"""Stores: the embedded default (Ladybug + DuckDB + catalog) and Neo4j, one interface."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from etstore.errors import StoreError
from etstore.store._neo4j_target import NEO4J_SCHEMES
from etstore.store.base import IngestReport, Store, TraceInfo
from etstore.store.embedded import EmbeddedStore
from etstore.store.neo4j import Neo4jStore
from etstore.store.result import Result
from etstore.store.warehouse import Warehouse

__all__ = [
    "DEFAULT_STORE",
    "ENV_VAR",
    "EmbeddedStore",
    "IngestReport",
    "Neo4jStore",
    "Result",
    "Store",
    "TraceInfo",
    "Warehouse",
    "open_store",
]

DEFAULT_STORE = ".etstore"
ENV_VAR = "ETSTORE_STORE"


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
    """
    loc = str(location) if location is not None else os.environ.get(ENV_VAR) or DEFAULT_STORE
    scheme = loc.split("://", 1)[0].lower() if "://" in loc else ""
    if scheme in NEO4J_SCHEMES:
        return Neo4jStore(loc, read_only=read_only)
    if scheme:
        raise StoreError(f"unknown store URL scheme {scheme!r}; use a directory path or neo4j:// / bolt://")
    return EmbeddedStore(Path(loc), read_only=read_only, wait_s=wait_s, notify=notify, purpose=purpose)
