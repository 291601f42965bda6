"""One open of an embedded store: its lock, its journal, and recovery from interrupted writers.

:mod:`etstore.store._lock` keeps writers apart from each other and from readers;
:mod:`etstore.store._journal` says what a writer is doing. A session ties the two: a
writer writes its journal before it touches an engine and removes it when it closes;
whoever takes the lock and finds a journal knows its writer is gone and has what it
left rolled back or finished (by the store, which knows its engines) before reading.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

from etstore.errors import StoreError
from etstore.store._journal import Journal, JournalEntry
from etstore.store._lock import StoreLock, WaitFn, wait_seconds

__all__ = ["Session"]


class Session:
    """The lock and journal of one open of a store directory.

    Parameters
    ----------
    directory
        The store directory (it exists).
    write
        A writer (alone) or a reader (beside other readers).
    purpose
        What the open is for (e.g. ``"ingest"``), shown to those who wait for it.
    wait_s
        How long to wait for other processes, in seconds (None: ``$ETSTORE_WAIT`` or 300).
    notify
        Told, in one line, when the open waits or recovers.

    Raises
    ------
    StoreError
        Another process held the store for longer than ``wait_s``.
    """

    def __init__(
        self, directory: Path, *, write: bool, purpose: str, wait_s: float | None, notify: WaitFn
    ) -> None:
        self.notify = notify
        self.journal = Journal(directory)
        self.entry: JournalEntry | None = None  # this open's journal, while it is the writer
        self.current: JournalEntry | None = None
        """What this writer is doing (its journal as last written), None for a reader."""
        mine = StoreLock(directory, write=write, what=purpose, wait_s=wait_seconds(wait_s), on_wait=notify)
        self.lock = mine.acquire()
        self.owner = self.lock is mine  # else an earlier open of this process holds the store
        self.purpose = purpose
        self.directory = directory
        self.closed = False

    def interrupted(self) -> JournalEntry | None:
        """The journal an interrupted writer left, when this open is the one to deal with it
        (:meth:`recover`); None when there is nothing to recover before reading."""
        return self.journal.read() if self.owner else None

    def recover(self, roll_back: Callable[[JournalEntry], None]) -> tuple[JournalEntry, ...]:
        """Have ``roll_back`` undo or finish what each interrupted writer left; returns their journals.

        The lock proves a journal's writer is gone (it would hold the lock). A reader
        becomes the writer for the time it takes, then a reader again; another writer may
        come in between and be interrupted in turn, hence the loop. An open that shares
        its process's earlier open recovers nothing (the journal is that open's).

        Raises
        ------
        StoreError
            Another writer held the store for longer than the wait limit meanwhile.
        """
        done: list[JournalEntry] = []
        while (entry := self.interrupted()) is not None:
            upgraded = not self.lock.write
            if upgraded:
                self.lock.upgrade()
                entry = self.journal.read()
            try:
                if entry is not None:
                    self.notify(f"recovering from an interrupted {entry.describe()} in {self.directory} ...")
                    roll_back(entry)
                    self.journal.clear()
                    done.append(entry)
            finally:
                if upgraded:
                    self.lock.downgrade()
        return tuple(done)

    def start_writing(self) -> None:
        """Write this writer's journal (before any engine is touched)."""
        if self.owner and self.lock.write:
            self.entry = self.current = JournalEntry(pid=os.getpid(), command=self.purpose, op="open")
            self.journal.write(self.entry)

    def doing(self, op: str, name: str = "", trace_id: int | None = None) -> None:
        """Say in the journal what this writer is about to do."""
        if self.entry is not None:
            self.current = self.entry._replace(op=op, name=name, trace_id=trace_id)
            self.journal.write(self.current)

    def removing(self, name: str) -> None:
        """``name`` is being removed (recorded with its commit point, so that an ``rm`` run
        again, after a kill at any moment, can say the name is already gone)."""
        if self.entry is not None:
            self.journal.note_removed(name)

    def done(self) -> None:
        """The operation named by :meth:`doing` is committed or rolled back.

        Never raises: the error that matters is the operation's own. Where the journal cannot
        be rewritten (a full disk) it goes on naming the operation until :meth:`close` removes
        it (removing needs no space); should the process die before that, the next open does
        what it does after any kill: it sweeps what such an ingest left, and finishes such a
        removal (the journal naming it is a removal's commit point).
        """
        if self.entry is not None:
            self.current = self.entry
            with contextlib.suppress(StoreError):
                self.journal.write(self.entry)

    def become_reader(self) -> None:
        """A writer that has finished writing (the open that created a store for reading): remove
        its journal and hold the store as a reader from now on, beside other readers.

        Raises
        ------
        StoreError
            Another writer came in between and held the store for longer than the wait limit.
        """
        if self.entry is not None:
            self.journal.clear()
            self.entry = self.current = None
        if self.owner:
            self.lock.downgrade()

    def close(self) -> None:
        """Remove this writer's journal (all it wrote is committed or rolled back) and unlock
        (idempotent: an open gives back its share of the lock once)."""
        if self.closed:
            return
        self.closed = True
        if self.entry is not None:
            self.journal.clear()
            self.entry = self.current = None
        self.lock.release()
