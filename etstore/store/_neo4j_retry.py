"""Publishers sharing a server: retrying what the server rolled back, waiting for another client.

Neo4j serializes writers by locks and answers a transaction that cannot go on now (a deadlock
between two publishers, a schema that changed under it) with a *transient* error: the server
has rolled it back, and running it again is the remedy. Managed transactions
(``session.execute_write``) get that from the driver; :func:`retrying` gives it to the
auto-commit statements that must run outside one (``CALL { ... } IN TRANSACTIONS``), which
etstore writes so that running them again is harmless. :class:`Patience` paces a publisher
that waits for another client's work on the same content, and gives up in one line after
``wait_s``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from etstore.errors import StoreError
from etstore.store._neo4j_dialect import driver

__all__ = ["Patience", "retrying", "transient"]

T = TypeVar("T")

_ATTEMPTS = 8
"""Runs of an auto-commit statement the server keeps rolling back, before its error stands."""


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or the engine error it wraps) is one the server rolled back and asks to retry."""
    neo4j = driver()
    while exc is not None:
        if isinstance(exc, neo4j.exceptions.TransientError):
            return exc.is_retryable()
        exc = exc.__cause__  # type: ignore[assignment]
    return False


def retrying(statement: Callable[[], T]) -> T:
    """``statement()``, run again (after a short random pause, doubling) while the server rolls it
    back with a transient error, up to a few times; for statements whose rerun is harmless."""
    pause = 0.05
    for _ in range(_ATTEMPTS - 1):
        try:
            return statement()
        except StoreError as exc:
            if not transient(exc):
                raise
        time.sleep(pause * (0.5 + random.random()))
        pause *= 2
    return statement()


class Patience:
    """How long a publisher waits for another client's work it depends on: polls, growing from
    50 ms to 1 s apart, for at most ``wait_s`` seconds."""

    def __init__(self, location: str, wait_s: float) -> None:
        self.location = location
        self.wait_s = wait_s
        self._deadline = time.monotonic() + wait_s
        self._pause = 0.05

    def wait(self, what: str) -> None:
        """Sleep before the next look at ``what``.

        Raises
        ------
        StoreError
            ``wait_s`` has passed and another client is still at ``what``.
        """
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise StoreError(
                f"{self.location}: {what} is still being published or removed by another client after "
                f"{self.wait_s:g} s; retry when that finishes"
            )
        time.sleep(min(self._pause, left))
        self._pause = min(self._pause * 2, 1.0)
