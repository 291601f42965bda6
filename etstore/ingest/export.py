"""One entry point for writing a trace back out, in the form each consumer runs.

``et`` writes Chakra per-rank files (an algorithm trace in ASTRA-sim's
custom-collective convention, with int32 chunk fields and, given a collective size,
``comm_size`` on every message); ``json`` Chakra's JSON form; ``msccl-xml`` MSCCL-IR
for the MSCCL/RCCL runtimes. Options that mean nothing for a format are refused
rather than ignored.
"""

from __future__ import annotations

import os
from pathlib import Path

from etstore.errors import OptionError
from etstore.ingest.algorithm_et import write_algorithm_et
from etstore.ingest.chakra_json import write_chakra_json
from etstore.ingest.chrome_trace import write_chrome_trace
from etstore.ingest.comm_groups import write_astra_et
from etstore.ingest.msccl_writer import write_msccl_xml
from etstore.model import Trace
from etstore.units import parse_size

__all__ = ["EXPORT_FORMATS", "export_trace"]

EXPORT_FORMATS = ("et", "json", "msccl-xml", "chrome-trace")


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
) -> list[Path]:
    """Write ``trace`` under the prefix ``out``; returns the files written.

    Parameters
    ----------
    out
        File prefix; a directory (existing, or given with a trailing ``/``) writes
        ``<out>/<trace name>.<rank>.et`` (``.json``, ``.xml``) inside it.
    format
        ``et`` (``<out>.<rank>.et``; with collectives, also ``<out>.comm_groups.json``
        and integer ``pg_name``s, as ASTRA-sim reads them), ``json`` (``<out>.<rank>.json``) or ``msccl-xml``
        (``<out>.xml``, algorithm traces only) or ``chrome-trace`` (``<out>.json``: the
        timeline of a trace with timestamps, for Perfetto UI and chrome://tracing).
    coll_size
        ``et`` of an algorithm trace: the collective size (bytes or ``"1MiB"``) that
        sets every message's ``comm_size``.
    gzip
        ``et`` of a non-algorithm trace: gzip each file (ASTRA-sim reads plain files).
    proto
        ``msccl-xml``: the protocol attribute (``Simple``, ``LL``, ``LL128``).

    Returns
    -------
    list of Path
        The files written, one per rank (``et``, ``json``) or one (``msccl-xml``).

    Raises
    ------
    OptionError
        An unknown format, or an option that does not apply to this format or trace:
        a collective size outside ``et`` of an algorithm trace, gzip outside ``et`` of
        other traces, a protocol outside ``msccl-xml``.

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
    out = _inside_directory(out, trace.name)
    if format == "chrome-trace":  # a trace without start_time_micros raises OptionError there
        return [write_chrome_trace(trace, out)]
    if format == "json":
        return list(write_chakra_json(trace, out))
    if format == "msccl-xml":
        text = str(out)
        return [write_msccl_xml(trace, text if text.endswith(".xml") else f"{text}.xml", proto=proto)]
    if trace.kind == "algorithm":  # ASTRA-sim's custom-collective convention (int32 chunk fields)
        size = parse_size(coll_size) if coll_size is not None else None
        return write_algorithm_et(trace, out, coll_size=size)
    # integer pg_names + <out>.comm_groups.json: ASTRA-sim stoi()s pg_name and looks the group up there
    return write_astra_et(trace, out, gzip_output=gzip)
