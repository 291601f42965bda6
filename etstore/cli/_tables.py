"""What a command prints: one table per CSV or JSON output, and cut tables that say so.

The rule every command follows (README, "Output formats"):

- ``--format table`` prints all a command has to say: a head line, each of its tables, notes.
- ``--format csv`` and ``--format json`` print one table: CSV its header and rows, JSON a
  list of row objects. A command with several tables takes ``--table NAME`` to choose one
  (its ``--help`` lists them and names the default); given ``--table``, the table format
  prints that one table too.
- A table cut by ``--limit`` says how many rows it left out: a line under the table, or
  one on stderr for CSV and JSON (stdout stays the data alone).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from etstore.cli._render import Rows, render, render_parts

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["add_limit", "add_table", "chosen_table", "note", "one_row", "print_parts", "print_table"]


def add_table(sp: argparse.ArgumentParser, tables: Mapping[str, str], default: str) -> None:
    """``--table NAME`` of a command with several tables: ``tables`` maps each name to what it holds."""
    listed = "; ".join(f"{name}: {what}" for name, what in tables.items())
    sp.add_argument(
        "--table",
        choices=tuple(tables),
        default=None,
        help=f"the one table to print ({listed}). csv and json print one table, {default} unless "
        "given; the table format prints them all unless given",
    )
    sp.set_defaults(default_table=default)


def chosen_table(args: argparse.Namespace) -> str | None:
    """The table to print alone, or None where the table format prints them all."""
    if args.table is not None:
        return str(args.table)
    return None if args.format == "table" else str(args.default_table)


def add_limit(sp: argparse.ArgumentParser, default: int) -> None:
    """``--limit N``: rows of each table printed, in every format."""
    sp.add_argument(
        "--limit",
        type=int,
        default=default,
        help=f"rows of each table to print, in every format (default {default}; 0 = all); "
        "a table cut short says how many rows it left out",
    )


def one_row(row: Mapping[str, Any]) -> Rows:
    """A table of one row (a summary), its columns in the mapping's order."""
    return Rows(list(row), [row])


def _num_rows(table: pa.Table | Rows) -> int:
    return len(table.rows) if isinstance(table, Rows) else int(table.num_rows)


def _head(table: pa.Table | Rows, n: int) -> pa.Table | Rows:
    return Rows(table.columns, table.rows[:n]) if isinstance(table, Rows) else table.slice(0, n)


def note(line: str, fmt: str, console: Any) -> None:
    """A line about the output: under a rich table, on stderr beside CSV and JSON."""
    if fmt == "table":
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    else:
        sys.stderr.write(f"etstore: {line}\n")
        sys.stderr.flush()


def print_table(
    table: pa.Table | Rows,
    fmt: str,
    *,
    console: Any,
    limit: int = 0,
    title: str | None = None,
) -> None:
    """Print ``table`` in ``fmt``, its first ``limit`` rows (0: all), saying how many were left out.

    Notes
    -----
    O(rows printed x columns).
    """
    total = _num_rows(table)
    shown = table if limit <= 0 or total <= limit else _head(table, limit)
    render(shown, fmt, title=title, console=console)
    hidden = total - _num_rows(shown)
    if hidden:
        rows = "row" if hidden == 1 else "rows"
        note(f"… {hidden:,} more {rows} ({total:,} in all); --limit 0 for all", fmt, console)


def print_parts(
    parts: Iterable[pa.Table],
    fmt: str,
    *,
    console: Any,
    limit: int = 0,
    title: str | None = None,
) -> None:
    """:func:`print_table` of a table that comes in parts (at least one): CSV and JSON are
    written part by part; the table format holds the rows it prints (``limit``, or all).

    Notes
    -----
    O(rows printed x columns) held at once for the table format, one part for CSV and JSON.
    """
    if fmt != "table":
        total = render_parts(parts, fmt, limit=limit)
        shown = total if limit <= 0 else min(limit, total)
    else:
        import pyarrow as pa  # the parts are Arrow tables already: nothing new is loaded

        kept, total = [], 0
        for part in parts:
            if limit <= 0 or total < limit:
                kept.append(part if limit <= 0 else part.slice(0, limit - total))
            total += part.num_rows
        table = pa.concat_tables(kept)
        shown = table.num_rows
        render(table, fmt, title=title, console=console)
    hidden = total - shown
    if hidden:
        rows = "row" if hidden == 1 else "rows"
        note(f"… {hidden:,} more {rows} ({total:,} in all); --limit 0 for all", fmt, console)
