"""Upgrade a store written by an older etstore to this etstore's format, in place.

``python -m etstore.store.upgrade [LOCATION]`` (default ``$ETSTORE_STORE``, then
``./.etstore``) does, for a store directory, what its first writable open does anyway; it is
the one step to run before read-only use (``docs/store.md``, "Format versions"). For a Neo4j
URL it upgrades what etstore's former Neo4j backend wrote there to what ``etstore publish``
writes (:mod:`etstore.store._neo4j_migrate`, ``docs/neo4j.md``, "Servers of the former
backend"), which reading the server needs first.
"""

from __future__ import annotations

import os
import sys

from etstore.errors import EtstoreError
from etstore.store import open_store
from etstore.store._location import resolve_location
from etstore.store._neo4j_migrate import upgrade_server
from etstore.store._neo4j_target import parse_url

__all__ = ["main", "upgrade_store"]


def upgrade_store(location: str | os.PathLike[str] | None = None) -> None:
    """Open a store directory writable (which upgrades an older format in place), bring every
    feature's tables and views up to this etstore's declarations (:mod:`etstore.store.tables`),
    and close it; upgrade a server of etstore's former Neo4j backend to the published form.

    Parameters
    ----------
    location
        A store directory or a ``neo4j://`` / ``bolt://`` URL (default as
        :func:`~etstore.store.open_store`).

    Raises
    ------
    StoreError
        The store cannot be opened or upgraded (a directory is then left as it was, or
        upgraded, never in between; a server keeps the contents upgraded so far, and running
        this again goes on), or it was written by a newer etstore.

    Notes
    -----
    O(rows in the warehouse) for an embedded store of format 1; O(ops of abandoned contents
    plus names and payload chunks) on a server; instant when the store is already current.
    """
    loc, backend = resolve_location(location)
    if backend == "neo4j":
        upgrade_server(loc)
        return
    with open_store(loc, write=True) as store:
        store.warehouse.create_schema()  # every feature's tables as this etstore declares them


def main(argv: list[str] | None = None) -> int:
    """The ``python -m etstore.store.upgrade`` entry point; returns the exit code."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1 or any(a.startswith("-") for a in args):
        sys.stderr.write("usage: python -m etstore.store.upgrade [STORE_DIRECTORY_OR_URL]\n")
        return 2
    try:
        upgrade_store(args[0] if args else None)
    except EtstoreError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    loc, backend = resolve_location(args[0] if args else None)
    shown = parse_url(loc).location if backend == "neo4j" else loc  # never the credentials
    done = "holds what etstore publish writes" if backend == "neo4j" else "is in the current format"
    sys.stdout.write(f"{shown} {done}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
