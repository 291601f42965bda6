"""Stores: the embedded default (Ladybug + DuckDB + catalog) and Neo4j, one interface."""

from __future__ import annotations

import os
from pathlib import Path

from etstore.errors import StoreError
from etstore.store.base import IngestReport, Store, TraceInfo
from etstore.store.embedded import EmbeddedStore
from etstore.store.result import Result

__all__ = [
    "DEFAULT_STORE",
    "ENV_VAR",
    "EmbeddedStore",
    "IngestReport",
    "Result",
    "Store",
    "TraceInfo",
    "open_store",
]

DEFAULT_STORE = ".etstore"
ENV_VAR = "ETSTORE_STORE"


def open_store(location: str | os.PathLike[str] | None = None, *, read_only: bool = False) -> Store:
    """Open a store: a directory (embedded) or a ``neo4j://`` / ``bolt://`` URL.

    ``location`` defaults to ``$ETSTORE_STORE``, then ``./.etstore``.
    """
    loc = str(location) if location is not None else os.environ.get(ENV_VAR) or DEFAULT_STORE
    scheme = loc.split("://", 1)[0].lower() if "://" in loc else ""
    if scheme in ("neo4j", "neo4j+s", "neo4j+ssc", "bolt", "bolt+s", "bolt+ssc"):
        try:
            from etstore.store.neo4j import Neo4jStore  # type: ignore[import-not-found]
        except ImportError as exc:
            raise StoreError(f"the Neo4j backend is not available in this build: {exc}") from exc
        return Neo4jStore(loc, read_only=read_only)
    if scheme:
        raise StoreError(f"unknown store URL scheme {scheme!r}; use a directory path or neo4j:// / bolt://")
    return EmbeddedStore(Path(loc), read_only=read_only)
