"""The MSCCL-IR step vocabulary and :class:`StepTable`, the columnar form of an algorithm's steps.

A step type names the Chakra nodes it becomes (:data:`STEP_NODES`), in chain order;
buffers are numbered as :data:`BUFFERS` lists them. The tables derived here are
read by the trace build (:mod:`etstore.ir.build`), its validation and the node
semantics (:mod:`etstore.ir.semantics`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from etstore.collective import ALGORITHM_COLLECTIVES

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
    "StepTable",
]

STEP_TYPES: tuple[str, ...] = ("s", "r", "rcs", "rrs", "rrc", "rrcs", "cpy", "re", "nop", "d", "st")
TYPE_CODE: dict[str, int] = {t: i for i, t in enumerate(STEP_TYPES)}
SEND, RECV, REDUCE, COPY = 0, 1, 2, 3
KIND_NAMES: tuple[str, ...] = ("send", "recv", "reduce", "copy")
KIND_NODE_TYPE: tuple[str, ...] = ("COMM_SEND_NODE", "COMM_RECV_NODE", "COMP_NODE", "COMP_NODE")
STEP_NODES: dict[str, tuple[int, ...]] = {
    "s": (SEND,),
    "r": (RECV,),
    "rcs": (RECV, SEND),
    "rrs": (RECV, REDUCE, SEND),
    "rrc": (RECV, REDUCE),
    "rrcs": (RECV, REDUCE, SEND),
    "cpy": (COPY,),
    "re": (REDUCE,),
    "nop": (),
    "d": (),
    "st": (),
}
SEQ_TO_TYPE: dict[tuple[int, ...], str] = {v: k for k, v in STEP_NODES.items() if v}
BUFFERS: tuple[str, ...] = ("i", "o", "s")
BUF_CODE: dict[str, int] = {b: i for i, b in enumerate(BUFFERS)}
COLLECTIVES = ALGORITHM_COLLECTIVES

# per step type code: how many nodes it makes, and the kind of each (-1 past the end)
NCOUNT = np.array([len(STEP_NODES[t]) for t in STEP_TYPES], dtype=np.int64)
KIND_TABLE = np.full((len(STEP_TYPES), 3), -1, dtype=np.int8)
for _t, _seq in STEP_NODES.items():
    KIND_TABLE[TYPE_CODE[_t], : len(_seq)] = _seq
SENDS = np.array([SEND in STEP_NODES[t] for t in STEP_TYPES])
RECVS = np.array([RECV in STEP_NODES[t] for t in STEP_TYPES])
# which buffers a step type touches on its own GPU (the others name the peer's buffer)
LOCAL_SRC = np.array([t in ("s", "rrs", "rrc", "rrcs", "cpy", "re") for t in STEP_TYPES])
LOCAL_DST = np.array([t in ("r", "rcs", "rrc", "rrcs", "cpy", "re") for t in STEP_TYPES])

Locate = Callable[[str, int], str]
"""``locate(kind, index) -> "file:line"`` for error messages; kind is ``gpu``, ``tb`` or ``step``."""


@dataclass(frozen=True)
class StepTable:
    """MSCCL-IR steps in columns, ordered by rank, then threadblock, then program order.

    Step columns (one row per step): ``rank``, ``tb``, ``s`` (the step's index in its
    threadblock), ``type`` (index into :data:`STEP_TYPES`), ``srcbuf``/``dstbuf``
    (index into :data:`BUFFERS`), ``srcoff``/``dstoff``/``cnt`` (chunks),
    ``depid``/``deps`` (threadblock and step this one waits for, -1 for none).
    Threadblock columns: ``tb_rank``, ``tb_id``, ``tb_send``, ``tb_recv``, ``tb_chan``.
    GPU columns: ``gpu_rank``, ``i_chunks``, ``o_chunks``, ``s_chunks``.
    """

    rank: np.ndarray
    tb: np.ndarray
    s: np.ndarray
    type: np.ndarray
    srcbuf: np.ndarray
    srcoff: np.ndarray
    dstbuf: np.ndarray
    dstoff: np.ndarray
    cnt: np.ndarray
    depid: np.ndarray
    deps: np.ndarray
    tb_rank: np.ndarray
    tb_id: np.ndarray
    tb_send: np.ndarray
    tb_recv: np.ndarray
    tb_chan: np.ndarray
    gpu_rank: np.ndarray
    i_chunks: np.ndarray
    o_chunks: np.ndarray
    s_chunks: np.ndarray

    @property
    def num_steps(self) -> int:
        """Number of steps (rows of the step columns)."""
        return len(self.rank)

    @classmethod
    def from_lists(cls, **cols: Sequence[int]) -> StepTable:
        """Build from plain sequences (generators, tests); dtypes are normalised."""
        return cls(**{k: np.asarray(cols[k], dtype=np.int64) for k in cls.__dataclass_fields__})
