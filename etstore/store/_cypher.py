"""Cypher text as both backends see it: parameters checked, trace names resolved.

Queries are scanned once for string literals, comments and ``$parameters`` (a
parameter inside a string or a comment is not one). Two things use the scan:

* a ``$name`` the query uses but ``params`` lacks is refused by name (both engines
  would otherwise run it, Ladybug with the value silently null);
* a trace name that is not the name its content's graph nodes carry — a second
  name for content stored once — is resolved to that name, in string literals and
  in string parameter values (also inside lists), so ``o.trace = 'second'`` finds
  the shared nodes. The graph keeps one name per content (``o.trace``); a string
  that equals such a second name is resolved wherever it appears.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from etstore.errors import QueryError

__all__ = ["check_parameters", "resolve_names"]

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


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _resolved_value(value: Any, aliases: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return aliases.get(value, value)
    if isinstance(value, list | tuple):
        return [_resolved_value(v, aliases) for v in value]
    return value


def resolve_names(
    query: str, params: Mapping[str, Any] | None, aliases: Mapping[str, str]
) -> tuple[str, dict[str, Any]]:
    """``query`` and ``params`` with every second trace name replaced by its graph name.

    Parameters
    ----------
    query
        Cypher text.
    params
        Its parameter values.
    aliases
        Name → the name the content's graph nodes carry, for names that differ from it.

    Returns
    -------
    tuple of (str, dict)
        The query and parameters to run (the inputs themselves when ``aliases`` is empty).

    Notes
    -----
    O(len(query) + size of params).
    """
    values = dict(params or {})
    if not aliases:
        return query, values
    pieces: list[str] = []
    last = 0
    for m in _TOKENS.finditer(query):
        token = m[0]
        if token[0] in "'\"" and "\\" not in token and token[1:-1] in aliases:
            pieces.append(query[last : m.start()])
            pieces.append(_quote(aliases[token[1:-1]]))
            last = m.end()
    pieces.append(query[last:])
    return "".join(pieces), {k: _resolved_value(v, aliases) for k, v in values.items()}
