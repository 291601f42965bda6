"""One entry point for writing a trace back out, in the form each consumer runs.

``et`` writes Chakra per-rank files (an algorithm trace in ASTRA-sim's
custom-collective convention, with int32 chunk fields and, given a collective size,
``comm_size`` on every message); ``json`` Chakra's JSON form; ``msccl-xml`` MSCCL-IR
for the MSCCL/RCCL runtimes. Options that mean nothing for a format are refused
rather than ignored.
"""

from __future__ import annotations

from pathlib import Path

from etstore.errors import EtstoreError
from etstore.model import Trace

__all__ = ["EXPORT_FORMATS", "export_trace"]

EXPORT_FORMATS = ("et", "json", "msccl-xml")


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
    format
        ``et`` (``<out>.<rank>.et``), ``json`` (``<out>.<rank>.json``) or ``msccl-xml``
        (``<out>.xml``, algorithm traces only).
    coll_size
        ``et`` of an algorithm trace: the collective size (bytes or ``"1MiB"``) that
        sets every message's ``comm_size``.
    gzip
        ``et`` of a non-algorithm trace: gzip each file (ASTRA-sim reads plain files).
    proto
        ``msccl-xml``: the protocol attribute (``Simple``, ``LL``, ``LL128``).

    Raises
    ------
    EtstoreError
        An unknown format, or an option that does not apply to this format or trace.
    """
    if format not in EXPORT_FORMATS:
        raise EtstoreError(f"export: unknown format {format!r}; expected one of {', '.join(EXPORT_FORMATS)}")
    if coll_size is not None and (format != "et" or trace.kind != "algorithm"):
        raise EtstoreError(
            f"export: --coll-size applies to --format et of algorithm traces; {trace.name!r} is "
            f"{'an' if trace.kind[0] in 'aeiou' else 'a'} {trace.kind} trace exported as {format}"
        )
    if gzip and (format != "et" or trace.kind == "algorithm"):
        raise EtstoreError("export: --gzip applies to --format et of non-algorithm traces only")
    if proto and format != "msccl-xml":
        raise EtstoreError("export: --proto applies to --format msccl-xml only")
    if format == "json":
        from etstore.ingest.chakra_json import write_chakra_json

        return list(write_chakra_json(trace, out))
    if format == "msccl-xml":
        from etstore.ingest.msccl_writer import write_msccl_xml

        text = str(out)
        return [write_msccl_xml(trace, text if text.endswith(".xml") else f"{text}.xml", proto=proto)]
    if trace.kind == "algorithm":  # ASTRA-sim's custom-collective convention (int32 chunk fields)
        from etstore.ingest.algorithm_et import write_algorithm_et
        from etstore.units import parse_size

        size = parse_size(coll_size) if coll_size is not None else None
        return write_algorithm_et(trace, out, coll_size=size)
    from etstore.ingest.et import write_et

    return list(write_et(trace, out, gzip_output=gzip))
