"""The settings of a DuckDB connection that must not touch files: a read-only warehouse, a user's
SQL fragment (``expand --where``). One place, below every floor that opens such a connection."""

from __future__ import annotations

import os
from typing import Any

from etstore.units import BUDGET_ENV_VAR, memory_budget

__all__ = ["read_only_config"]

# A read-only warehouse (etstore.store.warehouse) is the database file itself, opened read-only
# at the instance level (so no ATTACH of it can be writable), with every other file out of
# reach: COPY ... TO, EXPORT DATABASE, ATTACH, read_csv/read_parquet/glob, INSTALL/LOAD and
# persistent secrets all fail with DuckDB's PermissionException. DuckDB's own spilling is not
# a file a query names: a warehouse spills into a private directory of this process outside
# the store (``spill_dir``), never into ``<file>.tmp/`` beside the store, where DuckDB writes
# by default whenever that directory exists; without one, nothing spills and a query past the
# memory limit fails. The lock makes SET/RESET of any option fail, so a query can turn none
# of this back.
_READ_ONLY_CONFIG: dict[str, Any] = {
    "enable_external_access": False,
    "temp_directory": "",
    "lock_configuration": True,
}


def read_only_config(spill_dir: str | None = None) -> dict[str, Any]:
    """DuckDB's settings for a connection that must not touch files (a read-only warehouse,
    a user's SQL fragment): no file access, spilling into ``spill_dir`` only (none without
    it), and the memory budget as DuckDB's memory limit when ``$ETSTORE_MEMORY_BUDGET`` sets
    one (:func:`etstore.units.memory_budget`).

    >>> read_only_config()["temp_directory"], read_only_config("/tmp/x")["temp_directory"]
    ('', '/tmp/x')

    Raises
    ------
    UnsatisfiableError
        ``$ETSTORE_MEMORY_BUDGET`` is set but is not a size.
    """
    config = dict(_READ_ONLY_CONFIG)
    if spill_dir is not None:
        config["temp_directory"] = spill_dir
    if os.environ.get(BUDGET_ENV_VAR, "").strip():
        config["memory_limit"] = f"{memory_budget()}B"
    return config
