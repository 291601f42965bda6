"""The process that runs a read-only store's Cypher: Ladybug inside a Landlock sandbox.

Ladybug has no setting that stops a query from writing or reading files on a read-only
database (``COPY (...) TO 'file'``, ``EXPORT DATABASE``, ``LOAD FROM 'file'``, ``INSTALL``
all run there). So a read-only store opens its graph in this process instead, after
asking the Linux kernel (Landlock, Linux 5.13+) to refuse it every file write, create,
remove and truncate anywhere, and every file read outside the store directory, Python's
own directories and the shared libraries. The restriction is the kernel's: it holds
whatever the query text says, and no query can lift it. Threads inherit it, so it is
applied before Ladybug or pyarrow start theirs.

Run as a script in isolated mode with a clean environment (``python -I _graph_worker.py
GRAPH BUFFER_POOL_BYTES [IMPORT_DIR ...]``), not as a package module, so that nothing but
the standard library is loaded before the sandbox closes, and nothing in the caller's
environment (``PYTHONPATH``, ``PYTHONHOME``, a user site) widens what it may read: its import
path is the interpreter's own plus the directories the parent found Ladybug and pyarrow in.
The parent (:mod:`etstore.store._graph_reader`) talks to it over stdin/stdout in frames:
an 8-byte big-endian length, then the payload. Requests are pickled ``(query, params)``
tuples; answers are one status byte (:data:`OK`, :data:`EMPTY`, :data:`ERROR`) and the
Arrow IPC stream of the result or the engine's message in UTF-8. The first answer,
before any request, says whether the sandbox is on and the graph open.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import struct
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

__all__ = [
    "EMPTY",
    "ERROR",
    "OK",
    "UNSANDBOXED",
    "landlock_abi",
    "read_frame",
    "restrict_files",
    "write_frame",
]

OK = b"o"
"""The answer holds an Arrow IPC stream (or, first, that the graph is open)."""
EMPTY = b"e"
"""The statement returned no columns."""
ERROR = b"x"
"""The answer holds the engine's message (or, first, why the graph did not open)."""
UNSANDBOXED = b"u"
"""First answer only: the kernel has no Landlock; the message says why."""

_HEADER = struct.Struct(">Q")

# Landlock's system calls have the same numbers on every Linux architecture.
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS, _PR_SET_PDEATHSIG = 38, 1

_READ_FILE, _READ_DIR = 1 << 2, 1 << 3
# write a file, remove a dir/file, make char/dir/reg/sock/fifo/block/symlink (ABI 1),
# link or rename across directories (ABI 2), truncate (ABI 3)
_WRITES_BY_ABI = ((1, 1 << 1 | 0b11_1111_1111 << 4), (2, 1 << 13), (3, 1 << 14))

# Shared libraries Python or Ladybug may load after the sandbox closes, and the loader's cache.
_SYSTEM_READ = (
    "/lib",
    "/lib64",
    "/usr/lib",
    "/usr/lib64",
    "/usr/local/lib",
    "/etc/ld.so.cache",
    "/dev/null",
    "/dev/urandom",
)


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when it has none (not Linux, too old, or disabled)."""
    if not sys.platform.startswith("linux"):
        return 0
    abi = _libc().syscall(
        _SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION)
    )
    return max(int(abi), 0)


def restrict_files(readable: Iterable[str | os.PathLike[str]]) -> None:
    """Forbid this thread (and the threads it starts later) to change any file, and to read
    any file outside ``readable``; irrevocable.

    Raises
    ------
    OSError
        The kernel has no Landlock or refuses the rules.
    """
    abi = landlock_abi()
    if abi < 1:
        raise OSError("the kernel has no Landlock (Linux 5.13+ with Landlock enabled)")
    writes = 0
    for since, bits in _WRITES_BY_ABI:
        if abi >= since:
            writes |= bits
    libc = _libc()
    handled = ctypes.c_uint64(writes | _READ_FILE | _READ_DIR)
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(handled), ctypes.c_size_t(8), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for path in readable:
            _allow_read(libc, ruleset, os.fspath(path))
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(_SYS_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)


def _allow_read(libc: ctypes.CDLL, ruleset: int, path: str) -> None:
    """Let the sandbox read ``path`` (a file, or a directory and everything beneath it)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # absent here: nothing to allow
    try:
        access = _READ_FILE | _READ_DIR if os.path.isdir(path) else _READ_FILE
        rule = _PathBeneath(access, fd)
        if libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), ctypes.c_uint32(0)):
            raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
    finally:
        os.close(fd)


def read_frame(stream: IO[bytes]) -> bytes | None:
    """One frame's payload, ``None`` at the end of the stream."""
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    size = _HEADER.unpack(head)[0]
    body = stream.read(size)
    return body if len(body) == size else None


def write_frame(stream: IO[bytes], status: bytes, payload: bytes = b"") -> None:
    """Send one status byte and its payload as a frame."""
    stream.write(_HEADER.pack(len(status) + len(payload)) + status + payload)
    stream.flush()


def _readable(graph: Path) -> list[str]:
    own = {sys.prefix, sys.base_prefix, sys.exec_prefix, *(p for p in sys.path if p)}
    return [str(graph.parent), *sorted(own), *_SYSTEM_READ]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _serve(conn: Any, inp: IO[bytes], out: IO[bytes]) -> None:
    """Answer requests until the parent closes stdin."""
    import pyarrow as pa  # loaded only once the sandbox is closed (it starts threads)

    while (request := read_frame(inp)) is not None:
        query, params = pickle.loads(request)
        try:
            res = conn.execute(query, params)
            if not res.get_column_names():
                write_frame(out, EMPTY)
                continue
            table = res.get_as_arrow(0)  # one chunk of exactly the result's rows
        except Exception as exc:  # the engine's refusal (RuntimeError) or a parameter it cannot take
            write_frame(out, ERROR, _first_line(exc).encode())
            continue
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        write_frame(out, OK, sink.getvalue().to_pybytes())


def main(argv: list[str]) -> int:
    """Close the sandbox, open the graph read-only, serve queries (see the module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what Ctrl-C stops
    libc = _libc()
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # never outlive the parent
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    graph, pool = Path(argv[1]), int(argv[2])
    sys.path.extend(p for p in argv[3:] if p not in sys.path)  # where the engines were found
    try:
        restrict_files(_readable(graph))
    except OSError as exc:
        write_frame(out, UNSANDBOXED, str(exc).encode())
        return 0
    try:
        import ladybug  # loaded only once the sandbox is closed (it starts threads)

        db = ladybug.Database(str(graph), read_only=True, buffer_pool_size=pool)
        conn = ladybug.Connection(db)
    except (RuntimeError, ImportError) as exc:
        write_frame(out, ERROR, _first_line(exc).encode())
        return 0
    write_frame(out, OK)
    _serve(conn, inp, out)
    conn.close()
    db.close()
    return 0


if __name__ == "__main__":
    # the script's own directory (etstore/store) must not shadow top-level modules
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if p and str(Path(p).resolve()) != here]
    sys.exit(main(sys.argv))
