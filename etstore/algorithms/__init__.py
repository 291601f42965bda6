"""Collective algorithms as Chakra DAGs: check, generate, synthesize and expand them.

An algorithm is an ``algorithm`` :class:`~etstore.model.Trace` in the representation
of ``docs/algorithms.md``, whoever produced it: the MSCCL-IR reader
(:func:`etstore.formats.msccl_xml.read_msccl_xml`), :func:`generate`, or a synthesizer.

* :func:`check_algorithm` / :func:`ensure_valid` — symbolic execution proves the
  collective's postcondition, matched messages and freedom from deadlock;
* :func:`generate` and :data:`GENERATORS` — ring, direct, halving-doubling, double
  binary tree, all-to-all direct;
* :func:`synthesize` — TACOS-style synthesis for a topology, with a lower bound;
* :func:`expand` — replace a workload's collective nodes by an algorithm's per-rank ops
  (:mod:`etstore.app.expand` does it against a store; it is not imported
  here, so that importing this package does not open the store layer).

Writers (MSCCL-IR XML, ASTRA-sim custom-collective ``.et``) live with the other
writers in :mod:`etstore.formats`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# expand is also its module's name: bound here, after its module, so that the function wins
from etstore.algorithms.expand import Expansion, expand
from etstore.algorithms.generators import GENERATORS, GeneratorInfo, generate
from etstore.lazy import lazy_exports

if TYPE_CHECKING:
    from etstore.algorithms.check import CheckReport, check_algorithm, ensure_valid
    from etstore.algorithms.synth import SynthResult, synthesize

__all__ = [
    "GENERATORS",
    "CheckReport",
    "Expansion",
    "GeneratorInfo",
    "SynthResult",
    "check_algorithm",
    "ensure_valid",
    "expand",
    "generate",
    "synthesize",
]

# name → the module that defines it; imported on first access, so that a simulation or an
# expansion does not load the checker and the synthesizer
_LAZY = {
    "CheckReport": "etstore.algorithms.check",
    "SynthResult": "etstore.algorithms.synth",
    "check_algorithm": "etstore.algorithms.check",
    "ensure_valid": "etstore.algorithms.check",
    "synthesize": "etstore.algorithms.synth",
}

if not TYPE_CHECKING:  # mypy sees the imports above instead
    __getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
