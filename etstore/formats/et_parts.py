"""Chakra ``.et`` rank files read part by part, for traces too large to hold at once.

:func:`read_et_parts` hands out a trace as :class:`~etstore.model.Trace` parts of
consecutive rank files, in ascending rank order, which :meth:`Store.ingest_parts
<etstore.store.base.Store.ingest_parts>` stores as the one trace :func:`~etstore.formats.et.read_et`
reads: the same name, kind, params (an algorithm's, ASTRA-sim's communicator groups), rows
and content identity. Memory holds a few parts, not the trace: each part is a batch of
rank files whose ops fit an ops budget (at least one file), decoded by
:func:`decode_batch`, and only a bounded number of batches are decoded ahead of the one
being stored.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa

from etstore.errors import OptionError
from etstore.formats._et_kind import AlgorithmScan
from etstore.formats._frames import declared_size
from etstore.formats.et import read_rank_file
from etstore.formats.files import RankFile, comm_groups_path, read_comm_groups, resolve_rank_files
from etstore.model import DEPS_SCHEMA, META_SCHEMA, OPS_SCHEMA, Trace

__all__ = ["DEFAULT_PART_OPS", "DecodedBatch", "EtParts", "MapFn", "decode_batch", "read_et_parts"]

log = logging.getLogger(__name__)

DEFAULT_PART_OPS = 1 << 18
"""Ops a part may hold (262,144): about 60 MiB of decoded columns, so a few parts in flight stay
far below the memory a whole large trace needs, while each part is large enough for the
store's per-part costs (a DuckDB transaction, a digest piece) not to show."""

_FIRST_BYTES_PER_OP = 32
"""Decoded bytes assumed per op before any file is decoded: fewer than real traces take (the
generator in ``bench/`` writes 96), so the first parts err towards being small."""


class DecodedBatch(NamedTuple):
    """One batch of consecutive rank files, decoded: a part's tables."""

    ops: pa.Table
    deps: pa.Table
    """Dependencies on nodes of the same rank file."""
    missing: pa.Table
    """Dependencies on nodes absent from their rank's file."""
    meta: pa.Table
    """One row per rank file: its GlobalMetadata bytes (null when it has none)."""
    nbytes: int
    """Bytes decoded (after decompression)."""


MapFn = Callable[[Callable[[list[RankFile]], DecodedBatch], Sequence[list[RankFile]]], Iterable[DecodedBatch]]
"""``map_fn(decode_batch, batches)``: the results in the order of ``batches``, as the builtin
``map`` gives them (a Ray or process-pool map runs the batches elsewhere)."""


def decode_batch(files: list[RankFile]) -> DecodedBatch:
    """Decode consecutive rank files into one part's tables.

    A module-level function of plain values (``(rank, path)`` pairs in, Arrow tables out), so a
    process pool or a cluster can run it where the files are.

    Parameters
    ----------
    files
        ``(rank, path)`` of each file, ranks ascending.

    Returns
    -------
    DecodedBatch
        Dependencies split into present and missing as :func:`~etstore.formats.et.read_et` splits
        them (dependencies never cross ranks, so a batch splits as the whole trace does).

    Raises
    ------
    TraceFormatError
        A file is truncated, foreign, empty, or two nodes of one rank share an id; the
        message starts with the file's path.

    Notes
    -----
    O(bytes of the files) decode; the missing dependencies are found per file
    (:func:`~etstore.formats.et.read_rank_file`).
    """
    ops_parts, deps_parts, missing_parts, blobs = [], [], [], []
    nbytes = 0
    for item in files:
        got = read_rank_file(item)
        ops_parts.append(got.ops)
        deps_parts.append(got.deps)
        missing_parts.append(got.missing)
        blobs.append(got.meta)
        nbytes += got.nbytes
    meta = pa.Table.from_pydict({"rank": [r for r, _ in files], "metadata": blobs}, schema=META_SCHEMA)
    return DecodedBatch(
        _one(ops_parts, OPS_SCHEMA),
        _one(deps_parts, DEPS_SCHEMA),
        _one(missing_parts, DEPS_SCHEMA),
        meta,
        nbytes,
    )


