"""etstore: one graph store for Chakra execution traces and collective algorithms.

Entry points::

    import etstore
    store = etstore.open_store(".etstore")        # or "neo4j://user:pass@host:7687"
    report = store.ingest(etstore.read_trace("traces/"))
    store.cypher("MATCH (o:Op) RETURN o.type, count(*)").to_pandas()
    store.sql("SELECT rank, count(*) FROM ops GROUP BY rank").to_arrow()
    etstore.critical_path(store.load(report.trace.name))
"""

from __future__ import annotations

__version__ = "0.1.0"

from etstore.errors import EtstoreError, QueryError, StoreError, TraceFormatError, UnknownTraceError
from etstore.ingest import read_trace, write_chakra_json, write_et
from etstore.model import Trace
from etstore.query import critical_path
from etstore.store import Result, Store, open_store

__all__ = [
    "EtstoreError",
    "QueryError",
    "Result",
    "Store",
    "StoreError",
    "Trace",
    "TraceFormatError",
    "UnknownTraceError",
    "__version__",
    "critical_path",
    "open_store",
    "read_trace",
    "write_chakra_json",
    "write_et",
]
