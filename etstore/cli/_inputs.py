"""A command's trace argument: a stored trace's name, or a file or directory to read.

Apart from :mod:`etstore.cli._common` so that commands which read no files (``ls``,
``rm``, ``topo``...) do not import every reader of :mod:`etstore.formats`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from etstore.errors import EtstoreError, OptionError, TraceFormatError, UnknownTraceError
from etstore.formats import read_trace
from etstore.formats.files import (
    CHAKRA_ET,
    CHAKRA_JSON,
    KINETO,
    PYTORCH_ET,
    comm_groups_path,
    names_rank_files,
    resolve_rank_files,
    sniff_format,
)
from etstore.model import Trace
from etstore.store import Store

__all__ = ["read_files", "trace_from"]

# what files may make one trace together
_FAMILY = {CHAKRA_ET: "Chakra", CHAKRA_JSON: "Chakra", PYTORCH_ET: "PyTorch", KINETO: "PyTorch"}


def trace_from(store: Store | None, spec: str) -> Trace:
    """A stored trace by name, or, when ``spec`` names an existing file or directory, read it.

    Parameters
    ----------
    store
        The open store whose names are looked up first; None where no store exists yet.
    spec
        A stored trace's name, or a path, glob or ``[<dir>/]<prefix>`` of trace files.

    Returns
    -------
    Trace
        The stored trace, or the one read from the files.

    Raises
    ------
    UnknownTraceError
        ``spec`` is neither stored nor a path (the message names what is stored).
    TraceFormatError
        The files cannot be read as a trace.

    Notes
    -----
    One catalog listing, then one load or one read.
    """
    if store is not None and spec in {t.name for t in store.traces()}:
        return store.load(spec)
    if Path(spec).exists() or "/" in spec or any(ch in spec for ch in "*?[") or names_rank_files(spec):
        return read_trace(spec)
    if store is None:
        raise UnknownTraceError(f"no trace named {spec!r}: no such file, and no store exists yet (--store)")
    return store.load(spec)  # raises UnknownTraceError naming what is stored


def read_files(
    paths: Sequence[str], *, name: str, progress: Callable[[int, int], None] | None = None
) -> Trace:
    """The files ``paths`` as one trace named ``name``, read as a glob matching just them is read
    (``etstore ingest a.0.et a.1.et --name a``, where the shell expanded the glob).

    Parameters
    ----------
    paths
        Files, each a rank's (or a rank's execution or Kineto trace).
    name
        The trace name.
    progress
        As :func:`~etstore.formats.read_trace` calls it.

    Returns
    -------
    Trace
        Its ``source`` is the paths as given.

    Raises
    ------
    OptionError
        A path is not a file, two files have the same name, or the files are of kinds that
        make no trace together (Chakra rank files with an MSCCL-IR algorithm, say).
    TraceFormatError
        A file is of no kind etstore reads, or the files do not make one trace (the message
        names the files as given).

    Notes
    -----
    The files are linked into a scratch directory under their own names, which
    :func:`~etstore.formats.read_trace` reads as a directory; O(files) links, then the read.
    """
    files = [Path(p) for p in paths]
    for f in files:
        if not f.is_file():
            raise OptionError(
                f"ingest --name {name!r} reads several paths as the files of one trace: {f} is not a file"
            )
    families = {f: _FAMILY.get(sniff_format(f), "MSCCL-IR XML") for f in files}
    odd = next((f for f in files if families[f] != families[files[0]]), None)
    if odd is not None:  # a directory read would pass over it: say so instead
        raise OptionError(
            f"{odd}: {families[odd]}, not a file of the {families[files[0]]} trace {files[0]} is part of "
            f"(--name {name!r} reads several files as one trace)"
        )
    with tempfile.TemporaryDirectory(prefix="etstore-files-") as scratch:
        given: dict[str, str] = {}
        for f in files:
            link = Path(scratch) / f.name
            if link.name in given:
                raise OptionError(f"{f}: a file of the same name is given too ({given[link.name]})")
            link.symlink_to(f.resolve())
            given[link.name] = str(f)
        for f in files:  # ASTRA-sim's communicator groups beside Chakra rank files, as a glob reads them
            sidecar = comm_groups_path(f.parent / resolve_rank_files(f)[0])
            link = Path(scratch) / sidecar.name
            if families[f] == "Chakra" and sidecar.is_file() and link.name not in given:
                link.symlink_to(sidecar.resolve())
                given[link.name] = str(sidecar)
        try:
            trace = read_trace(scratch, name=name, progress=progress)
        except EtstoreError as exc:  # name the files as given, not their links
            text = str(exc)
            for link_name, original in given.items():
                text = text.replace(str(Path(scratch) / link_name), original)
            text = text.replace(f"directory {scratch}", "the files given").replace(scratch, "the files given")
            try:
                again = type(exc)(text)
            except TypeError:  # a subclass with a constructor of its own: keep the message
                again = TraceFormatError(text)
            raise again from exc
    return trace.replace(source=" ".join(paths))
