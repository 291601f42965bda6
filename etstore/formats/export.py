"""One entry point for writing a trace back out, in the form each consumer runs.

``et`` writes Chakra per-rank files as ASTRA-sim runs them: a workload with what ASTRA-sim
cannot read changed and said (:mod:`etstore.formats.astra_et`, communicator groups by
:mod:`etstore.formats.comm_groups`), or exactly as stored with ``verbatim``; an algorithm
trace in ASTRA-sim's custom-collective convention, with int32 chunk fields and, given a
collective size, ``comm_size`` on every message. ``json`` writes Chakra's JSON form;
``msccl-xml`` MSCCL-IR for the MSCCL/RCCL runtimes; ``mscclpp`` an execution plan for
MSCCL++'s executor. Options that mean nothing for a format
are refused rather than ignored.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from etstore.errors import OptionError
from etstore.formats.algorithm_et import write_algorithm_et
from etstore.formats.astra_et import ExportedFiles
from etstore.formats.chakra_json import write_chakra_json
from etstore.formats.chrome_trace import write_chrome_trace
from etstore.formats.comm_groups import comm_groups_path, write_astra_et
from etstore.formats.et import write_et
from etstore.formats.msccl_writer import write_msccl_xml
from etstore.formats.mscclpp_writer import write_mscclpp_plan
from etstore.model import Trace
from etstore.units import parse_size

__all__ = ["EXPORT_FORMATS", "ExportedFiles", "export_trace"]

EXPORT_FORMATS = ("et", "json", "msccl-xml", "mscclpp", "chrome-trace")


def _inside_directory(out: str | Path, name: str) -> Path:
    """``out`` as a file prefix: a directory (existing, or written with a trailing slash) gets the
    trace's name inside it, so ``dir/`` means ``dir/<trace>.<rank>.et`` and not ``dir.<rank>.et``."""
    text = str(out)
    if text.endswith(("/", os.sep)) or Path(text).is_dir():
        return Path(text) / name
    return Path(text)


