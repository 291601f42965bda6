"""The lock of an embedded store: one writer at a time, readers beside each other, waits not failures.

Two files in the store directory, both locked with ``flock`` (released by the kernel
when the holder exits, however it exits):

``lock``
    Writers hold it exclusive for as long as they are open, with ``PID what`` written in
    it so that whoever waits can say for whom. Readers take it shared only for the moment
    they enter, so a waiting writer is never starved by a stream of readers: once it
    holds ``lock``, new readers queue behind it.
``lock.readers``
    Readers hold it shared for as long as they are open; a writer takes it exclusive
    after ``lock``, i.e. it waits for the readers already in to leave.

A process may open the same store more than once (say a read-only view while a
writable one is open); it locks the store once and counts its opens, since two locks of
one process on one file would wait for each other.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from etstore.errors import StoreError
from etstore.store._files import open_no_follow, read_no_follow

__all__ = ["DEFAULT_WAIT_S", "WAIT_ENV_VAR", "StoreLock", "WaitFn", "wait_seconds"]

WAIT_ENV_VAR = "ETSTORE_WAIT"
"""Environment variable: how many seconds to wait for another process's lock (default 300)."""

DEFAULT_WAIT_S = 300.0

WaitFn = Callable[[str], None]
"""``on_wait(message)``: called once when an open has to wait, with one line saying for whom."""

_QUIET_S = 0.5  # waits shorter than this (a reader passing through the door) are not announced


