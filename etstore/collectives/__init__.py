"""Collective algorithms as Chakra DAGs: check, generate, synthesize and expand them.

An algorithm is an ``algorithm`` :class:`~etstore.model.Trace` in the representation
of ``docs/algorithms.md``, whoever produced it: the MSCCL-IR reader
(:func:`etstore.ingest.msccl_xml.read_msccl_xml`), :func:`generate`, or a synthesizer.

* :func:`check_algorithm` / :func:`ensure_valid` — symbolic execution proves the
  collective's postcondition, matched messages and freedom from deadlock;
* :func:`generate` and :data:`GENERATORS` — ring, direct, halving-doubling, double
  binary tree, all-to-all direct;
* :func:`expand` — replace a workload's collective nodes by an algorithm's per-rank ops.

Writers (MSCCL-IR XML, ASTRA-sim custom-collective ``.et``) live with the other
writers in :mod:`etstore.ingest`.
"""

from __future__ import annotations

from etstore.collectives.check import CheckReport, check_algorithm, ensure_valid
from etstore.collectives.expand import Expansion, expand
from etstore.collectives.generators import GENERATORS, GeneratorInfo, generate

__all__ = [
    "GENERATORS",
    "CheckReport",
    "Expansion",
    "GeneratorInfo",
    "check_algorithm",
    "ensure_valid",
    "expand",
    "generate",
]