def _one(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    """``tables`` as one table of one chunk per column (``schema``'s empty table for none)."""
    return pa.concat_tables(tables).combine_chunks() if tables else schema.empty_table()


class _Batches:
    """Consecutive rank files grouped into batches of about ``part_ops`` ops each.

    The ops a file holds are guessed from its (decompressed) size and the bytes per op seen
    so far (:meth:`seen`): the grouping runs as the batches are handed to the decoders, so
    later batches are cut with what the earlier ones showed.
    """

    def __init__(self, files: Sequence[RankFile], sizes: Sequence[int], part_ops: int) -> None:
        self.files, self.sizes, self.part_ops = files, sizes, part_ops
        self.ops = 0
        self.nbytes = 0

    def seen(self, batch: DecodedBatch) -> None:
        self.ops += batch.ops.num_rows
        self.nbytes += batch.nbytes

    def _bytes_per_op(self) -> float:
        return self.nbytes / self.ops if self.ops else _FIRST_BYTES_PER_OP

    def __iter__(self) -> Iterator[list[RankFile]]:
        at, n = 0, len(self.files)
        while at < n:
            budget = self.part_ops * self._bytes_per_op()
            end, total = at + 1, self.sizes[at]
            while end < n and total + self.sizes[end] <= budget:
                total += self.sizes[end]
                end += 1
            yield list(self.files[at:end])
            at = end


def _threads(
    func: Callable[[list[RankFile]], DecodedBatch],
    batches: Iterable[list[RankFile]],
    workers: int,
    ahead: int,
) -> Iterator[DecodedBatch]:
    """``map(func, batches)`` on ``workers`` threads, at most ``ahead`` batches submitted and not
    yet taken; a batch is cut only when a slot frees up."""
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="etstore-decode")
    pending: deque[Future[DecodedBatch]] = deque()
    try:
        for batch in batches:
            pending.append(pool.submit(func, batch))
            if len(pending) >= ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _windows(map_fn: MapFn, batches: Iterable[list[RankFile]], window: int) -> Iterator[DecodedBatch]:
    """``map_fn`` over ``window`` batches at a time: a map that takes all it is given at once
    still holds no more than one window's results."""
    it = iter(batches)
    while True:
        chunk = [b for _, b in zip(range(window), it, strict=False)]
        if not chunk:
            return
        results = iter(map_fn(decode_batch, chunk))
        for _ in chunk:
            got = next(results, None)
            if got is None:
                raise OptionError(f"map_fn returned fewer results than the {len(chunk)} batches it was given")
            yield got


class EtParts:
    """A Chakra ``.et`` trace read part by part (:func:`read_et_parts`); iterate it once.

    Attributes
    ----------
    head
        The trace without rows: name, kind (``workload`` or ``algorithm``), source, params.
    files
        The ``(rank, path)`` rank files, ranks ascending.
    nbytes
        Their (decompressed) sizes, as far as known before reading: the files' sizes, a gzip
        file's trailer.
    """

    def __init__(
        self,
        head: Trace,
        files: list[RankFile],
        nbytes: int,
        batches: Generator[DecodedBatch, None, None],
        on_part: _Seen,
    ) -> None:
        self.head, self.files, self.nbytes = head, files, nbytes
        self._batches = batches
        self._seen = on_part
        self._used = False

    def __iter__(self) -> Iterator[Trace]:
        if self._used:
            raise OptionError("the parts of a trace are read once; call read_et_parts again")
        self._used = True
        head = self.head
        for batch in self._batches:
            self._seen(batch)
            yield head.replace(ops=batch.ops, deps=batch.deps, missing=batch.missing, meta=batch.meta)

    @property
    def files_read(self) -> int:
        """Rank files handed out in parts so far."""
        return self._seen.files

    @property
    def ops_read(self) -> int:
        """Ops handed out in parts so far."""
        return self._seen.ops

    def expected_ops(self) -> int:
        """The trace's ops, estimated from the files read so far (exact once all are read)."""
        seen = self._seen
        if seen.files >= len(self.files) or seen.nbytes == 0:
            return seen.ops
        return max(seen.ops, round(seen.ops * self.nbytes / seen.nbytes))

    def close(self) -> None:
        """Stop decoding ahead and wait for the files being decoded (for a caller that stops
        before the last part, e.g. on a failure); later parts are not read."""
        self._used = True
        self._batches.close()


class _Seen:
    """What has been handed out: files, ops, declared bytes; calls ``progress(files, all)``."""

    def __init__(
        self, sizes: dict[int, int], total: int, progress: Callable[[int, int], None] | None
    ) -> None:
        self.sizes, self.total, self.progress = sizes, total, progress
        self.files = self.ops = self.nbytes = 0

    def __call__(self, batch: DecodedBatch) -> None:
        self.files += batch.meta.num_rows
        self.ops += batch.ops.num_rows
        self.nbytes += sum(self.sizes[r] for r in batch.meta["rank"].to_pylist())
        if self.progress is not None:
            self.progress(self.files, self.total)


