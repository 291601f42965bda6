"""The one error tree: everything a user can cause is an :class:`EtstoreError`.

Each class names the kind of failure; its message names the file, node, line or value
and what was expected. The CLI prints the message in one line and exits non-zero.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ConfigError",
    "CycleError",
    "DependencyError",
    "EtstoreError",
    "ExpansionError",
    "OptionError",
    "QueryError",
    "ReportError",
    "RewriteError",
    "SimulationError",
    "StoreError",
    "TemplateError",
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


class CycleError(EtstoreError):
    """A trace's dependencies form a cycle where an order is needed (a critical path, a schedule)."""


class DependencyError(EtstoreError):
    """An optional package the request needs is not installed; the message says what to install."""


class OptionError(EtstoreError):
    """A parameter is out of range, malformed, or conflicts with another parameter."""


class ConfigError(EtstoreError):
    """A simulator parameter or an ASTRA-sim config file is malformed or unsupported."""


class TemplateError(EtstoreError):
    """An algorithm cannot be expanded for a collective (wrong rank count, no sizes)."""


class ExpansionError(EtstoreError):
    """A workload's collectives cannot be replaced by the chosen algorithm."""


class RewriteError(EtstoreError):
    """A rewrite cannot be applied, or its result fails the dependency check."""


class ReportError(EtstoreError):
    """A report cannot be built or written: no runs, no metrics tables, an unwritable output."""


class SimulationError(EtstoreError):
    """The replay cannot finish or cannot start: stuck receives, dependency cycles, bad ops.

    ``stuck`` holds the ops that never finished (an Arrow table: rank, id, name, type,
    state, reason) when the replay got stuck, else None.
    """

    def __init__(self, message: str, stuck: Any = None) -> None:
        super().__init__(message)
        self.stuck = stuck
