"""Rendering for the CLI: Arrow tables as rich tables, CSV or JSON."""

from __future__ import annotations

import base64
import csv
import io
import json
import sys
from typing import Any, TextIO

import pyarrow as pa
from rich.console import Console
from rich.table import Table

__all__ = ["FORMATS", "render", "to_json_value"]

FORMATS = ("table", "csv", "json")


def to_json_value(value: Any) -> Any:
    """A JSON-safe form of an Arrow value (bytes → base64, other objects → str)."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {str(k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return str(value)


def render(
    table: pa.Table,
    fmt: str = "table",
    *,
    title: str | None = None,
    out: TextIO | None = None,
    console: Console | None = None,
) -> None:
    """Print ``table`` as a rich table (terminal), CSV or JSON (a list of row objects).

    Parameters
    ----------
    table
        What to print, one line or row object per row.
    fmt
        ``table``, ``csv`` or ``json`` (see :data:`FORMATS`).
    title
        Caption above a rich table; the other formats carry none.
    out
        Stream for CSV and JSON, and for the table when no ``console`` is given
        (default: stdout).
    console
        Console that prints the rich table (its width and colour decide the layout).

    Notes
    -----
    O(rows x columns); the rows are materialised as Python values once.
    """
    out = out or sys.stdout
    rows = table.to_pylist()
    if fmt == "json":
        out.write(json.dumps([to_json_value(r) for r in rows], indent=1) + "\n")
    elif fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(table.column_names)
        for r in rows:
            writer.writerow(
                [
                    _cell(v) if isinstance(v, (bytes, dict, list)) else ("" if v is None else v)
                    for v in r.values()
                ]
            )
        out.write(buf.getvalue())
    else:
        t = Table(title=title, show_lines=False, header_style="bold")
        for name in table.column_names:
            numeric = pa.types.is_integer(table.schema.field(name).type) or pa.types.is_floating(
                table.schema.field(name).type
            )
            t.add_column(name, justify="right" if numeric else "left", overflow="fold")
        for r in rows:
            t.add_row(*(_cell(v) for v in r.values()))
        (console or Console(file=out)).print(t)
