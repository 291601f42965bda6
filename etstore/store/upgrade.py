"""Upgrade a store written by an older etstore to this etstore's format, in place.

``python -m etstore.store.upgrade [LOCATION]`` (default ``$ETSTORE_STORE``, then
``./.etstore``) does what the first writable open of such a store does anyway; it is
the one step to run before read-only use (``docs/store.md``, "Format versions").
"""

from __future__ import annotations

import os
import sys

from etstore.errors import EtstoreError
from etstore.store import open_store

__all__ = ["main", "upgrade_store"]


def upgrade_store(location: str | os.PathLike[str] | None = None) -> None:
    """Open the store writable (which upgrades an older format in place) and close it.

    Parameters
    ----------
    location
        A store directory or a ``neo4j://`` / ``bolt://`` URL (default as
        :func:`~etstore.store.open_store`).

    Raises
    ------
    StoreError
        The store cannot be opened or upgraded (it is then left as it was, or
        upgraded, never in between), or it was written by a newer etstore.

    Notes
    -----
    O(rows in the warehouse) for an embedded store of format 1; instant when the store
    is already current.
    """
    open_store(location, write=True).close()


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
    sys.stdout.write(f"{args[0] if args else 'the store'} is in the current format\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
