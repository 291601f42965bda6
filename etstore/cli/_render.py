"""Rendering for the CLI: Arrow tables, or plain rows, as rich tables, CSV or JSON.

Plain rows (:class:`Rows`) render without importing pyarrow, so a command that lists
what it read from SQLite (``etstore ls``) pays for no Arrow conversion.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

if TYPE_CHECKING:
    import pyarrow as pa
    from rich.console import Console

__all__ = ["FORMATS", "Rows", "json_text", "recognised_line", "render", "render_parts", "to_json_value"]

FORMATS = ("table", "csv", "json")


class Rows(NamedTuple):
    """A listing without Arrow: its column names in order, and one mapping per row.

    A column is numeric (right-aligned, never folded) when it holds at least one value
    and every value that is not None is an int or a float (bools are not numbers here,
    as Arrow's bool type is not).
    """

    columns: Sequence[str]
    rows: Sequence[Mapping[str, Any]]


def to_json_value(value: Any) -> Any:
    """A JSON-safe form of an Arrow value (bytes → base64, NaN/±inf → None, other objects → str).

    JSON has no NaN or Infinity; ``json.dumps`` would write them anyway and most readers
    then reject the whole document, so they become ``null``.
    """
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {str(k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def json_text(doc: Any) -> str:
    """``doc`` as indented, strictly valid JSON (NaN/±inf → null; unknown objects → str), no newline.

    Raises
    ------
    ValueError
        Never for values :func:`to_json_value` has converted (it guarantees finite floats).
    """
    return json.dumps(to_json_value(doc), indent=1, allow_nan=False)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _columns_and_rows(table: pa.Table | Rows) -> tuple[list[str], list[list[Any]], list[bool]]:
    """Column names, rows as value lists in column order, and whether each column is numeric."""
    if isinstance(table, Rows):
        names = list(table.columns)
        values = [[r.get(c) for c in names] for r in table.rows]
        numeric = []
        for i in range(len(names)):
            present = [row[i] for row in values if row[i] is not None]
            numeric.append(bool(present) and all(_is_number(v) for v in present))
        return names, values, numeric
    import pyarrow as pa  # only an Arrow table needs it; plain rows render without loading it

    types = list(table.schema.types)
    numeric = [pa.types.is_integer(t) or pa.types.is_floating(t) for t in types]
    columns = [c.to_pylist() for c in table.columns]  # by position: a query may repeat a name
    return _unique(table.column_names), [list(r) for r in zip(*columns, strict=True)], numeric


def _unique(names: list[str]) -> list[str]:
    """Column names with repeats numbered as DuckDB numbers them (``name``, ``name_1``, ...), so
    a JSON row keeps every column.

    >>> _unique(["name", "id", "name", "name"])
    ['name', 'id', 'name_1', 'name_2']
    """
    seen: dict[str, int] = {}
    out = []
    taken = set(names)
    for n in names:
        k = seen.get(n, 0)
        seen[n] = k + 1
        cand = n if k == 0 else f"{n}_{k}"
        while k and cand in taken:
            k += 1
            cand = f"{n}_{k}"
        taken.add(cand)
        out.append(cand)
    return out


def render(
    table: pa.Table | Rows,
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
        What to print, one line or row object per row: an Arrow table, or :class:`Rows`
        (which renders without importing pyarrow).
    fmt
        ``table``, ``csv`` or ``json`` (see :data:`FORMATS`).
    title
        Caption above a rich table; the other formats carry none. Titles, column names and
        cells print verbatim, never read as rich markup.
    out
        Stream for CSV and JSON, and for the table when no ``console`` is given
        (default: stdout).
    console
        Console that prints the rich table (its width and colour decide the layout).

    Notes
    -----
    O(rows x columns); the rows are materialised as Python values once. Numeric
    columns never wrap; JSON writes NaN and ±inf as ``null``.
    """
    out = out or sys.stdout
    names, rows, numeric = _columns_and_rows(table)
    if fmt == "json":
        out.write(json_text([dict(zip(names, r, strict=True)) for r in rows]) + "\n")
    elif fmt == "csv":
        out.write(_csv_rows([names]) + _csv_rows(rows))
    else:
        from rich.console import Console  # lazy: JSON and CSV output never load rich
        from rich.table import Table
        from rich.text import Text

        # every cell, header and title as Text: names like "[/x]" or "[pytorch|profiler|...]" are data,
        # which rich would otherwise parse as markup (a traceback, or an empty cell), whatever the console
        cells = [[_cell(v) for v in r] for r in rows]
        t = Table(title=None if title is None else Text(title), show_lines=False, header_style="bold")
        for i, name in enumerate(names):
            if numeric[i]:
                # a number split over two lines reads as two numbers: never fold one; text
                # columns fold instead, and a table wider than the terminal overflows it
                widest = max((len(row[i]) for row in cells), default=0)
                t.add_column(Text(name), justify="right", no_wrap=True, overflow="ellipsis", min_width=widest)
            else:
                t.add_column(Text(name), justify="left", overflow="fold")
        for row in cells:
            t.add_row(*(Text(c) for c in row))
        (console or Console(file=out)).print(t)


def _csv_rows(rows: list[list[Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for r in rows:
        writer.writerow(
            [_cell(v) if isinstance(v, (bytes, dict, list)) else ("" if v is None else v) for v in r]
        )
    return buf.getvalue()


def render_parts(parts: Iterable[pa.Table], fmt: str, *, limit: int = 0, out: TextIO | None = None) -> int:
    """Write a table that comes in parts as CSV or JSON, as :func:`render` writes it whole, holding
    one part at a time; at most ``limit`` rows (0: all). Returns the rows of all parts.

    Why: a table too large to hold (an analysis of a large stored trace, read a few ranks at a
    time) still prints as one table. ``parts`` holds at least one table (its columns name the
    header).
    """
    out = out or sys.stdout
    total = shown = 0
    for index, part in enumerate(parts):
        names, rows, _ = _columns_and_rows(part if limit <= 0 else part.slice(0, max(limit - shown, 0)))
        if fmt == "csv":
            out.write((_csv_rows([names]) if index == 0 else "") + _csv_rows(rows))
        else:  # a list of row objects, each indented one step as json.dumps(indent=1) nests it
            for i, r in enumerate(rows):
                text = json_text(dict(zip(names, r, strict=True))).replace("\n", "\n ")
                out.write(("[\n " if shown + i == 0 else ",\n ") + text)
        shown += len(rows)
        total += part.num_rows
    if fmt == "json":
        out.write("\n]\n" if shown else "[]\n")
    return total


def recognised_line(name: str, params: Mapping[str, Any]) -> str | None:
    """One line saying what an input was recognised as (``params["recognised"]``), or None."""
    rec = params.get("recognised") if isinstance(params, Mapping) else None
    if not isinstance(rec, dict):
        return None
    parts = [str(rec.get("format", "?"))]
    if rec.get("ranks"):
        parts.append(f"{rec['ranks']} ranks")
    parts.append(f"{rec.get('ops', 0):,} ops")
    colls = rec.get("collectives") or {}
    p2p = rec.get("p2p") or {}
    counts = ", ".join(f"{k} {v}" for k, v in {**colls, **p2p}.items())
    parts.append(f"collectives: {counts}" if counts else "no collectives")
    linked = rec.get("linked_fraction")
    if linked is not None:
        parts.append(f"linked {100 * linked:.1f}%")
    if params.get("durations") == "absent":
        parts.append("durations absent (no Kineto trace)")
    return f"{name}: " + "; ".join(parts)