def export_trace(
    trace: Trace,
    out: str | Path,
    *,
    format: str = "et",
    coll_size: int | str | None = None,
    gzip: bool = False,
    proto: str | None = None,
    verbatim: bool = False,
    timeline: Callable[[Trace], Mapping[str, Any]] | None = None,
) -> ExportedFiles:
    """Write ``trace`` under the prefix ``out``; returns the files written and what was changed.

    Parameters
    ----------
    out
        File prefix; a directory (existing, or given with a trailing ``/``) writes
        ``<out>/<trace name>.<rank>.et`` (``.json``, ``.xml``) inside it.
    format
        ``et`` (``<out>.<rank>.et`` as ASTRA-sim runs them; with collectives, also
        ``<out>.comm_groups.json``), ``json`` (``<out>.<rank>.json``), ``msccl-xml``
        (``<out>.xml``, algorithm traces only), ``mscclpp`` (``<out>.json``, an MSCCL++
        execution plan; algorithm traces only) or ``chrome-trace`` (``<out>.json``: the
        timeline of a trace with timestamps, for Perfetto UI and chrome://tracing).
    coll_size
        ``et`` of an algorithm trace: the collective size (bytes or ``"1MiB"``) that
        sets every message's ``comm_size``.
    gzip
        ``et`` of a non-algorithm trace: gzip each file (ASTRA-sim reads plain files).
    proto
        ``msccl-xml``: the protocol attribute (``Simple``, ``LL``, ``LL128``).
    verbatim
        ``et`` of a non-algorithm trace: write it exactly as stored (``ingest → export``
        byte for byte; the group file from ``params["comm_groups"]`` as stored), without
        the changes ASTRA-sim needs.
    timeline
        ``chrome-trace``: the trace-event document of a trace (the command passes the
        report's recorded timeline: ranks as processes, threads and streams as tracks, from
        the trace's start); default :func:`~etstore.formats.chrome_trace.trace_timeline`.

    Returns
    -------
    ExportedFiles
        The files written, one per rank (``et``, ``json``) or one (``msccl-xml``,
        ``mscclpp``), and
        ``changes``: a line for each kind of change made so that ASTRA-sim runs the ``.et``
        files (none for a trace it runs as stored: those are written unchanged), or why they
        cannot run as written.

    Raises
    ------
    OptionError
        An unknown format, or an option that does not apply to this format or trace:
        a collective size outside ``et`` of an algorithm trace, gzip outside ``et`` of
        other traces, ``mscclpp`` of a trace that is no algorithm, a protocol outside
        ``msccl-xml``, ``verbatim`` outside ``et`` of other traces.

    Notes
    -----
    The cost is the chosen writer's: linear in ops and dependencies for ``et`` and ``json``.
    """
    if format not in EXPORT_FORMATS:
        raise OptionError(f"export: unknown format {format!r}; expected one of {', '.join(EXPORT_FORMATS)}")
    if coll_size is not None and (format != "et" or trace.kind != "algorithm"):
        raise OptionError(
            f"export: a collective size applies only to the et format of algorithm traces; {trace.name!r} "
            f"is {'an' if trace.kind[0] in 'aeiou' else 'a'} {trace.kind} trace exported as {format}"
        )
    if gzip and (format != "et" or trace.kind == "algorithm"):
        raise OptionError("export: gzip applies only to the et format of non-algorithm traces")
    if proto and format != "msccl-xml":
        raise OptionError("export: a protocol applies only to the msccl-xml format")
    if verbatim and (format != "et" or trace.kind == "algorithm"):
        raise OptionError("export: verbatim applies only to the et format of non-algorithm traces")
    if format == "mscclpp" and trace.kind != "algorithm":
        raise OptionError(
            f"export: the mscclpp format writes algorithm traces; {trace.name!r} is a {trace.kind} trace"
        )
    out = _inside_directory(out, trace.name)
    if format == "mscclpp":
        text = str(out)
        return ExportedFiles([write_mscclpp_plan(trace, text if text.endswith(".json") else f"{text}.json")])
    if format == "chrome-trace":  # a trace without start_time_micros raises OptionError there
        return ExportedFiles([write_chrome_trace(timeline(trace) if timeline else trace, out)])
    if format == "json":
        return ExportedFiles(write_chakra_json(trace, out))
    if format == "msccl-xml":
        text = str(out)
        return ExportedFiles(
            [write_msccl_xml(trace, text if text.endswith(".xml") else f"{text}.xml", proto=proto)]
        )
    if trace.kind == "algorithm":  # ASTRA-sim's custom-collective convention (int32 chunk fields)
        size = parse_size(coll_size) if coll_size is not None else None
        written = write_algorithm_et(trace, out, coll_size=size)
        sizeless = (
            "no comm_size written (no --coll-size): ASTRA-sim's custom collectives read every send's "
            "and receive's comm_size (CustomAlgorithm::issue) and stop without it"
        )
        return ExportedFiles(written, () if size is not None else (sizeless,))
    if verbatim:
        return _verbatim(trace, out, gzip_output=gzip)
    # what ASTRA-sim cannot read changed (and said), pg_names it cannot read renamed, plus
    # <out>.comm_groups.json: ASTRA-sim stoi()s pg_name and looks the group up there
    return write_astra_et(trace, out, gzip_output=gzip)


def _verbatim(trace: Trace, out: Path, *, gzip_output: bool) -> ExportedFiles:
    """The trace's ``.et`` files exactly as stored, and its stored communicator groups beside them."""
    paths = list(write_et(trace, out, gzip_output=gzip_output))
    groups = (trace.params or {}).get("comm_groups")
    has_coll = bool(pc.any(pc.equal(trace.ops["type"], "COMM_COLL_NODE")).as_py())
    if has_coll and isinstance(groups, dict):
        path = comm_groups_path(out)
        path.write_text(json.dumps(groups, indent=1) + "\n")
        paths.append(path)
    return ExportedFiles(paths)
