"""A connection to a Neo4j server: one driver per handle, sessions in its access mode (READ for
the read view, :mod:`etstore.store.neo4j`; WRITE for ``etstore publish``), and statements whose
engine failures become one-line :class:`StoreError` naming the server (never its credentials).

READ access mode stops every write to the graph and to the system database, but not what
administers the server from any session: ``TERMINATE TRANSACTIONS`` (another client's publish
among them) and procedures such as ``dbms.killConnections`` or ``db.clearQueryCaches``. So a
read-only store's sessions also refuse, in one line, statements that administer
(:func:`administration`); ``SHOW`` commands and read procedures pass.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from etstore.errors import QueryError, StoreError
from etstore.store._neo4j_dialect import driver, message
from etstore.store._neo4j_target import Neo4jTarget

__all__ = ["Bolt", "administration"]

# comments and string literals say nothing about what runs; a `quoted` name is still that name
_NOISE = re.compile(r"//[^\n]*|/\*.*?\*/|'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`([^`]*)`", re.S)
# what may come before a statement's own first keyword
_PREFIX = re.compile(
    r"\s*(?:CYPHER(?:\s+\d+(?:\.\d+)?)?(?:\s+\w+\s*=\s*\w+)*|EXPLAIN|PROFILE|USE\s+[\w.]+)(?!\w)", re.I
)
_ADMIN_FIRST = frozenset(
    {"ALTER", "DROP", "RENAME", "GRANT", "DENY", "REVOKE", "START", "STOP", "ENABLE", "DEALLOCATE"}
    | {"REALLOCATE", "DRYRUN", "TERMINATE"}
)
_ADMIN_CREATE = frozenset({"USER", "ROLE", "DATABASE", "COMPOSITE", "ALIAS", "SERVER"})
_TERMINATE = re.compile(r"(?<![\w.$])TERMINATE\s+TRANSACTIONS?(?!\w)", re.I)
_CALL = re.compile(r"(?<![\w.$])CALL\s+([A-Za-z_]\w*(?:\s*\.\s*[A-Za-z_]\w*)*)", re.I)
# dbms.* procedures a reader may call: they describe the server and change nothing
_DBMS_READS = frozenset(
    {"components", "info", "listconfig", "listcapabilities", "queryjmx", "showcurrentuser", "clientconfig"}
    | {"routing.getroutingtable", "cluster.routing.getroutingtable", "procedures", "functions"}
)
# db.* procedures that act on the server rather than read the graph
_DB_ADMIN = re.compile(
    r"db\.(clearquerycaches|checkpoint|create|prepareforreplanning|resample|index\.fulltext\.(create|drop))"
)


def administration(query: str) -> str | None:
    """What in ``query`` administers the server (``"TERMINATE TRANSACTIONS"``, ``"CALL
    dbms.killConnections"``, ``"DROP"`` ...), None when nothing does.

    Read from the text, with comments and string literals set aside and quoted names
    unquoted, so neither hides a command: a statement that begins with an administration
    command (past ``CYPHER``, ``EXPLAIN``, ``PROFILE`` and ``USE``), a ``TERMINATE
    TRANSACTIONS`` anywhere (it may follow ``SHOW TRANSACTIONS``), or a call of a ``dbms.``
    procedure other than those that only describe the server, or of a ``db.`` procedure that
    acts on it. O(length of the query).
    """
    text = _NOISE.sub(lambda m: m[1] if m[1] is not None else " ", query)
    while (m := _PREFIX.match(text)) is not None and m.end() > 0:
        text = text[m.end() :]
    words = text.split(None, 4)
    first = words[0].upper() if words else ""
    rest = [w.upper() for w in words[1:4]]
    if first in _ADMIN_FIRST:
        return "TERMINATE TRANSACTIONS" if first == "TERMINATE" else " ".join([first, *rest[:1]])
    if first == "CREATE" and rest and (rest[0] in _ADMIN_CREATE or rest[:2] == ["OR", "REPLACE"]):
        return " ".join(["CREATE", *(rest[:3] if rest[0] == "OR" else rest[:1])])
    if _TERMINATE.search(text):
        return "TERMINATE TRANSACTIONS"
    for m in _CALL.finditer(text):
        called = "".join(m[1].split())
        space, _, proc = called.lower().partition(".")
        if (space == "dbms" and proc not in _DBMS_READS) or _DB_ADMIN.match(called.lower()):
            return f"CALL {called}"
    return None


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
        """A session in the store's access mode, or in write mode when ``write``; a read-only
        store's session refuses statements that administer the server (:class:`_ReadSession`)."""
        neo4j = driver()
        mode = neo4j.WRITE_ACCESS if write else self._access
        s = self.driver.session(database=self.target.database, default_access_mode=mode)
        return _ReadSession(s) if mode == neo4j.READ_ACCESS else s

    def run(self, query: str, params: Mapping[str, Any] | None = None, *, write: bool = False) -> list[Any]:
        """One auto-commit statement, its records."""
        neo4j = driver()
        try:
            with self.session(write=write) as s:
                return list(s.run(query, dict(params or {})))
        except (neo4j.exceptions.Neo4jError, neo4j.exceptions.DriverError) as exc:
            raise StoreError(f"{self.location}: {message(exc)}") from exc

    def write_tx(self, query: str, params: Mapping[str, Any] | None = None) -> list[Any]:
        """One statement in one managed write transaction (run again by the driver while transient);
        its records."""
        neo4j = driver()
        try:
            with self.session(write=True) as s:
                return list(s.execute_write(lambda tx: list(tx.run(query, dict(params or {})))))
        except (neo4j.exceptions.Neo4jError, neo4j.exceptions.DriverError) as exc:
            raise StoreError(f"{self.location}: {message(exc)}") from exc


class _ReadSession:
    """A driver session in READ access mode whose ``run`` first refuses administration
    (:func:`administration`) with a one-line :class:`QueryError`; the rest is the session's."""

    def __init__(self, session: Any) -> None:
        self._session = session

    def run(self, query: str, parameters: Mapping[str, Any] | None = None, **kwargs: Any) -> Any:
        """The session's ``run``, unless ``query`` administers the server.

        Raises
        ------
        QueryError
            ``query`` administers the server (nothing is sent to it).
        """
        what = administration(query)
        if what is not None:
            raise QueryError(
                f"Cypher error: {what} administers the server, which a store opened read-only refuses "
                f"(query: {query!r})"
            )
        return self._session.run(query, parameters, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def __enter__(self) -> _ReadSession:
        self._session.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._session.__exit__(*exc)
