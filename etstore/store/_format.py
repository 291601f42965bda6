"""The embedded store's format version: checked at every open, format 1 upgraded in place.

Format 1 (etstore before names): a catalog ``traces`` table with one row per trace and
warehouse tables keyed by trace name. Format 2: contents and names (``docs/store.md``).
The upgrade re-keys the warehouse by content in one DuckDB transaction, then the
catalog in one SQLite transaction that also writes the version record; a crash between
the two is finished by the next writable open (each step checks whether it is done).
The graph needs no change: its uids already derive from the catalog sequence numbers,
which become the trace ids, and its ``trace`` property holds each content's only name.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa

from etstore.errors import StoreError
from etstore.store._identity import upgraded_identity
from etstore.store.catalog import FORMAT_VERSION, Catalog
from etstore.store.warehouse import Warehouse

__all__ = ["check_format", "upgrade_format1"]

log = logging.getLogger(__name__)


def check_format(catalog: Catalog, location: str, *, read_only: bool) -> bool:
    """Whether the store must be upgraded before use (format 1, opened writable).

    Raises
    ------
    StoreError
        The store is of a newer format, or of format 1 and opened read-only (the
        message says what to run).
    """
    version = catalog.format_version()
    if version is None or version == FORMAT_VERSION:
        return False
    if version > FORMAT_VERSION:
        raise StoreError(
            f"{location} is store format {version}, written by a newer etstore; this etstore "
            f"reads format {FORMAT_VERSION}: upgrade etstore"
        )
    if read_only:
        raise StoreError(
            f"{location} is store format {version} (written by an older etstore) and is open "
            f"read-only; upgrade it in place first: python -m etstore.store.upgrade {location}"
        )
    return True


def upgrade_format1(catalog: Catalog, warehouse_path: Path, location: str) -> Warehouse:
    """Upgrade a format-1 store in place; returns the (writable) warehouse it opened.

    Raises
    ------
    StoreError
        DuckDB or SQLite refuses the upgrade (what was done stays consistent: the
        next writable open tries again).

    Notes
    -----
    O(rows in the warehouse): each trace table is copied once.
    """
    legacy = catalog.legacy_traces()
    digests = {r.seq: upgraded_identity(r.content_hash, r.kind, json.loads(r.params or "{}")) for r in legacy}
    ready = [r for r in legacy if r.status == "ready"]
    seq_of = {r.name: r.seq for r in ready}
    table = pa.table(
        {
            "name": pa.array([r.name for r in ready], pa.string()),
            "trace_id": pa.array([r.seq for r in ready], pa.int64()),
            "parent_trace_id": pa.array([seq_of.get(r.parent or "") for r in ready], pa.int64()),
            "content_hash": pa.array([digests[r.seq] for r in ready], pa.string()),
        }
    )
    warehouse = Warehouse.open(warehouse_path, legacy=table)
    try:
        catalog.upgrade(digests)
    except BaseException:
        warehouse.close()
        raise
    log.warning("upgraded %s to store format %d", location, FORMAT_VERSION)
    return warehouse
