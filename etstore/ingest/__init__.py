"""Readers and writers: Chakra ``.et``, Chakra JSON, MSCCL-IR XML, ASTRA-sim custom collectives."""

from __future__ import annotations

from pathlib import Path

from etstore.ingest.algorithm_et import message_sizes, write_algorithm_et
from etstore.ingest.chakra_json import read_chakra_json, write_chakra_json
from etstore.ingest.et import read_et, write_et
from etstore.ingest.files import resolve_rank_files
from etstore.ingest.msccl_writer import to_msccl_xml, write_msccl_xml
from etstore.ingest.msccl_xml import read_msccl_xml
from etstore.model import Trace

__all__ = [
    "message_sizes",
    "read_chakra_json",
    "read_et",
    "read_msccl_xml",
    "read_trace",
    "resolve_rank_files",
    "to_msccl_xml",
    "write_algorithm_et",
    "write_chakra_json",
    "write_et",
    "write_msccl_xml",
]


def read_trace(spec: str | Path, *, name: str | None = None) -> Trace:
    """Read any supported input, chosen by file name: ``.xml`` MSCCL-IR, ``.json``
    Chakra JSON, anything else Chakra ``.et`` (plain or gzip)."""
    text = str(spec)
    if text.endswith(".xml"):
        return read_msccl_xml(spec, name=name)
    _, files = resolve_rank_files(spec)
    if files and files[0][1].name.endswith((".json", ".json.gz")):
        return read_chakra_json(spec, name=name)
    return read_et(spec, name=name)
