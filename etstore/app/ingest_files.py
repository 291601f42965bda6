"""Ingest several inputs in one call, with one policy for the inputs that fail.

Each input (a file, directory, glob or ``<dir>/<prefix>``, as
:func:`~etstore.formats.read_trace` reads it) becomes one trace, stored all or
nothing; a failure never undoes the traces stored before it. A file whose content
is nccl-tests or rccl-tests output (:func:`~etstore.formats.nccl_tests.is_nccl_tests_log`)
becomes a measured run instead (:func:`~etstore.app.measured.store_measured_run`), and
one that is a tuner trajectory (:func:`~etstore.formats.tuner.is_tuner_log`) a tuner run
(:func:`~etstore.app.tuner.store_tuner_run`), whatever its name. ``on_error`` decides
what a failure does to the rest of the batch: ``"raise"`` stops there, ``"skip"``
records it and goes on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from etstore.app.measured import MeasuredReport, store_measured_run
from etstore.app.tuner import TunerReport, store_tuner_run
from etstore.errors import EtstoreError, OptionError, StoreError
from etstore.formats import read_trace
from etstore.formats.et_parts import DecodedBatch, MapFn, read_et_parts
from etstore.formats.files import RankFile
from etstore.formats.nccl_tests import is_nccl_tests_log, read_nccl_tests
from etstore.formats.recognise import chakra_rank_files
from etstore.formats.tuner import is_tuner_log, read_tuner_log
from etstore.store.base import IngestReport, Store

__all__ = ["BatchProgressFn", "BatchStats", "OnError", "ingest_paths"]

STREAM_BYTES = 64 << 20
"""Chakra ``.et`` rank files holding at least this many bytes in all (64 MiB, about 0.7M ops at
~96 bytes each) are stored part by part (:func:`~etstore.formats.et_parts.read_et_parts` into
:meth:`Store.ingest_parts <etstore.store.base.Store.ingest_parts>`): memory then holds a few
parts of ~262k ops, not the trace (a whole read peaks near 600 bytes per op), and the decoding
runs beside the store's writes. Smaller inputs are read whole and stored in one transaction,
which is the faster way for them (``bench/README.md``, "Ingest at scale")."""

BatchProgressFn = Callable[[str, str, int, int], None]
"""``progress(path, stage, done, total)``: stage ``read`` (rank files decoded of a Chakra ``.et``
trace, else 0 then 1 of 1), then the store's stages (``parts``, ops stored, for ``.et`` rank
files of :data:`STREAM_BYTES` or more)."""

OnError = Literal["raise", "skip"]
"""What a failing input does to the rest of a batch."""


@dataclass(frozen=True)
class BatchStats:
    """What a batch ingest did.

    ``files_ok`` counts inputs stored or found already stored, ``files_skipped``
    inputs that failed (with ``on_error="skip"``; ``skipped`` holds each one's path
    and message, which starts with the path). ``ops``, ``deps`` and ``missing`` (dependencies on absent nodes)
    add up the stored traces; ``reports`` has one :class:`IngestReport` per
    successful trace input, in input order; ``measured`` one
    :class:`~etstore.app.measured.MeasuredReport` per nccl-tests / rccl-tests log;
    ``tuner`` one :class:`~etstore.app.tuner.TunerReport` per tuner trajectory.
    """

    files_ok: int
    files_skipped: int
    ops: int
    deps: int
    missing: int
    reports: tuple[IngestReport, ...]
    skipped: tuple[tuple[str, str], ...] = ()
    measured: tuple[MeasuredReport, ...] = ()
    tuner: tuple[TunerReport, ...] = ()


def ingest_paths(
    store: Store,
    paths: Sequence[str | Path],
    *,
    name: str | None = None,
    on_error: OnError = "raise",
    progress: BatchProgressFn | None = None,
    map_fn: MapFn | None = None,
) -> BatchStats:
    """Read and store each input in turn, each one all or nothing.

    Parameters
    ----------
    store
        Where the traces go.
    paths
        Inputs, one trace each: a ``.et``/``.json`` file, a directory, a glob,
        ``<dir>/<prefix>``, or an MSCCL-IR ``.xml``; or one measured run each: a
        nccl-tests / rccl-tests log or one tuner run each: a tuner trajectory (both
        recognised by their content).
    name
        The stored name (trace or measured run); only with a single input (default:
        each input's prefix, a log's file name without its extension).
    on_error
        ``"raise"``: the first failing input stops the batch (the traces stored
        before it stay). ``"skip"``: a failing input is recorded in
        :attr:`BatchStats.skipped` and the batch goes on.
    progress
        Called as ``progress(path, stage, done, total)``.
    map_fn
        Decode Chakra ``.et`` rank files elsewhere (:meth:`Fanout.ordered_map
        <etstore.app.fanout.Fanout.ordered_map>` of a Ray cluster, whose workers must see the
        files at the same paths): every such input of two or more files is then stored part by
        part, whatever its size.

    Returns
    -------
    BatchStats

    Raises
    ------
    OptionError
        ``name`` with more than one input, or an unknown ``on_error``.
    EtstoreError
        With ``on_error="raise"``: the first failure, of its own class; the message
        starts with the failing input's path and names the traces stored before it.

    Notes
    -----
    O(total ops + deps) columnar work, one input at a time (memory: one trace; for Chakra
    ``.et`` rank files of :data:`STREAM_BYTES` or more, a few parts of it).
    Interrupts (``KeyboardInterrupt``) and programming errors always propagate;
    only :class:`~etstore.errors.EtstoreError` is subject to ``on_error``.
    """
    if on_error not in ("raise", "skip"):
        raise OptionError(f"on_error {on_error!r}: expected 'raise' or 'skip'")
    if name is not None and len(paths) > 1:
        raise OptionError("a name names one trace; give a single input with it")
    reports: list[IngestReport] = []
    measured: list[MeasuredReport] = []
    tuner: list[TunerReport] = []
    skipped: list[tuple[str, str]] = []
    for path in paths:
        spec = str(path)
        try:
            if is_nccl_tests_log(spec):
                measured.append(_store_log(store, spec, name, progress))
            elif is_tuner_log(spec):
                tuner.append(_store_trajectory(store, spec, name, progress))
            else:
                reports.append(_ingest_one(store, spec, name, progress, map_fn))
        except EtstoreError as exc:
            if on_error == "raise":
                stored = [r.trace.name for r in reports] + [m.name for m in measured]
                stored += [t.name for t in tuner]
                raise _located(exc, spec, stored) from exc
            skipped.append((spec, _path_led(exc, spec)))
    return BatchStats(
        files_ok=len(reports) + len(measured) + len(tuner),
        files_skipped=len(skipped),
        ops=sum(r.trace.ops for r in reports),
        deps=sum(r.trace.deps for r in reports),
        missing=sum(r.trace.missing for r in reports),
        reports=tuple(reports),
        skipped=tuple(skipped),
        measured=tuple(measured),
        tuner=tuple(tuner),
    )


def _ingest_one(
    store: Store, spec: str, name: str | None, progress: BatchProgressFn | None, map_fn: MapFn | None = None
) -> IngestReport:
    """Read one input and store it (the store makes it all or nothing)."""
    if chakra_rank_files(spec, min_bytes=0 if map_fn else STREAM_BYTES) is not None:
        return _ingest_streamed(store, spec, name, progress, map_fn)
    if progress is None:
        return store.ingest(read_trace(spec, name=name), name=name)
    progress(spec, "read", 0, 1)
    trace = read_trace(spec, name=name, progress=lambda done, total: progress(spec, "read", done, total))
    progress(spec, "read", 1, 1)
    return store.ingest(
        trace, name=name, progress=lambda stage, done, total: progress(spec, stage, done, total)
    )


def _ingest_streamed(
    store: Store, spec: str, name: str | None, progress: BatchProgressFn | None, map_fn: MapFn | None = None
) -> IngestReport:
    """Read Chakra rank files part by part into the store (:data:`STREAM_BYTES`): stage ``read``
    (0 then 1) while the first part tells the trace's kind, then the store's ``parts``, counting
    ops against the total estimated from the files read so far."""
    if progress is not None:
        progress(spec, "read", 0, 1)
    parts = read_et_parts(spec, name=name, map_fn=None if map_fn is None else _absolute(map_fn))
    try:
        if progress is None:
            return store.ingest_parts(parts, name=name)
        progress(spec, "read", 1, 1)

        def stored(stage: str, done: int, total: int) -> None:
            progress(spec, stage, done, max(done, parts.expected_ops()) if stage == "parts" else total)

        return store.ingest_parts(parts, name=name, progress=stored)
    finally:
        parts.close()  # a failure mid-way: stop the decoding ahead


def _absolute(map_fn: MapFn) -> MapFn:
    """``map_fn`` given absolute paths: a worker elsewhere does not run in this directory."""

    def mapped(
        fn: Callable[[list[RankFile]], DecodedBatch], batches: Sequence[list[RankFile]]
    ) -> Iterable[DecodedBatch]:
        return map_fn(fn, [[(rank, Path(os.path.abspath(path))) for rank, path in b] for b in batches])

    return mapped


def _store_log(store: Store, spec: str, name: str | None, progress: BatchProgressFn | None) -> MeasuredReport:
    """Parse one nccl-tests / rccl-tests log and store it as a measured run."""
    if progress is not None:
        progress(spec, "read", 0, 1)
    parsed = read_nccl_tests(spec, name=name)
    if progress is not None:
        progress(spec, "read", 1, 1)
    return store_measured_run(store.warehouse, parsed, name=name)


def _store_trajectory(
    store: Store, spec: str, name: str | None, progress: BatchProgressFn | None
) -> TunerReport:
    """Parse one tuner trajectory (CSV or JSON lines) and store it as a tuner run."""
    if progress is not None:
        progress(spec, "read", 0, 1)
    parsed = read_tuner_log(spec, name=name)
    if progress is not None:
        progress(spec, "read", 1, 1)
    return store_tuner_run(store, parsed, name=name)


def _path_led(exc: EtstoreError, spec: str) -> str:
    """The message of ``exc``, starting with the input's path."""
    text = str(exc)
    return text if text.startswith(spec) else f"{spec}: {text}"


def _located(exc: EtstoreError, spec: str, stored: list[str]) -> EtstoreError:
    """``exc`` again, its message led by the input's path and followed by what was stored before."""
    text = _path_led(exc, spec)
    if stored:
        text += f" (stored before this failure: {', '.join(stored)})"
    try:
        return type(exc)(text)
    except TypeError:  # a subclass with a different constructor: keep the message, lose the subclass
        return StoreError(text)