def wait_seconds(value: float | None = None) -> float:
    """The wait limit in seconds: ``value``, else ``$ETSTORE_WAIT``, else :data:`DEFAULT_WAIT_S`.

    Raises
    ------
    StoreError
        The environment variable is not a non-negative number.
    """
    if value is not None:
        if not value >= 0:  # also refuses nan
            raise StoreError(f"wait limit {value:g} s: expected a number of seconds >= 0")
        return float(value)
    raw = os.environ.get(WAIT_ENV_VAR, "").strip()
    if not raw:
        return DEFAULT_WAIT_S
    try:
        got = float(raw)
    except ValueError:
        got = -1.0
    if not got >= 0:  # also refuses nan
        raise StoreError(f"{WAIT_ENV_VAR}={raw!r}: expected a number of seconds >= 0")
    return got


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class StoreLock:
    """The lock of one store directory, held by this process (see the module docstring).

    Parameters
    ----------
    directory
        The store directory (it exists).
    write
        Exclusive (one writer) or shared (readers).
    what
        What the holder is doing, shown to those who wait (e.g. ``"ingest"``).
    wait_s
        How long to wait for other processes, in seconds.
    on_wait
        Called once with a one-line message when the open has to wait.
    """

    _held: ClassVar[dict[tuple[int, int], StoreLock]] = {}  # this process's locks, by (dev, inode)

    def __init__(
        self, directory: Path, *, write: bool, what: str, wait_s: float, on_wait: WaitFn | None
    ) -> None:
        self.directory = directory
        self.write = write
        self.what = what or "etstore"
        self.wait_s = wait_s
        self.on_wait = on_wait
        self._door: int | None = None  # fd of ``lock``
        self._room: int | None = None  # fd of ``lock.readers``
        self._key: tuple[int, int] | None = None
        self._opens = 0
        self._announced = False

    # ------------------------------------------------------------ public

    def acquire(self) -> StoreLock:
        """Take the lock (waiting up to ``wait_s``); returns the lock that now counts this open.

        Raises
        ------
        StoreError
            Another process held it for longer than ``wait_s``.
        """
        st = self.directory.stat()
        key = (st.st_dev, st.st_ino)
        mine = StoreLock._held.get(key)
        if mine is not None:  # already locked by this process: share that lock
            mine._opens += 1
            return mine
        self._key = key
        deadline = time.monotonic() + self.wait_s
        if self.write:
            self._take_write(deadline)
        else:
            self._take_read(deadline)
        self._opens = 1
        StoreLock._held[key] = self
        return self

    def release(self) -> None:
        """Give back one open; the last one unlocks (idempotent past that)."""
        if self._opens == 0:
            return
        self._opens -= 1
        if self._opens:
            return
        if self._key is not None:
            StoreLock._held.pop(self._key, None)
        self._unlock_all()

    @property
    def exclusive(self) -> bool:
        """Whether this process holds the store as its only writer."""
        return self.write and self._opens > 0

    def upgrade(self) -> None:
        """Turn a reader's lock into a writer's (to recover what a dead writer left), waiting as
        :meth:`acquire` does. Not atomic: another writer may go first; the caller looks again.

        Raises
        ------
        StoreError
            Another process held the store for longer than ``wait_s``.
        """
        if self.write:
            return
        self._unlock_all()
        self.write = True
        self._take_write(time.monotonic() + self.wait_s)

    def downgrade(self) -> None:
        """Turn the writer's lock taken by :meth:`upgrade` back into a reader's.

        Raises
        ------
        StoreError
            Another writer came in between and held the store for longer than ``wait_s``.
        """
        if not self.write:
            return
        self._unlock_all()
        self.write = False
        self._take_read(time.monotonic() + self.wait_s)

    # ------------------------------------------------------------ phases

    def _open(self, name: str) -> int:
        """Open (create) a lock file, never through a link (a writer truncates it); a reader of a
        store it may not write opens it read-only (flock works on any descriptor), or, where it
        does not exist, ``-1``: no writer can come into a directory nobody may write.

        Raises
        ------
        StoreError
            The lock file is a symbolic link, or a writer cannot open it.
        """
        path = self.directory / name
        try:
            try:
                return open_no_follow(path, os.O_RDWR | os.O_CREAT)
            except OSError as exc:
                if self.write:
                    raise StoreError(
                        f"{self.directory}: cannot lock the store for writing: {exc.strerror}"
                    ) from exc
            try:
                return open_no_follow(path, os.O_RDONLY)
            except OSError:
                return -1
        except StoreError:
            self._unlock_all()
            raise

    def _take_write(self, deadline: float) -> None:
        self._door = self._open("lock")
        self._wait(self._door, fcntl.LOCK_EX, deadline, self._writer_message)
        self._room = self._open("lock.readers")
        self._wait(self._room, fcntl.LOCK_EX, deadline, self._readers_message)
        with contextlib.suppress(OSError):  # only for those who wait; a full disk leaves it unsaid
            os.ftruncate(self._door, 0)
            os.pwrite(self._door, f"{os.getpid()} {self.what}\n".encode(), 0)

    def _take_read(self, deadline: float) -> None:
        door = self._open("lock")
        try:
            self._wait(door, fcntl.LOCK_SH, deadline, self._writer_message)
            self._room = self._open("lock.readers")
            self._wait(self._room, fcntl.LOCK_SH, deadline, self._readers_message)
        finally:
            if door >= 0:
                os.close(door)  # through the door: a writer may queue now

    def _unlock_all(self) -> None:
        if self._door is not None and self._door >= 0 and self.write:
            os.ftruncate(self._door, 0)  # nobody is writing any more
        for fd in (self._room, self._door):
            if fd is not None and fd >= 0:
                os.close(fd)  # closing the last descriptor releases the flock
        self._door = self._room = None

    def _wait(self, fd: int, mode: int, deadline: float, message: Callable[[], str]) -> None:
        """flock ``fd`` in ``mode``, polling until ``deadline``; announce the wait once."""
        if fd < 0:  # a lock file that cannot exist (see _open)
            return
        started = time.monotonic()
        pause = 0.01
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                return
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    self._unlock_all()
                    raise StoreError(f"{self.directory}: cannot lock the store: {exc.strerror}") from exc
            now = time.monotonic()
            if now >= deadline:
                text = message()
                self._unlock_all()
                raise StoreError(
                    f"{self.directory}: gave up after {self.wait_s:g} s waiting for {text}; "
                    f"nothing was done (set {WAIT_ENV_VAR} to wait longer)"
                )
            if not self._announced and now - started >= min(_QUIET_S, self.wait_s):
                self._announced = True
                if self.on_wait is not None:
                    self.on_wait(f"waiting for {message()} ...")
            time.sleep(min(pause, max(0.0, deadline - now)))
            pause = min(pause * 2, 0.1)

    def _writer_message(self) -> str:
        """Who holds ``lock``: the writer written in it, else readers passing through."""
        try:
            text = read_no_follow(self.directory / "lock").split()
        except (OSError, StoreError):
            text = []
        if len(text) >= 1 and text[0].isdigit() and _alive(int(text[0])):
            what = " ".join(text[1:]) or "etstore"
            return f"PID {text[0]} ({what}) to finish writing {self.directory}"
        return f"another etstore process to finish writing {self.directory}"

    def _readers_message(self) -> str:
        """Who holds ``lock.readers``: the reading processes, by PID where the kernel says."""
        pids = _flock_holders(self.directory / "lock.readers") - {os.getpid()}
        if not pids:
            return f"the processes reading {self.directory} to finish"
        listed = ", ".join(str(p) for p in sorted(pids)[:5]) + (", ..." if len(pids) > 5 else "")
        return f"PID {listed} (reading) to finish reading {self.directory}"


def _flock_holders(path: Path) -> set[int]:
    """PIDs holding a flock on ``path``, from Linux's ``/proc/locks`` (empty elsewhere)."""
    try:
        st = path.stat()
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return set()
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids: set[int] = set()
    for line in lines:
        parts = line.split()
        # "1: FLOCK  ADVISORY  READ 1234 08:01:5678 0 EOF" (a "->" marks a waiter)
        if "FLOCK" in parts and "->" not in parts and dev in parts:
            i = parts.index(dev)
            if parts[i - 1].isdigit():
                pids.add(int(parts[i - 1]))
    return pids
