"""Where a store is: a directory (the embedded store) or a Neo4j server's URL.

The default location and the scheme check live here, apart from the backends, so that
whoever only needs to know which backend a location names (``etstore ls`` listing an
embedded store from its catalog alone) loads neither backend.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from etstore.errors import StoreError
from etstore.store._neo4j_target import NEO4J_SCHEMES

__all__ = ["DEFAULT_STORE", "ENV_VAR", "check_store_directory", "resolve_location", "store_exists"]

DEFAULT_STORE = ".etstore"
"""The store directory used when neither a location nor :data:`ENV_VAR` is given."""
ENV_VAR = "ETSTORE_STORE"
"""Environment variable naming the store when no location is given."""

_MARKERS = ("warehouse.duckdb", "catalog.sqlite")
"""A directory holding one of these is a store (``catalog.sqlite``: formats 1 and 2)."""


def resolve_location(location: str | os.PathLike[str] | None) -> tuple[str, Literal["directory", "neo4j"]]:
    """The store a location names, and which backend serves it.

    Parameters
    ----------
    location
        A store directory or a ``neo4j://`` / ``bolt://`` URL; None means
        ``$ETSTORE_STORE``, then ``./.etstore``.

    Returns
    -------
    tuple of (str, str)
        The location as text, and ``"directory"`` (embedded) or ``"neo4j"``.

    Raises
    ------
    StoreError
        The location is empty (``''`` would be the current directory) or a URL of a
        scheme no backend serves.

    Notes
    -----
    O(length of the location); nothing is opened.
    """
    if location is not None and not str(location).strip():
        raise StoreError(
            "the store location is empty; name a store directory (e.g. .etstore) or a neo4j:// URL"
        )
    loc = str(location) if location is not None else os.environ.get(ENV_VAR) or DEFAULT_STORE
    scheme = loc.split("://", 1)[0].lower() if "://" in loc else ""
    if scheme in NEO4J_SCHEMES:
        return loc, "neo4j"
    if scheme:
        raise StoreError(f"unknown store URL scheme {scheme!r}; use a directory path or neo4j:// / bolt://")
    return loc, "directory"


def store_exists(location: str | os.PathLike[str] | None) -> bool:
    """Whether ``location`` holds a store already: a server always does; a directory once an
    etstore has created its warehouse (or, before format 3, its catalog) there.

    Why: opening a directory that holds no store creates one, so a command that only reads
    (``etstore sim --no-record`` on trace files) asks first and leaves nothing behind.

    Raises
    ------
    StoreError
        The location is a URL of a scheme no backend serves, or a path that is not a directory.
    """
    loc, backend = resolve_location(location)
    if backend == "neo4j":
        return True
    path = Path(loc)
    if path.exists() and not path.is_dir():
        raise StoreError(f"{path}: exists and is not a store directory")
    return any((path / f).is_file() for f in _MARKERS)


_OWN = ("lock", "journal.json", "removed.json", "listing.json", "graph", *_MARKERS)
"""What etstore itself leaves in a store directory (these names, and these names followed by a
dot: ``lock.readers``, ``graph.wal``, ``journal.json.tmp``, ...): a directory holding
nothing else, say after an open that was interrupted before its warehouse was written, is
as good as empty."""


def check_store_directory(path: Path) -> None:
    """Refuse ``path`` unless it is a store, a directory holding nothing but what etstore leaves
    there, or absent: an open creates a store where there is none, so it must not turn a
    directory the user keeps something else in (``--store ~``, ``--store src``) into one.

    Raises
    ------
    StoreError
        ``path`` is a file, or a directory that holds other files and no store.

    Notes
    -----
    O(entries of the directory), read only when it holds no store.
    """
    if not path.exists():
        return
    if not path.is_dir():
        raise StoreError(f"{path}: exists and is not a store directory")
    if any((path / f).is_file() for f in _MARKERS):
        return
    try:
        names = sorted(e.name for e in os.scandir(path))
    except OSError as exc:
        raise StoreError(f"{path}: cannot read the directory: {exc.strerror}") from exc
    others = [n for n in names if n not in _OWN and not n.startswith(tuple(f"{o}." for o in _OWN))]
    if others:
        shown = ", ".join(repr(n) for n in others[:3]) + (", ..." if len(others) > 3 else "")
        raise StoreError(
            f"{path}: is not an etstore store and is not empty (it holds {shown}); a store is "
            "created only in a new or empty directory: name one, or an existing store"
        )
