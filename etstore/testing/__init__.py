"""Test helpers: trace equality that names the first difference, and small hand-built inputs.

Used by ``tests/`` and ``bench/`` only; no module of the package imports it (the layering
test checks). Everything here is deterministic and small enough to check on paper.

- :func:`assert_trace_equal`: two traces hold the same ops and deps, or an
  :class:`AssertionError` naming the first differing (rank, id, column).
- MSCCL-IR text: :func:`msccl_doc`, :func:`msccl_tb`, :func:`msccl_step` build a
  2-GPU document line by line; :func:`ring_allreduce_xml` writes the N-rank ring
  all-reduce in the shape of ASTRA-sim's ``custom_allreduce.xml``.
- Traces: :func:`trace_from_nodes` (node dicts and edges), :func:`two_rank_allreduce`,
  :func:`p2p_trace`, :func:`slot_policy_trace`, and the 2-rank overlap workload
  :func:`hand_workload` with its expansion (:func:`hand_parent`, :func:`hand_expanded`,
  :func:`ingest_hand_expanded`).
- :func:`rank_parts`: a trace split into consecutive rank ranges, as a streamed ingest takes it.
- :func:`require_extension`: a C extension, or a skip (a failure under CI).
- Stores: :class:`RecordedStore` (what a store of recorded runs holds); servers:
  :func:`clear_server`, :func:`serve` (a test server holding what a store published) and
  :class:`Backend` (a store, and what it holds as a backend under test reads it).
"""

from __future__ import annotations

from etstore.testing._equality import ExtensionMissingError, assert_trace_equal, rank_parts, require_extension
from etstore.testing._msccl import MSCCL_HEAD, msccl_doc, msccl_step, msccl_tb, ring_allreduce_xml
from etstore.testing._stores import Backend, RecordedStore, clear_server, recorded_trace, serve, two_chains
from etstore.testing._traces import (
    hand_expanded,
    hand_parent,
    hand_workload,
    ingest_hand_expanded,
    p2p_trace,
    slot_policy_trace,
    trace_from_nodes,
    two_rank_allreduce,
)

__all__ = [
    "MSCCL_HEAD",
    "Backend",
    "ExtensionMissingError",
    "RecordedStore",
    "assert_trace_equal",
    "clear_server",
    "hand_expanded",
    "hand_parent",
    "hand_workload",
    "ingest_hand_expanded",
    "msccl_doc",
    "msccl_step",
    "msccl_tb",
    "p2p_trace",
    "rank_parts",
    "recorded_trace",
    "require_extension",
    "ring_allreduce_xml",
    "serve",
    "slot_policy_trace",
    "trace_from_nodes",
    "two_chains",
    "two_rank_allreduce",
]
