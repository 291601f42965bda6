"""The small files etstore keeps in a store directory, read and written without following links.

A store directory may be writable by others than its owner (a shared project directory),
and a link planted there as ``lock`` or ``journal.json`` would otherwise make the next
writer truncate or overwrite whatever file the link names, with the writer's permissions.
So every such file is opened with ``O_NOFOLLOW``, and one that is a link is refused in one
line; a file is replaced through a temporary file created new (``O_EXCL | O_NOFOLLOW``)
and renamed over it, which replaces a link instead of writing through it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from etstore.errors import StoreError

__all__ = ["is_link_refusal", "open_no_follow", "read_no_follow", "refused_link", "replace_file"]

_NO_FOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def refused_link(path: Path) -> StoreError:
    """The one-line refusal of ``path``, a symbolic link where etstore keeps a file of its own."""
    return StoreError(
        f"{path} is a symbolic link; etstore does not follow links for the files it keeps in a store "
        "directory (remove the link)"
    )


def is_link_refusal(exc: OSError, path: Path) -> bool:
    """Whether ``exc``, raised by opening ``path`` with ``O_NOFOLLOW``, means it is a link."""
    return exc.errno == errno.ELOOP or (exc.errno == errno.EEXIST and path.is_symlink())


def open_no_follow(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` that refuses a link at ``path``.

    Raises
    ------
    StoreError
        ``path`` is a symbolic link.
    OSError
        Any other reason the file cannot be opened.
    """
    try:
        return os.open(path, flags | _NO_FOLLOW, mode)
    except OSError as exc:
        if is_link_refusal(exc, path):
            raise refused_link(path) from None
        raise


def read_no_follow(path: Path) -> str:
    """The text of ``path`` (UTF-8, undecodable bytes replaced).

    Raises
    ------
    StoreError
        ``path`` is a symbolic link.
    OSError
        It cannot be read (``FileNotFoundError`` when absent).
    """
    fd = open_no_follow(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        return f.read().decode("utf-8", errors="replace")


def replace_file(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename, through ``<name>.tmp`` beside it (only the
    store's writer writes these files, so one temporary name will do).

    The temporary file is created new and never through a link (one left there, by a killed
    writer or planted, is removed first: removing a link leaves its target alone); the
    rename replaces ``path`` itself, even a link.

    Raises
    ------
    StoreError
        The file cannot be written (a full disk, a read-only directory), in one line naming it.
    """
    tmp = path.with_name(f"{path.name}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        try:
            fd = open_no_follow(tmp, flags)
        except (FileExistsError, StoreError):
            tmp.unlink()
            fd = open_no_follow(tmp, flags)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(text.encode("utf-8"))
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise StoreError(f"{path}: cannot write it: {exc.strerror or exc}") from exc
