"""The settings of a DuckDB connection that must not touch files: a read-only warehouse, a user's
SQL fragment (``expand --where``). One place, below every floor that opens such a connection."""

from __future__ import annotations

import os
from typing import Any

from etstore.units import BUDGET_ENV_VAR, memory_budget

__all__ = ["read_only_config"]

# A read-only warehouse (etstore.store.warehouse) is the database file itself, opened read-only
# at the instance level (so no ATTACH of it can be writable), with every other file out of reach: COPY ... TO,
# EXPORT DATABASE, ATTACH, read_csv/read_parquet/glob, INSTALL/LOAD and persistent secrets
# all fail with DuckDB's PermissionException. No temporary directory: DuckDB would otherwise
# spill into ``<file>.tmp/`` beside the store (it writes there whenever that directory
# exists), so a query past the memory limit fails instead. The lock makes SET/RESET of any
# option fail, so a query can turn none of this back.
_READ_ONLY_CONFIG: dict[str, Any] = {
    "enable_external_access": False,
    "temp_directory": "",
    "lock_configuration": True,
}


def read_only_config() -> dict[str, Any]:
    """DuckDB's settings for a connection that must not touch files (a read-only warehouse,
    a user's SQL fragment): no file access, no spilling, and the memory budget as DuckDB's
    memory limit when ``$ETSTORE_MEMORY_BUDGET`` sets one (:func:`etstore.units.memory_budget`).

    Raises
    ------
    UnsatisfiableError
        ``$ETSTORE_MEMORY_BUDGET`` is set but is not a size.
    """
    config = dict(_READ_ONLY_CONFIG)
    if os.environ.get(BUDGET_ENV_VAR, "").strip():
        config["memory_limit"] = f"{memory_budget()}B"
    return config
