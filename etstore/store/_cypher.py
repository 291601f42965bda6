"""Cypher parameters as both backends check them.

Queries are scanned once for string literals, comments and ``$parameters`` (a parameter
inside a string or a comment is not one): a ``$name`` the query uses but ``params`` lacks
is refused by name (both engines would otherwise run it, Ladybug with the value silently
null). The query text itself is never changed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from etstore.errors import QueryError

__all__ = ["check_parameters"]

_TOKENS = re.compile(
    r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|`[^`]*`|//[^\n]*|/\*.*?\*/"""
    r"""|\$(?:([A-Za-z_][A-Za-z0-9_]*)|(\d+)|`([^`]*)`)""",
    re.S,
)


def _used(query: str) -> list[str]:
    """Parameter names in ``query``, in order of first use."""
    seen: dict[str, None] = {}
    for m in _TOKENS.finditer(query):
        name = m[1] or m[2] or m[3]
        if name is not None:
            seen.setdefault(name, None)
    return list(seen)


def check_parameters(query: str, params: Mapping[str, Any] | None) -> None:
    """Refuse a query that uses a ``$parameter`` without a value for it.

    Raises
    ------
    QueryError
        Naming the first parameter without a value and the ones given.

    Notes
    -----
    O(len(query)), one regular-expression pass.
    """
    given = set(params or {})
    missing = [p for p in _used(query) if p not in given]
    if missing:
        have = ", ".join(f"${p}" for p in sorted(given)) or "none"
        raise QueryError(
            f"Cypher query uses parameter ${missing[0]} but no value was given for it "
            f"(parameters given: {have}) (query: {query!r})"
        )