def read_et_parts(
    spec: str | Path | Sequence[RankFile],
    *,
    name: str | None = None,
    part_ops: int | None = None,
    workers: int | None = None,
    map_fn: MapFn | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> EtParts:
    """Read a Chakra ``.et`` trace as parts of consecutive rank files, decoded in parallel.

    Parameters
    ----------
    spec
        As for :func:`~etstore.formats.et.read_et`: a file, directory, glob or
        ``<dir>/<prefix>``, or explicit ``[(rank, path)]`` pairs.
    name
        Trace name; defaults to the file prefix.
    part_ops
        Ops a part may hold (default :data:`DEFAULT_PART_OPS`); a part holds at least one
        rank file. The ops of a file are
        estimated from its size before it is read, so a part may pass the budget by the
        estimate's error.
    workers
        Decoding threads (default: the machine's cores); ignored with ``map_fn``.
    map_fn
        Decode elsewhere: ``map_fn(decode_batch, batches)`` returns the results in order
        (:data:`MapFn`). It is given ``2 × workers`` batches (at least 4) at a time, so a map that
        runs all it is given at once still holds a bounded number of parts.
    progress
        Called as ``progress(files_read, files)`` as each part is handed out.

    Returns
    -------
    EtParts
        Its ``head``, and the parts when iterated: :class:`~etstore.model.Trace` values with
        the head's name, kind, source and params, each holding its ranks' ops, dependencies,
        missing dependencies and metadata.

    Raises
    ------
    TraceFormatError
        As :func:`~etstore.formats.et.read_et` raises, naming the file: here for the files
        read to tell the trace's kind, while iterating for the rest.
    OptionError
        ``part_ops`` or ``workers`` below 1, or no rank files.

    Notes
    -----
    Threads, not processes, by default: the native decoder releases the GIL, and a
    thread's Arrow tables reach the store without being pickled or copied. At most
    ``workers + 1`` batches are decoded ahead of the part being stored, so memory holds a
    few parts. The kind is known from the first part for any trace whose first files are
    not an algorithm's (:class:`~etstore.formats._et_kind.AlgorithmScan`); otherwise the
    files are decoded once to tell it and again to hand them out. O(total bytes) decode.
    """
    part_ops = DEFAULT_PART_OPS if part_ops is None else part_ops
    if part_ops < 1:
        raise OptionError(f"part_ops must be at least 1, got {part_ops}")
    if workers is not None and workers < 1:
        raise OptionError(f"workers must be at least 1, got {workers}")
    if isinstance(spec, (str, Path)):
        prefix, files = resolve_rank_files(spec)
        source = str(spec)
    else:
        files = list(spec)
        prefix = files[0][1].name.split(".")[0] if files else "trace"
        source = ",".join(str(p) for _, p in files)
    if not files:
        raise OptionError("read_et_parts: no rank files given")
    sizes = [_size(path) for _, path in files]
    threads = workers or os.cpu_count() or 1

    def batches() -> Generator[DecodedBatch, None, None]:
        grouping = _Batches(files, sizes, part_ops)
        decoded = (
            _threads(decode_batch, grouping, threads, threads + 1)
            if map_fn is None
            else _windows(map_fn, grouping, max(4, 2 * threads))
        )
        try:
            for batch in decoded:
                grouping.seen(batch)
                yield batch
        finally:
            close = getattr(decoded, "close", None)
            if close is not None:
                close()

    params: dict[str, object] = {}
    scan = AlgorithmScan()
    first = batches()
    kept: DecodedBatch | None = None
    for batch in first:
        scan.add(batch.ops, batch.meta["metadata"].to_pylist())
        kept = batch if kept is None else kept
        if scan.ruled_out:
            break
    if kept is not None and scan.files == kept.meta.num_rows:  # told by the first part: go on from there
        rest = _resume(kept, first)
    else:  # told by more of the files, which were dropped on the way: read them again
        first.close()
        rest = batches()
    algorithm = scan.params()
    if algorithm is not None:
        params.update(algorithm)
    sidecar = comm_groups_path(files[0][1].parent / prefix)
    if sidecar.is_file():  # ASTRA-sim's groups, as export writes them
        params["comm_groups"] = read_comm_groups(sidecar)
    head = Trace(
        ops=OPS_SCHEMA.empty_table(),
        name=name or prefix,
        kind="workload" if algorithm is None else "algorithm",
        source=source,
        params=params,
    )
    by_rank = {rank: size for (rank, _), size in zip(files, sizes, strict=True)}
    return EtParts(head, files, sum(sizes), rest, _Seen(by_rank, len(files), progress))


def _resume(kept: DecodedBatch, rest: Iterator[DecodedBatch]) -> Generator[DecodedBatch, None, None]:
    """``kept``, then the rest (closing this closes the rest's decoding)."""
    yield kept
    yield from rest


def _size(path: Path) -> int:
    """A file's declared (decompressed) size; 0 when it cannot be read (decoding says why)."""
    with contextlib.suppress(OSError):
        return declared_size(path)
    return 0
