"""Bulk loads of Arrow tables into Ladybug: :func:`copy_arrow`, the one place that runs
``COPY <table> FROM <arrow table>``."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from etstore.pandas_gate import arrow_scan

__all__ = ["copy_arrow"]


def copy_arrow(conn: Any, table: str, rows: pa.Table) -> None:
    """``COPY`` ``rows`` into the Ladybug table ``table`` of the connection ``conn``.

    Ladybug finds the Arrow table by its variable name in the calling frames (a replacement
    scan: here always this function's ``rows``), and first asks whether pandas is installed,
    which :func:`~etstore.pandas_gate.arrow_scan` answers where the command hides it.
    """
    with arrow_scan():
        conn.execute(f"COPY `{table}` FROM rows")
