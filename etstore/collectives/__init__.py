"""Collective algorithms as Chakra DAGs: check them, generate them, export them.

An algorithm is an ``algorithm`` :class:`~etstore.model.Trace` in the representation
of ``docs/algorithms.md``, whoever produced it: the MSCCL-IR reader
(:func:`etstore.ingest.msccl_xml.read_msccl_xml`), :func:`generate`, or a synthesizer.

* :func:`check_algorithm` / :func:`ensure_valid` — symbolic execution proves the
  collective's postcondition, matched messages and freedom from deadlock;
* :func:`generate` and :data:`GENERATORS` — ring, direct, halving-doubling, double
  binary tree, all-to-all direct;
* :func:`write_msccl_xml` — MSCCL-IR XML for the MSCCL/RCCL runtimes;
* :func:`write_algorithm_et` — per-rank ``.et`` files for ASTRA-sim's custom collectives;
* :func:`expand` — replace a workload's collective nodes by an algorithm's per-rank ops.
"""

from __future__ import annotations

from etstore.collectives.check import CheckReport, check_algorithm, ensure_valid
from etstore.collectives.et_writer import message_sizes, parse_size, write_algorithm_et
from etstore.collectives.expand import Expansion, expand
from etstore.collectives.generators import GENERATORS, GeneratorInfo, generate
from etstore.collectives.msccl_writer import to_msccl_xml, write_msccl_xml

__all__ = [
    "GENERATORS",
    "CheckReport",
    "Expansion",
    "GeneratorInfo",
    "check_algorithm",
    "ensure_valid",
    "expand",
    "generate",
    "message_sizes",
    "parse_size",
    "to_msccl_xml",
    "write_algorithm_et",
    "write_msccl_xml",
]
