"""The Neo4j backend's connection: one driver per store, sessions in the store's access mode,
and statements whose engine failures become one-line :class:`StoreError` naming the server
(never its credentials)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from etstore.errors import StoreError
from etstore.store._neo4j_dialect import driver, message
from etstore.store._neo4j_target import Neo4jTarget

__all__ = ["Bolt"]


class Bolt:
    """A connected driver for ``target`` (read access mode throughout when ``read_only``).

    Raises
    ------
    StoreError
        The server is unreachable, refuses the credentials or has locked the account.
    """

    def __init__(self, target: Neo4jTarget, *, read_only: bool) -> None:
        neo4j = driver()
        self.target = target
        self.location = target.location
        self._access = neo4j.READ_ACCESS if read_only else neo4j.WRITE_ACCESS
        try:
            self.driver = neo4j.GraphDatabase.driver(
                target.uri, auth=target.auth, notifications_min_severity="OFF"
            )
            self.driver.verify_connectivity()
        except neo4j.exceptions.AuthError as exc:
            raise StoreError(
                f"{self.location}: Neo4j refused the credentials "
                "(from the URL or NEO4J_USERNAME/NEO4J_PASSWORD)"
            ) from exc
        except (neo4j.exceptions.DriverError, neo4j.exceptions.Neo4jError, OSError, ValueError) as exc:
            if getattr(exc, "code", None) == "Neo.ClientError.Security.AuthenticationRateLimit":
                raise StoreError(
                    f"{self.location}: Neo4j has locked the account after too many wrong passwords; wait "
                    "for the lock to expire (dbms.security.auth_lock_time, 5 s by default) and retry "
                    "with the right credentials"
                ) from exc
            raise StoreError(f"{self.location}: cannot reach Neo4j: {message(exc)}") from exc

    def close(self) -> None:
        self.driver.close()

    def session(self, *, write: bool = False) -> Any:
        """A session in the store's access mode, or in write mode when ``write``."""
        neo4j = driver()
        mode = neo4j.WRITE_ACCESS if write else self._access
        return self.driver.session(database=self.target.database, default_access_mode=mode)

    def run(self, query: str, params: Mapping[str, Any] | None = None, *, write: bool = False) -> list[Any]:
        """One auto-commit statement, its records."""
        neo4j = driver()
        try:
            with self.session(write=write) as s:
                return list(s.run(query, dict(params or {})))
        except (neo4j.exceptions.Neo4jError, neo4j.exceptions.DriverError) as exc:
            raise StoreError(f"{self.location}: {message(exc)}") from exc

    def write_tx(self, query: str, params: Mapping[str, Any]) -> None:
        """One statement in one managed write transaction (retried by the driver if transient)."""
        neo4j = driver()
        try:
            with self.session(write=True) as s:
                s.execute_write(lambda tx: tx.run(query, dict(params)).consume())
        except (neo4j.exceptions.Neo4jError, neo4j.exceptions.DriverError) as exc:
            raise StoreError(f"{self.location}: {message(exc)}") from exc

    @contextmanager
    def writer(self, single: bool, seq: int) -> Iterator[Callable[[str, Mapping[str, Any]], None]]:
        """Run statements in one transaction (``single``), or one transaction per statement,
        each followed by a heartbeat on content ``seq`` so no other client sweeps it as
        abandoned. Engine failures propagate as the driver raises them."""
        with self.session(write=True) as s:
            if single:
                with s.begin_transaction() as tx:
                    yield lambda q, p: tx.run(q, dict(p)).consume()
                    tx.commit()
                return

            def run(q: str, p: Mapping[str, Any]) -> None:
                s.execute_write(lambda tx: tx.run(q, dict(p)).consume())
                s.run("MATCH (c:EtstoreContent {seq: $s}) SET c.heartbeat = timestamp()", s=seq).consume()

            yield run
