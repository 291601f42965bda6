"""Readers and writers: Chakra ``.et``, Chakra JSON, PyTorch execution traces and Kineto
traces, MSCCL-IR XML, MSCCL++ execution plans, ASTRA-sim custom collectives.
:func:`read_trace` recognises each input by its content.

The readers and writers are imported on first use (PEP 562): a process that reads one
format (``from etstore.formats.et import read_et``, as a simulation of ``.et`` files
does) loads neither the other readers nor the MSCCL writer's XML and URL modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from etstore.lazy import lazy_exports

if TYPE_CHECKING:
    from etstore.formats.algorithm_et import message_sizes, write_algorithm_et
    from etstore.formats.chakra_json import read_chakra_json, write_chakra_json
    from etstore.formats.et import read_et, write_et
    from etstore.formats.et_parts import read_et_parts
    from etstore.formats.files import resolve_rank_files
    from etstore.formats.kineto import read_kineto
    from etstore.formats.msccl_writer import to_msccl_xml, write_msccl_xml
    from etstore.formats.msccl_xml import read_msccl_xml
    from etstore.formats.mscclpp_plan import read_mscclpp_plan
    from etstore.formats.mscclpp_writer import to_mscclpp_plan, write_mscclpp_plan
    from etstore.formats.pytorch_et import read_pytorch_et
    from etstore.formats.recognise import read_trace

__all__ = [
    "message_sizes",
    "read_chakra_json",
    "read_et",
    "read_et_parts",
    "read_kineto",
    "read_msccl_xml",
    "read_mscclpp_plan",
    "read_pytorch_et",
    "read_trace",
    "resolve_rank_files",
    "to_msccl_xml",
    "to_mscclpp_plan",
    "write_algorithm_et",
    "write_chakra_json",
    "write_et",
    "write_msccl_xml",
    "write_mscclpp_plan",
]

# name → the module that defines it; imported by __getattr__ on first access
_LAZY = {
    "message_sizes": "etstore.formats.algorithm_et",
    "read_chakra_json": "etstore.formats.chakra_json",
    "read_et": "etstore.formats.et",
    "read_et_parts": "etstore.formats.et_parts",
    "read_kineto": "etstore.formats.kineto",
    "read_msccl_xml": "etstore.formats.msccl_xml",
    "read_mscclpp_plan": "etstore.formats.mscclpp_plan",
    "read_pytorch_et": "etstore.formats.pytorch_et",
    "read_trace": "etstore.formats.recognise",
    "resolve_rank_files": "etstore.formats.files",
    "to_msccl_xml": "etstore.formats.msccl_writer",
    "to_mscclpp_plan": "etstore.formats.mscclpp_writer",
    "write_algorithm_et": "etstore.formats.algorithm_et",
    "write_chakra_json": "etstore.formats.chakra_json",
    "write_et": "etstore.formats.et",
    "write_msccl_xml": "etstore.formats.msccl_writer",
    "write_mscclpp_plan": "etstore.formats.mscclpp_writer",
}

if not TYPE_CHECKING:  # mypy sees the imports above instead
    __getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
