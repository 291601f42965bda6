"""Which NPU slot each op takes and gives back, and the execution models of expanded collectives.

ASTRA-sim's workload layer gives each NPU one slot per class (``HardwareResource``:
one GPU compute op, one CPU op, one communication op in flight; a receive takes
none) and issues a rank's dependency-free nodes in node-id order where a slot is
free. Inside a collective node the algorithm's steps take no slot (ASTRA-sim's
custom collectives issue every dependency-free step at once). The ops ``expand``
writes for a collective are both at once: workload nodes of the exported ``.et``,
and steps of the algorithm the node ran. :attr:`SimConfig.expanded_slots` says which
they are (docs/simulator.md, "Expanded collectives: two execution models"):

* ``"astra"``: ordinary workload ops, as ASTRA-sim runs the exported files: each
  send holds its NPU's communication slot until its message arrives, each reduction
  or copy its compute slot;
* ``"collective"``: steps, as inside the node: no slot of their own, and the block
  that replaced a node holds the communication slot while it runs, where the trace
  records its blocks (:mod:`._holds`).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from etstore.sim._kinds import (
    K_COLL,
    K_COMP,
    K_CPU,
    K_DELAY,
    K_MEM,
    K_RECV,
    K_SEND,
    NRES,
    R_COMM,
    R_COMP,
    R_CPU,
    R_MEM,
    R_RECV,
)
from etstore.sim.config import SimConfig


class _Ops(Protocol):
    """What :func:`op_slots` reads of the built ops (:class:`etstore.sim._build.Built`)."""

    @property
    def ranks(self) -> np.ndarray: ...
    @property
    def n0(self) -> int: ...
    @property
    def is_step(self) -> np.ndarray: ...
    @property
    def is_coll(self) -> np.ndarray: ...
    @property
    def join_of(self) -> np.ndarray: ...
    @property
    def hold_acq(self) -> np.ndarray: ...
    @property
    def hold_rel(self) -> np.ndarray: ...


__all__ = ["blocks_hold_slot", "op_slots"]


def blocks_hold_slot(config: SimConfig) -> bool:
    """Whether an expanded collective's block holds the comm slot as its node did (``"collective"``).

    Under ``"astra"`` each send of the block takes the slot itself, so a hold around
    the block would keep its own sends waiting forever.

    >>> blocks_hold_slot(SimConfig(expanded_slots="astra")), blocks_hold_slot(SimConfig())
    (False, True)
    """
    return config.expanded_slots == "collective"


def op_slots(
    built: _Ops, kind: np.ndarray, rank: np.ndarray, config: SimConfig
) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """(acq, rel, free): slot id ``rank_index * NRES + class`` each op takes and gives back.

    A collective takes its rank's communication slot when it starts and its join
    gives it back; a class without a cap takes no slot. An expanded collective's
    step takes none under ``"collective"`` (as the same step inside a collective
    node takes none) and its class's slot under ``"astra"``.
    """
    n = len(kind)
    ranks = built.ranks
    rix = np.searchsorted(ranks, rank)
    cls = np.full(n, -1, dtype=np.int64)
    caps = {
        R_COMP: config.max_comp_ops,
        R_CPU: config.max_cpu_ops,
        R_COMM: config.max_comm_ops,
        R_RECV: config.max_recv_ops,
        R_MEM: config.max_mem_ops,
    }
    n0 = built.n0
    top = np.arange(n) < n0
    cls[(kind == K_COMP)] = R_COMP
    cls[(kind == K_CPU)] = R_CPU
    cls[(kind == K_MEM)] = R_MEM
    cls[top & ((kind == K_SEND) | (kind == K_COLL))] = R_COMM
    cls[top & (kind == K_RECV)] = R_RECV
    if blocks_hold_slot(config):
        steps = np.zeros(n, dtype=bool)
        steps[:n0] = built.is_step
        cls[steps] = -1  # an expanded collective's steps run as inside the collective node: no slot
    replay_coll = np.zeros(n, dtype=bool)
    replay_coll[:n0] = built.is_coll & (kind[:n0] == K_DELAY)
    cls[replay_coll] = R_COMM
    for c, cap in caps.items():
        if cap is None:
            cls[cls == c] = -1
    slot = np.where(cls >= 0, rix * NRES + cls, -1)
    acq = slot.copy()
    rel = slot.copy()
    coll_rows = np.flatnonzero((kind == K_COLL) & top)
    rel[coll_rows] = -1
    rel[built.join_of[coll_rows]] = slot[coll_rows]
    # an expanded collective's block: its acquire op takes the comm slot, its release op gives it back
    if len(built.hold_acq) and caps[R_COMM] is not None:
        comm_slot = rix[built.hold_acq] * NRES + R_COMM
        acq[built.hold_acq], rel[built.hold_acq] = comm_slot, -1
        acq[built.hold_rel], rel[built.hold_rel] = -1, comm_slot
    free = [0.0] * (len(ranks) * NRES)
    for r in range(len(ranks)):
        for c, cap in caps.items():
            free[r * NRES + c] = float(cap) if cap is not None else 0.0
    return acq, rel, free
