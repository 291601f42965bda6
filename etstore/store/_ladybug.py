"""The embedded store's Ladybug database: opened on first use, with a buffer pool sized for
what is about to be loaded, and closed after every bulk load.

Ladybug keeps what a load brought into its buffer pool until the database closes, so a
process that ingests many traces would otherwise fill the pool and fail. A read-only
store's graph is served by a process the kernel keeps from touching files
(:mod:`etstore.store._graph_reader`); where the kernel cannot, it is opened read-only here.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from pathlib import Path
from typing import Any

from etstore.errors import StoreError
from etstore.store._graph_reader import SandboxedGraph
from etstore.store.graph import graph_ddl

__all__ = ["LadybugGraph", "buffer_pool_bytes", "first_line", "max_pool_bytes", "trim_heap"]


def max_pool_bytes() -> int:
    """Ladybug's own default pool: 80% of RAM (0, its default, where that is unknown)."""
    try:
        return int(0.8 * os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 0


def buffer_pool_bytes(graph: Path, incoming: int) -> int:
    """Ladybug's buffer pool: 16x the graph file plus what is about to be loaded, at
    least 1 GiB, at most Ladybug's own default of 80% of RAM. Ladybug maps the whole
    pool when it opens (about 1.2 ms per GiB here: 25 ms at its default on 24 GiB,
    paid by every command that opens the graph)."""
    ceiling = max_pool_bytes()
    if not ceiling:  # pragma: no cover - not POSIX
        return 0
    held = graph.stat().st_size if graph.exists() else 0
    return int(min(ceiling, max(1 << 30, 16 * (held + incoming))))


def first_line(exc: BaseException) -> str:
    """An engine error's first line (the rest is its own context)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class LadybugGraph:
    """The graph of one store directory, opened on demand.

    ``read_only``: the store is open for reading; ``engines_read_only``: the files must not
    be written (false only for a store a read-only open is creating).
    """

    def __init__(self, path: Path, *, read_only: bool, engines_read_only: bool) -> None:
        self.path = path
        self.read_only = read_only
        self.engines_read_only = engines_read_only
        self.conn: Any = None
        self.db: Any = None
        self._scratch: tempfile.TemporaryDirectory[str] | None = None  # see _empty_graph

    def open(self, incoming: int = 0, *, pool: int | None = None) -> Any:
        """The connection, opened once with a pool sized for ``incoming`` more bytes of rows
        (or of ``pool`` bytes).

        A store this read-only open created gets its empty graph first."""
        if self.conn is None and self.read_only:
            graph = self.path
            if not graph.exists() and not self.engines_read_only:
                self._open(0, read_only=False)
                self.release()
            elif not graph.exists():  # nothing was ever stored: an empty graph, outside the store
                graph = self._empty_graph()
            self.db = self.conn = SandboxedGraph.start(
                graph, buffer_pool_bytes=buffer_pool_bytes(graph, 0)
            )  # closing either ends the process
            if self.conn is None:
                self._open(0, read_only=True, path=graph)
        if self.conn is None:
            self._open(incoming, read_only=self.engines_read_only, pool=pool)
        return self.conn

    def _empty_graph(self) -> Path:
        """A graph with the schema and no rows in a scratch directory (removed by :meth:`release`):
        what a reader of a store without a graph queries, since Ladybug cannot create one
        read-only and a reader writes nothing into the store."""
        self._scratch = tempfile.TemporaryDirectory(prefix="etstore-empty-graph-")
        path = Path(self._scratch.name) / "graph"
        self._open(0, read_only=False, path=path)
        self.release(keep_scratch=True)
        return path

    def _open(
        self, incoming: int, *, read_only: bool, pool: int | None = None, path: Path | None = None
    ) -> None:
        """Open the graph (or the one at ``path``) in this process (writable ones get the schema)."""
        import ladybug  # imported lazily: SQL-only commands never pay for it

        path = path or self.path
        try:
            # checkpoints are ours: one per build instead of one per COPY statement (each
            # commit of a bulk load would otherwise checkpoint by itself)
            self.db = ladybug.Database(
                str(path),
                read_only=read_only,
                auto_checkpoint=read_only,
                buffer_pool_size=pool or buffer_pool_bytes(path, incoming),
            )
            conn: Any = ladybug.Connection(self.db)
            if not read_only:
                for ddl in graph_ddl():
                    conn.execute(ddl)
        except RuntimeError as exc:
            if self.db is not None:  # opened, then refused: close it, or it holds the file
                self.db.close()
                self.db = None
            raise StoreError(f"{self.path.parent}: cannot open the Ladybug graph: {first_line(exc)}") from exc
        self.conn = conn

    def release(self, *, keep_scratch: bool = False) -> None:
        """Close the database (after a bulk load); the next use reopens it (a few ms)."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
            self.db.close()
            self.db = None
            trim_heap()
        if self._scratch is not None and not keep_scratch:
            self._scratch.cleanup()
            self._scratch = None


def trim_heap() -> None:
    """Hand the C heap's free pages back to the system. Ladybug frees what a bulk load
    allocated outside its pool when the database closes, but glibc keeps those pages in
    the process (measured: 1.6 GB still resident after closing a 67M-edge load, 0.1 GB
    after trimming), so the next load would stack on top of the last. A no-op without
    glibc."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return
    trim(0)
