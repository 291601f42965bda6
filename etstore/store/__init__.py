"""Stores: the embedded default (Ladybug + DuckDB + catalog), and a Neo4j server's published
data read through the same interface.

Every name is imported on first use (PEP 562), so importing the package, or a light module
of it (the catalog, the lock, the listing of an embedded store that ``etstore ls`` reads, the
table-set declarations ``import etstore`` fills), loads no engine, numpy or pyarrow, and
nothing the module asked for does not need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from etstore.lazy import lazy_exports

if TYPE_CHECKING:
    from etstore.store._location import DEFAULT_STORE, ENV_VAR, store_exists
    from etstore.store.base import IngestReport, Store
    from etstore.store.embedded import EmbeddedStore
    from etstore.store.info import TraceInfo
    from etstore.store.neo4j import Neo4jStore
    from etstore.store.opening import open_store
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
    "store_exists",
]

# name → the module that defines it; imported by __getattr__ on first access
_LAZY = {
    "DEFAULT_STORE": "etstore.store._location",
    "ENV_VAR": "etstore.store._location",
    "TraceInfo": "etstore.store.info",
    "store_exists": "etstore.store._location",
    "EmbeddedStore": "etstore.store.embedded",
    "IngestReport": "etstore.store.base",
    "Neo4jStore": "etstore.store.neo4j",
    "Result": "etstore.store.result",
    "Store": "etstore.store.base",
    "Warehouse": "etstore.store.warehouse",
    "open_store": "etstore.store.opening",
}

if not TYPE_CHECKING:  # mypy sees the imports above instead
    __getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
