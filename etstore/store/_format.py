"""The embedded store's format version: checked at every open, older formats upgraded in place.

Format 1 (etstore before names): a SQLite ``traces`` table with one row per trace and
warehouse tables keyed by trace name. Format 2: contents and names in a SQLite catalog
beside DuckDB. Format 3: DuckDB alone holds the store (:mod:`etstore.store.catalog`); the
graph is a derived index.

A format-1 store is first brought to format 2 (the warehouse re-keyed by content in one
DuckDB transaction, then the catalog in one SQLite transaction). Format 2 becomes 3 in one
DuckDB transaction that copies the catalog's contents and name times into the warehouse
and writes the version record; the SQLite files and the old graph are removed after it
commits. A crash anywhere leaves a store the next writable open upgrades (or finishes):
the DuckDB version record is the commit point, and the SQLite catalog is read only while
it is absent.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa

from etstore.errors import StoreError
from etstore.store import _sqlite_catalog as legacy
from etstore.store._graph_purge import discard_graph
from etstore.store._identity import upgraded_identity
from etstore.store.catalog import FORMAT_VERSION
from etstore.store.warehouse import Warehouse

__all__ = ["check_format", "legacy_catalog", "start_format", "upgrade"]

log = logging.getLogger(__name__)

_SQLITE = "catalog.sqlite"


def legacy_catalog(store: Path) -> Path | None:
    """The SQLite catalog of a store of format 1 or 2, or None."""
    path = store / _SQLITE
    return path if path.is_file() else None


def stored_version(wh: Warehouse) -> int | None:
    """The version record of the warehouse, None when it has none (a new store, or one written
    before format 3 and not upgraded: it has no such table)."""
    has = wh.query(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'store_format' "
        "AND table_schema = current_schema()"
    ).scalar()
    if not has:
        return None
    v = wh.query("SELECT max(version) FROM store_format").scalar()
    return int(v) if v is not None else None


def check_format(store: Path, wh: Warehouse | None, location: str, *, read_only: bool) -> bool:
    """Whether the store must be upgraded before use (format 1 or 2, opened writable).

    ``wh`` is the store's warehouse when it is open read-only; None has the file looked at
    read-only (a writable open would create this format's tables in an older one).

    Raises
    ------
    StoreError
        The store is of a newer format, or of an older one and opened read-only (the
        message says what to run).
    """
    path = store / "warehouse.duckdb"
    if wh is not None:
        version = stored_version(wh)
    elif path.exists():
        with Warehouse.open(path, read_only=True) as peek:
            version = stored_version(peek)
    else:
        version = None
    if version is not None and version > FORMAT_VERSION:
        raise StoreError(
            f"{location} is store format {version}, written by a newer etstore; this etstore "
            f"reads format {FORMAT_VERSION}: upgrade etstore"
        )
    catalog = legacy_catalog(store)
    if version is not None or catalog is None:
        return False
    old = legacy.Catalog(catalog, create=False)
    try:
        old_version = old.format_version() or legacy.FORMAT_VERSION
    finally:
        old.close()
    if read_only:
        raise StoreError(
            f"{location} is store format {old_version} (written by an older etstore) and is open "
            f"read-only; upgrade it in place first: python -m etstore.store.upgrade {location}"
        )
    return True


def start_format(store: Path, wh: Warehouse) -> None:
    """Write the version record of a new store, and remove what an upgrade left after its commit."""
    if stored_version(wh) is None and legacy_catalog(store) is None:
        with wh.transaction():
            wh.execute("INSERT INTO store_format VALUES ($v, 0)", {"v": FORMAT_VERSION})
    elif legacy_catalog(store) is not None:  # an upgrade committed, then stopped: finish it
        _remove_legacy(store)


def upgrade(store: Path, location: str) -> Warehouse:
    """Upgrade a store of format 1 or 2 in place; returns the (writable) warehouse it opened.

    Raises
    ------
    StoreError
        DuckDB or SQLite refuses the upgrade (what was done stays consistent: the next
        writable open tries again).

    Notes
    -----
    O(rows in the warehouse) from format 1 (each trace table is copied once); O(contents +
    names) from format 2. The graph index is built again on the first Cypher query.
    """
    path = legacy_catalog(store)
    assert path is not None
    catalog = legacy.Catalog(path, create=False)
    try:
        if catalog.format_version() == 1:
            wh = _upgrade_format1(catalog, store / "warehouse.duckdb")
        else:
            wh = Warehouse.open(store / "warehouse.duckdb")
        try:
            contents, times = catalog.content_rows(), catalog.name_times()
            with wh.transaction():
                wh.execute("DELETE FROM contents")
                for row in contents:
                    status = "ready" if row[8] == "ready" else "loading"  # the rest is swept
                    wh.execute(
                        "INSERT INTO contents (trace_id, content_hash, kind, ranks, ops, deps, missing, "
                        "messages, status, created) VALUES "
                        "($c0, $c1, $c2, $c3, $c4, $c5, $c6, $c7, $c8, $c9)",
                        {f"c{i}": v for i, v in enumerate((*row[:8], status, row[9].replace(tzinfo=None)))},
                    )
                for name, created in times.items():
                    wh.execute(
                        "UPDATE traces SET created = $c WHERE name = $n",
                        {"c": created.replace(tzinfo=None), "n": name},
                    )
                last = max((int(r[0]) for r in contents), default=0)
                wh.execute("DELETE FROM graph_state")
                wh.execute("INSERT INTO store_format VALUES ($v, $t)", {"v": FORMAT_VERSION, "t": last})
        except BaseException:
            wh.close()
            raise
    finally:
        catalog.close()
    _remove_legacy(store)
    log.warning("upgraded %s to store format %d", location, FORMAT_VERSION)
    return wh


def _remove_legacy(store: Path) -> None:
    """Remove the SQLite catalog and the graph of the old format (the index is built anew)."""
    for f in (store / _SQLITE, store / f"{_SQLITE}-wal", store / f"{_SQLITE}-shm"):
        f.unlink(missing_ok=True)
    discard_graph(store / "graph")


def _upgrade_format1(catalog: legacy.Catalog, warehouse_path: Path) -> Warehouse:
    """Bring a format-1 store to format 2 (warehouse re-keyed, then the catalog)."""
    old = catalog.legacy_traces()
    digests = {
        r.trace_id: upgraded_identity(r.content_hash, r.kind, json.loads(r.params or "{}")) for r in old
    }
    ready = [r for r in old if r.status == "ready"]
    trace_id_of = {r.name: r.trace_id for r in ready}
    table = pa.table(
        {
            "name": pa.array([r.name for r in ready], pa.string()),
            "trace_id": pa.array([r.trace_id for r in ready], pa.int64()),
            "parent_trace_id": pa.array([trace_id_of.get(r.parent or "") for r in ready], pa.int64()),
            "content_hash": pa.array([digests[r.trace_id] for r in ready], pa.string()),
        }
    )
    warehouse = Warehouse.open(warehouse_path, legacy=table)
    try:
        catalog.upgrade(digests)
    except BaseException:
        warehouse.close()
        raise
    return warehouse
