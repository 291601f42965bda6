"""The list of stored traces, read without the store's engines from the listing its last writer left.

``etstore ls`` needs only names and counts; opening the store would load DuckDB, numpy and
pyarrow first. So every writer, as it closes, leaves ``listing.json`` (what
:meth:`~etstore.store.embedded.EmbeddedStore.traces` returned), a file derived from the
warehouse and never part of a commit. A listing is a reader like any other: it takes the
store's lock shared (waiting for a writer, :mod:`etstore.store._lock`) and reads the file
only when no writer's journal is left: every writer since the file was written closed after
writing it. Otherwise :func:`list_traces` returns None and the caller opens the store
(:func:`~etstore.store.opening.open_store`), which does what it always does: a server URL, a
directory that is not a store yet (the open creates it), a write interrupted in another
process (the open recovers it, :mod:`etstore.store._journal`), a store of another format
(the open upgrades it or says how).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import fields
from datetime import datetime
from pathlib import Path

from etstore.errors import StoreError
from etstore.store._files import read_no_follow, replace_file
from etstore.store._location import resolve_location, store_exists
from etstore.store._lock import WaitFn
from etstore.store._session import Session
from etstore.store.info import FORMAT_VERSION, TraceInfo

__all__ = ["LISTING", "list_traces", "read_listing", "write_listing"]

LISTING = "listing.json"


def write_listing(store: Path, traces: list[TraceInfo]) -> None:
    """Write the listing a writer leaves at close (replaced in one rename; never a commit point)."""
    rows = [
        {
            **{f.name: getattr(t, f.name) for f in fields(TraceInfo)},
            "params": dict(t.params),
            "created": t.created.isoformat() if t.created else None,
        }
        for t in traces
    ]
    try:  # through a new temporary file, never through a link (:mod:`etstore.store._files`)
        replace_file(store / LISTING, json.dumps({"format": FORMAT_VERSION, "traces": rows}, default=str))
    except StoreError:  # a full disk or a read-only directory: ``ls`` opens the store instead
        with contextlib.suppress(OSError):
            (store / LISTING).unlink(missing_ok=True)


def read_listing(store: Path) -> list[TraceInfo] | None:
    """The listing a writer left, None when there is none, it is of another format, or it is a
    link (never followed: ``ls`` then opens the store)."""
    try:
        got = json.loads(read_no_follow(store / LISTING))
    except (OSError, ValueError, StoreError):
        return None
    if not isinstance(got, dict) or got.get("format") != FORMAT_VERSION:
        return None
    out = []
    for row in got["traces"]:
        created = datetime.fromisoformat(row["created"]) if row.get("created") else None
        out.append(TraceInfo(**{**row, "created": created}))
    return out


def list_traces(
    location: str | os.PathLike[str] | None = None,
    *,
    wait_s: float | None = None,
    notify: WaitFn,
    purpose: str = "",
) -> list[TraceInfo] | None:
    """The traces an embedded store holds, from its catalog alone; None when the store must be opened.

    Parameters
    ----------
    location
        As :func:`~etstore.store.opening.open_store` takes it (default ``$ETSTORE_STORE``,
        then ``./.etstore``).
    wait_s
        How long to wait for a writer holding the store, in seconds (default
        ``$ETSTORE_WAIT``, then 300).
    notify
        Told in one line whom the listing waits for.
    purpose
        What this process is doing (shown to processes that wait for it).

    Returns
    -------
    list of TraceInfo or None
        What ``Store.traces`` returns on the same store; None for a server URL, a
        directory without a store or a listing, a write left to recover, or a store of
        another format (see the module docstring): open the store for those.

    Raises
    ------
    StoreError
        The URL scheme is unknown, or a writer held the store for longer than ``wait_s``.

    Notes
    -----
    Reads the journal and one JSON file, O(names); writes nothing.
    """
    loc, backend = resolve_location(location)
    if backend != "directory" or not store_exists(loc):
        return None
    path = Path(loc)
    session = Session(path, write=False, purpose=purpose, wait_s=wait_s, notify=notify)
    try:
        if session.interrupted() is not None:
            return None
        return read_listing(path)
    finally:
        session.close()
