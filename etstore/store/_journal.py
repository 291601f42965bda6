"""The journal of an embedded store: what the writer holding the store is doing.

A writable open writes ``journal.json`` into the store directory before any engine is
touched, rewrites it before each ingest or removal (what, which name, which trace id)
and removes it when it closes cleanly. A journal found by whoever next holds the store's
lock (:mod:`etstore.store._lock`) was therefore left by a writer that died or was
interrupted: the store rolls back or finishes what it names before anything reads
(:meth:`etstore.store.embedded.EmbeddedStore` does, on open).

The names removed lately (the last 100, not stored again since) are listed in
``removed.json``, written with a removal's commit point, so that an ``rm`` run again,
perhaps after the first one was killed before it could say anything, can say the name is
already gone instead of failing as if it never existed.

The file is replaced atomically (write a temporary file, then rename), so a reader
sees the old journal or the new one, never half of one; neither file is opened through a
link (:mod:`etstore.store._files`). It is not fsynced: it guards against a process dying
(kill -9, Ctrl-C, a crash), not against the machine losing power.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import NamedTuple

from etstore.errors import StoreError
from etstore.store._files import read_no_follow, replace_file

__all__ = ["Journal", "JournalEntry"]

log = logging.getLogger(__name__)

_FILE = "journal.json"
_REMOVED = "removed.json"  # names removed lately (see the module docstring)
_REMOVED_KEPT = 100


class JournalEntry(NamedTuple):
    """One journal: who wrote it and what it was doing."""

    pid: int
    """The writer's process id."""
    command: str
    """What opened the store for writing (e.g. ``"ingest"``)."""
    op: str
    """``"open"`` (nothing under way), ``"ingest"``, ``"remove"`` or ``"name"`` (a new name
    for stored content)."""
    name: str = ""
    """The trace name the operation is about."""
    trace_id: int | None = None
    """The content's trace id, once known."""

    def describe(self) -> str:
        """The operation in words, e.g. ``"ingest of 'big'"``."""
        what = {"ingest": "ingest", "remove": "removal", "name": "naming"}.get(self.op)
        if what is None or not self.name:
            return f"{self.command or 'write'} (PID {self.pid})"
        return f"{what} of {self.name!r} (PID {self.pid}, {self.command or 'etstore'})"


class Journal:
    """The journal file of one store directory (see the module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / _FILE

    def read(self) -> JournalEntry | None:
        """The journal left in the directory, or None. An unreadable one still counts (as an
        unknown write): its writer died while the engines may hold its work.

        Raises
        ------
        StoreError
            The journal is a symbolic link.
        """
        try:
            text = read_no_follow(self.path)
        except FileNotFoundError:
            return None
        except OSError:
            return JournalEntry(pid=0, command="", op="open")
        try:
            doc = json.loads(text)
            return JournalEntry(
                pid=int(doc["pid"]),
                command=str(doc.get("command", "")),
                op=str(doc.get("op", "open")),
                name=str(doc.get("name", "")),
                trace_id=int(doc["trace_id"]) if doc.get("trace_id") is not None else None,
            )
        except (ValueError, KeyError, TypeError):
            return JournalEntry(pid=0, command="", op="open")

    def write(self, entry: JournalEntry) -> None:
        """Replace the journal with ``entry`` (atomic).

        Raises
        ------
        StoreError
            It cannot be written (a full disk), in one line naming the file.
        """
        replace_file(self.path, json.dumps(entry._asdict()))

    def removed(self) -> list[str]:
        """Names removed lately, oldest first (none when the file is absent, unreadable or a link)."""
        try:
            doc = json.loads(read_no_follow(self.path.parent / _REMOVED))
        except (OSError, ValueError, StoreError):
            return []
        return [str(n) for n in doc] if isinstance(doc, list) else []

    def note_removed(self, name: str) -> None:
        """Add ``name`` to :meth:`removed` (atomic). Where that cannot be written (a full disk)
        the removal stands all the same: only an ``rm`` of the name run again then says it
        does not exist instead of that it was removed already."""
        kept = [n for n in self.removed() if n != name][-_REMOVED_KEPT + 1 :]
        try:
            replace_file(self.path.with_name(_REMOVED), json.dumps([*kept, name]))
        except StoreError as exc:
            log.warning("%s (the removal of %r stands)", exc, name)

    def clear(self) -> None:
        """Remove the journal (idempotent)."""
        self.path.unlink(missing_ok=True)
        for tmp in self.path.parent.glob(f"{_FILE}*.tmp"):  # left by a writer killed mid-write
            tmp.unlink(missing_ok=True)
