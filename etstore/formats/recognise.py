"""Any supported input, recognised by its content: :func:`read_trace`.

Apart from the package's ``__init__`` so that reading one format (``from
etstore.formats.et import read_et``) does not load every other reader. A reader is
imported when a file of its format is recognised (:data:`_READERS`, through the
package's first-use names): reading ``.et`` files loads no PyTorch, Kineto or MSCCL-IR
reader.
"""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Callable
from pathlib import Path

from etstore.errors import TraceFormatError
from etstore.formats._frames import declared_size
from etstore.formats.files import (
    CHAKRA_ET,
    CHAKRA_JSON,
    KINETO,
    MSCCL_XML,
    MSCCLPP_PLAN,
    PYTORCH_ET,
    RankFile,
    candidate_files,
    resolve_rank_files,
    sniff_format,
    torch_rank_files,
)
from etstore.model import Trace

__all__ = ["chakra_rank_files", "read_trace"]

# format → its reader, a first-use name of etstore.formats (whose table says where it lives)
_READERS = {
    CHAKRA_ET: "read_et",
    CHAKRA_JSON: "read_chakra_json",
    KINETO: "read_kineto",
    MSCCL_XML: "read_msccl_xml",
    MSCCLPP_PLAN: "read_mscclpp_plan",
    PYTORCH_ET: "read_pytorch_et",
}


def _reader(fmt: str) -> Callable[..., Trace]:
    reader: Callable[..., Trace] = getattr(importlib.import_module("etstore.formats"), _READERS[fmt])
    return reader


def read_trace(
    spec: str | Path, *, name: str | None = None, progress: Callable[[int, int], None] | None = None
) -> Trace:
    """Read any supported input, recognised by its content (gzip or not), not its name.

    Parameters
    ----------
    spec
        A file, a directory, a glob or ``<dir>/<prefix>``. A file is Chakra ``.et``
        (binary frames, with or without GlobalMetadata), Chakra JSON, a PyTorch execution
        trace, a Kineto trace, MSCCL-IR XML or an MSCCL++ execution plan. A directory (or
        glob) of per-rank files is one trace: Chakra ``<prefix>.<rank>.et``/``.json``, or
        PyTorch files whose rank is in their metadata (Kineto ``distributedInfo.rank``) or
        their name; an execution trace and a Kineto trace of the same rank are linked.
    name
        The trace name; defaults to the file prefix.
    progress
        ``progress(files_done, files)``, called as each rank file of a Chakra ``.et``
        trace is decoded (the long read of a large trace); other inputs do not call it.

    Returns
    -------
    Trace
        For PyTorch inputs ``params["recognised"]`` says what was found (format, ops,
        collectives by type, linked fraction).

    Raises
    ------
    TraceFormatError
        One line naming the file: unreadable, truncated or foreign content, a missing
        rank, files of different runs, or a format's own errors.

    Notes
    -----
    Recognition reads the first 64 KiB of each file; the readers' costs follow.
    """
    found = candidate_files(spec)
    if found is None:
        path = Path(spec)
        if not path.is_file():  # <dir>/<prefix>: Chakra's rank files
            return _read_chakra(spec, name, progress)
        return _read_one_file(path, name)
    where, files = found
    formats = [(p, _sniff_in_directory(p)) for p in files]
    torch = [(p, f) for p, f in formats if f in (PYTORCH_ET, KINETO)]
    if not torch:
        return _read_chakra(spec, name, progress)
    if len(torch) != len(formats):
        other = next(p for p, f in formats if f not in (PYTORCH_ET, KINETO))
        raise TraceFormatError(f"{other}: not a PyTorch trace, unlike the other files in {where}")
    ranks = torch_rank_files(where, torch)
    if name is None and Path(spec).is_dir():  # per-rank files share no prefix worth keeping
        name = Path(spec).resolve().name
    if ranks.et:
        return _reader(PYTORCH_ET)(ranks.et, name=name, kineto=ranks.kineto or None, docs=ranks.docs)
    return _reader(KINETO)(sorted(ranks.kineto.items()), name=name, docs=ranks.docs)


def chakra_rank_files(spec: str | Path, *, min_bytes: int = 0) -> list[RankFile] | None:
    """The Chakra ``.et`` rank files :func:`read_trace` reads for ``spec``, when they are at
    least two and hold ``min_bytes`` or more; None for any other input.

    Parameters
    ----------
    spec
        As for :func:`read_trace`.
    min_bytes
        Least (decompressed) bytes the files must hold in all, as far as known before
        reading them (their sizes, a gzip file's trailer); checked before anything is
        sniffed, so a small input costs a directory listing and a ``stat`` per file.

    Returns
    -------
    list of (rank, path), or None
        None too where ``spec`` is in error (no files, mixed prefixes, a rank twice):
        :func:`read_trace` then says why.

    Notes
    -----
    O(files) ``stat`` calls; past ``min_bytes``, each file's first 64 KiB sniffed as
    :func:`read_trace` sniffs them.
    """
    found = candidate_files(spec)
    if found is None and Path(spec).is_file():
        return None
    try:
        paths = found[1] if found is not None else [p for _, p in resolve_rank_files(spec)[1]]
        if len(paths) < 2 or _declared_bytes(paths, min_bytes) < min_bytes:
            return None
        if found is not None and any(_sniff_in_directory(p) in (PYTORCH_ET, KINETO) for p in paths):
            return None
        _, files = resolve_rank_files(spec)
        if sniff_format(files[0][1]) != CHAKRA_ET:
            return None
    except (TraceFormatError, OSError):
        return None
    return files


def _declared_bytes(paths: list[Path], enough: int) -> int:
    """The files' declared sizes added up, stopping once past ``enough``."""
    total = 0
    for p in paths:
        total += declared_size(p)
        if total >= enough > 0:
            break
    return total


def _sniff_in_directory(path: Path) -> str | None:
    """A directory member's format; None for a file that is no trace (a side file such as
    a comm-group JSON), which the Chakra rules then judge by its name."""
    try:
        return sniff_format(path)
    except TraceFormatError:
        return None


def _read_one_file(path: Path, name: str | None) -> Trace:
    fmt = sniff_format(path)
    if fmt == MSCCL_XML:
        with path.open("rb") as f:
            if f.read(2) == b"\x1f\x8b":  # the XML reader streams the file itself
                raise TraceFormatError(f"{path}: gzip-compressed MSCCL-IR XML; decompress it first")
        return _reader(MSCCL_XML)(path, name=name)
    if fmt == MSCCLPP_PLAN:
        return _reader(MSCCLPP_PLAN)(path, name=name)
    if fmt == KINETO:
        return _reader(KINETO)(path, name=name)
    if fmt == PYTORCH_ET:
        return _reader(PYTORCH_ET)(path, name=name)
    if fmt == CHAKRA_JSON:
        return _reader(CHAKRA_JSON)(path, name=name)
    return _reader(CHAKRA_ET)(path, name=name)


def _read_chakra(spec: str | Path, name: str | None, progress: Callable[[int, int], None] | None) -> Trace:
    """Chakra rank files (``<prefix>.<rank>.et`` or ``.json``)."""
    _, files = resolve_rank_files(spec)
    if files and sniff_format(files[0][1]) == CHAKRA_JSON:
        return _reader(CHAKRA_JSON)(spec, name=name)
    if progress is None:
        return _reader(CHAKRA_ET)(spec, name=name)
    decoded = itertools.count(1)  # read_et reports bytes per file; the bar counts files
    progress(0, len(files))
    return _reader(CHAKRA_ET)(spec, name=name, progress=lambda _nbytes: progress(next(decoded), len(files)))
