"""etstore: one graph store for Chakra execution traces and collective algorithms.

Entry points::

    import etstore
    with etstore.open_store(".etstore", write=True) as store:
        report = store.ingest(etstore.read_trace("traces/"))
    with etstore.open_store(".etstore") as store:   # read-only unless write=True; or a neo4j:// URL
                                                    # to read what stores published there
        store.cypher("MATCH (o:Op) RETURN o.type, count(*)").to_pandas()
        store.sql("SELECT rank, count(*) FROM ops GROUP BY rank").to_arrow()
        etstore.critical_path(store.load(report.trace.name))

The entry points are imported on first use, so ``import etstore`` (and the CLI's
``--help``) does not load the engines; the error classes are cheap and imported at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from etstore.errors import EtstoreError, QueryError, StoreError, TraceFormatError, UnknownTraceError
from etstore.lazy import lazy_exports
from etstore.store.tables import declare

if TYPE_CHECKING:
    from etstore.analysis import critical_path
    from etstore.formats import read_trace, write_chakra_json, write_et
    from etstore.model import Trace
    from etstore.store import Result, Store, open_store

__version__ = "0.1.0"

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

# name → the module that defines it; imported by __getattr__ on first access
_LAZY = {
    "Result": "etstore.store",
    "Store": "etstore.store",
    "Trace": "etstore.model",
    "critical_path": "etstore.analysis",
    "open_store": "etstore.store",
    "read_trace": "etstore.formats",
    "write_chakra_json": "etstore.formats",
    "write_et": "etstore.formats",
}

# Every feature's warehouse tables, declared beside the module of app/ that writes them
# (etstore.store.tables.TableSet): named here because store/ imports no feature, yet every
# store holds them all from its first open. A module is imported only when a store needs its set.
declare(
    {
        "runs": "etstore.app.runs:RUN_TABLES",
        "measured": "etstore.app.measured:MEASURED_TABLES",
        "tuner": "etstore.app.tuner:TUNER_TABLES",
        "calibrations": "etstore.app.calibrate:CALIBRATION_TABLES",
        "comparisons": "etstore.app.compare:COMPARISON_TABLES",
        "opportunities": "etstore.app.opportunities:OPPORTUNITY_TABLES",
    }
)

if not TYPE_CHECKING:  # mypy sees the imports above instead
    __getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
