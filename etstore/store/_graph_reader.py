"""A read-only store's graph, queried in a sandboxed process that cannot touch files.

:mod:`etstore.store._graph_worker` says why and how (Ladybug has no switch for it; the
Linux kernel's Landlock does it instead). This side starts that process once per store,
sends it each query and reads back Arrow; closing it ends the process. Where the kernel
has no Landlock, :meth:`SandboxedGraph.start` returns ``None`` and the caller opens the
graph in its own process (``docs/reliability.md`` says what that leaves open).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import pickle
import subprocess
import sys
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any

import pyarrow as pa

from etstore.errors import QueryError, StoreError
from etstore.store import _graph_worker as worker

__all__ = ["SandboxedGraph", "sandbox_available"]

log = logging.getLogger(__name__)


def sandbox_available() -> bool:
    """Whether this kernel can sandbox a read-only graph (Landlock, Linux 5.13+)."""
    return worker.landlock_abi() >= 1


def _engine_paths() -> list[str]:
    """The import path entries that hold Ladybug and pyarrow here, for the sandboxed process.

    Why: it runs isolated (``-I``), so nothing from this process's environment, such as
    ``PYTHONPATH=/``, reaches its import path, which is also what its sandbox lets it read
    (:func:`etstore.store._graph_worker.restrict_files`). Where the two engines live is
    passed instead: the very directories they were found in, however they got there.
    """
    out: list[str] = []
    for module in ("ladybug", "pyarrow"):
        with suppress(ImportError, ValueError):
            spec = importlib.util.find_spec(module)
            if spec is not None and spec.origin:
                entry = str(Path(spec.origin).resolve().parent.parent)
                if entry not in out:
                    out.append(entry)
    return out


def _clean_env() -> dict[str, str]:
    """The sandboxed process's environment: only what loading shared libraries may need."""
    return {k: v for k, v in os.environ.items() if k in _KEPT_ENV}


_KEPT_ENV = frozenset({"LD_LIBRARY_PATH", "LANG", "LC_ALL", "LC_CTYPE"})
"""Variables the sandboxed process keeps: none of them widens what it may read (its sandbox
names the directories itself), and a library found through ``LD_LIBRARY_PATH`` loads only
from where the sandbox allows."""


class SandboxedGraph:
    """One read-only Ladybug graph served by a sandboxed child process.

    Notes
    -----
    Not thread-safe: one query at a time. Each query costs one round trip over a pipe
    plus an Arrow IPC copy of its result (O(result bytes)).
    """

    __slots__ = ("_proc", "path")

    def __init__(self, proc: subprocess.Popen[bytes], path: Path) -> None:
        self._proc = proc
        self.path = path

    @classmethod
    def start(cls, graph: Path, *, buffer_pool_bytes: int = 0) -> SandboxedGraph | None:
        """Start the process, which closes its sandbox and opens ``graph`` read-only.

        Parameters
        ----------
        graph
            The Ladybug database file.
        buffer_pool_bytes
            Ladybug's buffer pool in bytes (0: Ladybug's default).

        Returns
        -------
        SandboxedGraph or None
            ``None`` when the kernel has no Landlock.

        Raises
        ------
        StoreError
            Ladybug cannot open the graph (the message is Ladybug's first line), or the
            process cannot start.
        """
        if not sandbox_available():
            return None
        cmd = [
            sys.executable,
            "-I",  # isolated: no PYTHONPATH, PYTHONHOME, user site or script directory on its path
            str(Path(worker.__file__)),
            str(Path(graph).resolve()),
            str(buffer_pool_bytes),
            *_engine_paths(),
        ]
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_clean_env()
            )
        except OSError as exc:
            raise StoreError(f"{graph}: cannot start the read-only Cypher process: {exc}") from exc
        reader = cls(proc, Path(graph))
        try:
            status, payload = reader._answer()
        except BaseException:
            reader.close()
            raise
        if status == worker.OK:
            return reader
        reader.close()
        if status == worker.UNSANDBOXED:
            log.warning("read-only Cypher runs without a file sandbox: %s", payload.decode(errors="replace"))
            return None
        raise StoreError(f"{graph}: cannot open the Ladybug graph: {payload.decode(errors='replace')}")

    def query(self, query: str, params: Mapping[str, Any] | None = None) -> pa.Table | None:
        """Run one Cypher statement; its rows as Arrow, ``None`` when it returns no columns.

        Raises
        ------
        QueryError
            Ladybug refuses the statement, or the sandbox refuses a file it names (the
            message is the engine's first line).
        StoreError
            The process has ended (killed, out of memory).
        """
        assert self._proc.stdin is not None  # set by start()
        try:
            request = pickle.dumps((query, dict(params or {})))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise QueryError(f"a parameter cannot be passed to the graph: {exc}") from exc
        try:
            self._proc.stdin.write(self._frame(request))
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise StoreError(self._ended()) from None
        status, payload = self._answer()
        if status == worker.EMPTY:
            return None
        if status == worker.ERROR:
            raise QueryError(payload.decode(errors="replace"))
        return pa.ipc.open_stream(payload).read_all()

    def close(self) -> None:
        """End the process (idempotent)."""
        proc = self._proc
        if proc.poll() is None:
            proc.kill()  # it holds a read-only graph: nothing to save, and its lock goes with it
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None and not stream.closed:
                with suppress(OSError):  # a pipe to an ended process
                    stream.close()

    # ------------------------------------------------------------ frames

    @staticmethod
    def _frame(payload: bytes) -> bytes:
        return len(payload).to_bytes(8, "big") + payload

    def _answer(self) -> tuple[bytes, bytes]:
        assert self._proc.stdout is not None  # set by start()
        body = worker.read_frame(self._proc.stdout)
        if not body:
            raise StoreError(self._ended())
        return body[:1], body[1:]

    def _ended(self) -> str:
        """Why the process stopped answering, in one line."""
        proc = self._proc
        code = proc.wait()
        err = proc.stderr.read().decode(errors="replace").strip().splitlines() if proc.stderr else []
        why = f": {err[-1]}" if err else ""
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return f"{self.path}: the read-only Cypher process {how}{why}"
