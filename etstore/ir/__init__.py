"""MSCCL-IR steps ⇄ algorithm :class:`~etstore.model.Trace`: how a step becomes Chakra nodes.

The reader (``etstore.formats.msccl_xml``) and the generators fill a :class:`StepTable`
(one row per MSCCL-IR step, columnar) and call :func:`build_trace`; the writer and the
checker go the other way with :func:`node_semantics`, which recovers what every node
of any algorithm trace does to which buffer slots.

Modules: :mod:`~etstore.ir.steps` (the step vocabulary and :class:`StepTable`),
:mod:`~etstore.ir.build` (steps → trace, after the checks of ``_validate``),
:mod:`~etstore.ir.semantics` (trace → what each node does),
:mod:`~etstore.ir.verdict` (whether the trace runs to completion as MSCCL runs it: matched
messages, no deadlock; the verdict the checker, the writer and the simulator share).

Step → nodes (runtime semantics of the MSCCL interpreter; ``src`` of a received step
is the *local* operand):

====== ============================= ===================================================
type   nodes (chained)               data effect
====== ============================= ===================================================
s      SEND                          send ``src[srcoff:+cnt]``
r      RECV                          ``dst[dstoff:+cnt] = msg``
rcs    RECV → SEND                   ``dst = msg``; forward ``msg``
rrs    RECV → reduce → SEND          forward ``msg ⊕ src`` (nothing stored)
rrc    RECV → reduce                 ``dst = msg ⊕ src``
rrcs   RECV → reduce → SEND          ``dst = msg ⊕ src``; forward it
cpy    copy                          ``dst = src``
re     reduce                        ``dst = dst ⊕ src``
nop    (none)                        dependency only (also ``d``, ``st``)
====== ============================= ===================================================
"""

from __future__ import annotations

from etstore.ir.build import build_trace
from etstore.ir.semantics import NodeSemantics, default_buffers, node_semantics
from etstore.ir.steps import (
    BUF_CODE,
    BUFFERS,
    COLLECTIVES,
    COPY,
    KIND_NAMES,
    RECV,
    REDUCE,
    SEND,
    STEP_NODES,
    STEP_TYPES,
    TYPE_CODE,
    Locate,
    StepTable,
)
from etstore.ir.verdict import RunVerdict, run_verdict

__all__ = [
    "BUFFERS",
    "BUF_CODE",
    "COLLECTIVES",
    "COPY",
    "KIND_NAMES",
    "RECV",
    "REDUCE",
    "SEND",
    "STEP_NODES",
    "STEP_TYPES",
    "TYPE_CODE",
    "Locate",
    "NodeSemantics",
    "RunVerdict",
    "StepTable",
    "build_trace",
    "default_buffers",
    "node_semantics",
    "run_verdict",
]
