"""Trace equality that names the first difference; a trace cut into rank parts; C extensions or a skip."""

from __future__ import annotations

import importlib
import os
import unittest
from collections.abc import Sequence
from itertools import pairwise
from types import ModuleType
from typing import Any

import pyarrow as pa

from etstore.model import Trace

# ---------------------------------------------------------------- equality


def _first_difference(a: pa.Table, b: pa.Table, columns: Sequence[str]) -> tuple[int, str] | None:
    """(row, column) of the first cell that differs between two equally long tables."""
    best: tuple[int, str] | None = None
    for col in columns:
        x, y = a[col], b[col]
        if x.equals(y):
            continue
        left, right = x.to_pylist(), y.to_pylist()
        row = next(i for i, (u, v) in enumerate(zip(left, right, strict=True)) if u != v)
        if best is None or row < best[0]:
            best = (row, col)
    return best


def _keys(table: pa.Table, names: Sequence[str]) -> list[tuple[Any, ...]]:
    return list(zip(*(table[n].to_pylist() for n in names), strict=True))


def _compare(a: pa.Table, b: pa.Table, key: Sequence[str], columns: Sequence[str] | None, what: str) -> None:
    """Sort both tables by ``key`` and raise AssertionError at the first difference."""
    cols = list(columns) if columns is not None else list(a.column_names)
    wanted = set(cols) | (set() if columns is not None else set(b.column_names))
    only_left, only_right = sorted(wanted - set(b.column_names)), sorted(wanted - set(a.column_names))
    if only_left or only_right:
        raise AssertionError(
            f"{what}: columns only in the left trace {only_left}, only in the right {only_right}"
        )
    for c in cols:
        if a.schema.field(c).type != b.schema.field(c).type:
            raise AssertionError(
                f"{what}: column {c!r} is {a.schema.field(c).type} vs {b.schema.field(c).type}"
            )
    order = [(k, "ascending") for k in key]
    a, b = a.select(cols).sort_by(order), b.select(cols).sort_by(order)
    if a.equals(b):
        return
    ka, kb = _keys(a, key), _keys(b, key)
    if ka != kb:
        only_a, only_b = sorted(set(ka) - set(kb)), sorted(set(kb) - set(ka))
        if only_a or only_b:
            first = min(
                [*(("left", k) for k in only_a[:1]), *(("right", k) for k in only_b[:1])], key=lambda t: t[1]
            )
            raise AssertionError(
                f"{what}: {dict(zip(key, first[1], strict=True))} is only in the {first[0]} trace "
                f"({a.num_rows} vs {b.num_rows} rows)"
            )
        raise AssertionError(f"{what}: the same keys with different multiplicities")
    diff = _first_difference(a, b, [c for c in cols if c not in key])
    if diff is not None:
        row, col = diff
        where = ", ".join(f"{k} {v}" for k, v in zip(key, ka[row], strict=True))
        raise AssertionError(
            f"{what}: {where}, column {col!r}: {a[col][row].as_py()!r} != {b[col][row].as_py()!r}"
        )


def assert_trace_equal(
    a: Trace, b: Trace, *, columns: Sequence[str] | None = None, check_deps: bool = True
) -> None:
    """Assert two traces hold the same ops (and deps), naming the first difference.

    Parameters
    ----------
    a, b
        The traces; their row order does not matter (ops are compared by (rank, id),
        deps by (rank, dst, src, kind)).
    columns
        The op columns to compare (default: all, and both traces must have the same).
    check_deps
        Also compare ``deps`` (rank, src, dst, kind).

    Raises
    ------
    AssertionError
        At the first differing (rank, id, column) of ``ops`` in (rank, id) order, or
        the first (rank, src, dst) of ``deps`` only one trace has.

    Notes
    -----
    O(V log V + E log E) to sort and compare in Arrow; only when the traces differ,
    O(V) Python work per key column and per differing column to locate the difference.
    """
    cols = None if columns is None else ["rank", "id", *(c for c in columns if c not in ("rank", "id"))]
    _compare(a.ops, b.ops, ["rank", "id"], cols, "ops")
    if check_deps:
        _compare(a.deps, b.deps, ["rank", "dst", "src", "kind"], ["rank", "dst", "src", "kind"], "deps")


# ---------------------------------------------------------------- C extensions


class ExtensionMissingError(AssertionError):
    """A C extension is not built where the build is required (CI)."""


def rank_parts(trace: Trace, cuts: Sequence[int]) -> list[Trace]:
    """``trace`` split before each rank in ``cuts``: every part holds its ranks' rows of every
    table (what :meth:`Store.ingest_parts <etstore.store.base.Store.ingest_parts>` takes)."""
    bounds = [0, *cuts, max(trace.ranks) + 1]
    out = []
    for lo, hi in pairwise(bounds):
        tables = {}
        for name in ("ops", "deps", "missing", "meta"):
            t = getattr(trace, name)
            r = t["rank"].to_numpy()
            tables[name] = t.filter(pa.array((r >= lo) & (r < hi)))
        out.append(trace.replace(**tables))
    return out


def require_extension(module: str) -> ModuleType:
    """Import a C extension (or the module that wraps one), or skip the calling test.

    Parameters
    ----------
    module
        Dotted module name, e.g. ``etstore.formats._xmlscan``.

    Returns
    -------
    ModuleType
        The imported module.

    Raises
    ------
    unittest.SkipTest
        The module cannot be imported (pytest reports the test as skipped, with why).
    ExtensionMissingError
        The module cannot be imported and the environment variable ``CI`` is ``true``:
        there a missing build is a failure, not a skip.

    Notes
    -----
    The extensions are optional builds (setup.py): without a C compiler the install
    succeeds and etstore uses its Python fallbacks, so only CI insists on them.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        why = (
            f"{module} is not available ({exc}); the C extensions are built by "
            "`pip install -e .` (`make install`), which needs a C compiler"
        )
        if os.environ.get("CI") == "true":
            raise ExtensionMissingError(f"CI requires the C extensions: {why}") from exc
        raise unittest.SkipTest(why) from exc
