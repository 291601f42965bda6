"""Where a Neo4j server is: its URL, credentials and the client-side warehouse directory.

Credentials come from the URL (``neo4j://user:pass@host:7687``) or from
``NEO4J_USERNAME``/``NEO4J_USER`` and ``NEO4J_PASSWORD``; the printable
:attr:`Neo4jTarget.location` never contains them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from etstore.errors import StoreError

__all__ = [
    "NEO4J_SCHEMES",
    "WAREHOUSE_ENV",
    "Neo4jTarget",
    "default_warehouse",
    "parse_url",
    "writes_refused",
]

WAREHOUSE_ENV = "ETSTORE_WAREHOUSE"
"""Environment variable naming the directory of the client-side DuckDB warehouse."""
NEO4J_SCHEMES = ("neo4j", "neo4j+s", "neo4j+ssc", "bolt", "bolt+s", "bolt+ssc")
"""URL schemes that name a Neo4j server (read through :mod:`etstore.store.neo4j`)."""


@dataclass(frozen=True)
class Neo4jTarget:
    """Where and as whom to connect; ``location`` is the printable form (no credentials)."""

    uri: str
    location: str
    database: str | None
    user: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)

    @property
    def auth(self) -> tuple[str, str] | None:
        return (self.user or "neo4j", self.password) if self.password is not None else None


def parse_url(url: str, env: Mapping[str, str] | None = None) -> Neo4jTarget:
    """Split ``scheme://[user[:password]@]host[:port][/database]`` into a :class:`Neo4jTarget`.

    Missing credentials fall back to ``NEO4J_USERNAME`` (or ``NEO4J_USER``) and
    ``NEO4J_PASSWORD``; a URL without a password and no such variable connects
    without authentication.

    Raises
    ------
    StoreError
        The scheme is not a Neo4j one or the host is missing (the message shows the
        URL without its credentials).
    """
    env = os.environ if env is None else env
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unclosed IPv6 bracket, say
        shown = re.sub(r"//[^/@]*@", "//", url)  # never the credentials
        raise StoreError(f"{shown}: not a valid store URL ({exc})") from None
    scheme = parts.scheme.lower()
    try:
        host, port = parts.hostname, parts.port
    except ValueError as exc:  # a non-numeric port, a bad IPv6 address
        shown = parts.netloc.rpartition("@")[2]
        raise StoreError(f"{scheme}://{shown}: bad host or port in the store URL") from exc
    shown_netloc = parts.netloc.rpartition("@")[2]
    if scheme not in NEO4J_SCHEMES or not host:
        raise StoreError(
            f"{scheme}://{shown_netloc}{parts.path}: not a Neo4j URL; expected neo4j://[user:pass@]host[:port]"
        )
    hostport = f"[{host}]" if ":" in host else host
    hostport += f":{port or 7687}"
    database = parts.path.strip("/") or None
    user = unquote(parts.username) if parts.username else env.get("NEO4J_USERNAME") or env.get("NEO4J_USER")
    password = unquote(parts.password) if parts.password is not None else env.get("NEO4J_PASSWORD")
    location = f"{scheme}://{hostport}" + (f"/{database}" if database else "")
    return Neo4jTarget(f"{scheme}://{hostport}", location, database, user, password)


def default_warehouse(target: Neo4jTarget) -> Path:
    """``$ETSTORE_WAREHOUSE``, else one directory per server and database in the user cache."""
    if os.environ.get(WAREHOUSE_ENV):
        return Path(os.environ[WAREHOUSE_ENV])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    slug = re.sub(r"[^A-Za-z0-9.]+", "_", target.location.split("://", 1)[1])
    return cache / "etstore" / "neo4j" / slug


def writes_refused(location: str) -> str:
    """The one line every write through a server's URL is refused with (``location`` is the
    printable one, :attr:`Neo4jTarget.location`): a server holds what ``etstore publish`` sends."""
    return (
        f"{location} is read-only: a server holds what etstore publish sends it; ingest, remove and "
        f"record into a store directory (--store DIR), then run etstore publish {location}"
    )
