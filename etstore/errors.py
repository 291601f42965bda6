"""The one error tree: everything a user can cause is an :class:`EtstoreError`."""

from __future__ import annotations

__all__ = [
    "EtstoreError",
    "QueryError",
    "StoreError",
    "TopologyError",
    "TraceFormatError",
    "UnknownTraceError",
    "UnsatisfiableError",
]


class EtstoreError(Exception):
    """Base of every error etstore raises on purpose; the CLI prints it in one line."""


class TraceFormatError(EtstoreError):
    """A file is not what it claims: names the file and the byte offset, line or node."""


class UnknownTraceError(EtstoreError):
    """No trace (or run) of that name is in the store."""


class QueryError(EtstoreError):
    """The engine rejected a Cypher or SQL query: carries its message and the query."""


class StoreError(EtstoreError):
    """The store cannot be opened, written or is in a state that forbids the request."""


class TopologyError(EtstoreError):
    """A topology spec or file is malformed or impossible."""


class UnsatisfiableError(EtstoreError):
    """An algorithm cannot deliver what its collective promises (or cannot be built)."""
