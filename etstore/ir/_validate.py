"""Validation of a :class:`~etstore.ir.steps.StepTable` before it becomes a trace.

Every check is one vectorised pass; the first offending GPU, threadblock or step
is reported as a :class:`~etstore.errors.TraceFormatError` naming it (and its
file position when the reader supplies ``locate``). Dependency cycles are found
on the graph of program order plus ``depid``/``deps`` edges.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from etstore.dag import find_cycle
from etstore.errors import TraceFormatError
from etstore.ir.steps import (
    BUFFERS,
    LOCAL_DST,
    LOCAL_SRC,
    NCOUNT,
    RECVS,
    SENDS,
    STEP_TYPES,
    Locate,
    StepTable,
)

__all__ = ["check_cycles", "fail", "resolve_targets", "validate"]


def fail(origin: str, where: str, what: str) -> TraceFormatError:
    prefix = f"{where}: " if where else (f"{origin}: " if origin else "")
    return TraceFormatError(f"{prefix}{what}")


def _step_label(st: StepTable, i: int) -> str:
    return f"gpu {int(st.rank[i])} tb {int(st.tb[i])} step {int(st.s[i])}"


def validate(st: StepTable, header: Mapping[str, Any], origin: str, locate: Locate) -> np.ndarray:
    """Check GPUs, threadblocks and steps; returns each step's threadblock row.

    Raises
    ------
    TraceFormatError
        The first GPU, threadblock or step that breaks a rule, named with its location.

    Notes
    -----
    O(S log S + T log T) for S steps and T threadblocks.
    """
    ngpus = int(header["ngpus"])
    if ngpus < 1:
        raise fail(origin, "", f"ngpus must be at least 1, got {ngpus}")
    _check_gpus(st, ngpus, origin, locate)
    tkey, torder = _check_threadblocks(st, ngpus, origin, locate)
    if st.num_steps == 0:
        return np.zeros(0, dtype=np.int64)
    tbrow = _threadblock_of_steps(st, tkey, torder, origin)
    _check_step_peers(st, tbrow, origin, locate)
    _check_buffer_bounds(st, ngpus, origin, locate)
    return tbrow


def _check_gpus(st: StepTable, ngpus: int, origin: str, locate: Locate) -> None:
    """GPU ids inside 0..ngpus-1, each once, with non-negative buffer sizes."""
    bad = np.flatnonzero((st.gpu_rank < 0) | (st.gpu_rank >= ngpus))
    if len(bad):
        i = int(bad[0])
        raise fail(
            origin,
            locate("gpu", i),
            f"gpu id {int(st.gpu_rank[i])} is outside 0..{ngpus - 1} (ngpus={ngpus})",
        )
    order = np.argsort(st.gpu_rank, kind="stable")
    dup = np.flatnonzero(np.diff(st.gpu_rank[order]) == 0)
    if len(dup):
        i = int(order[dup[0] + 1])
        raise fail(origin, locate("gpu", i), f"gpu id {int(st.gpu_rank[i])} appears twice")
    for col in ("i_chunks", "o_chunks", "s_chunks"):
        neg = np.flatnonzero(getattr(st, col) < 0)
        if len(neg):
            i = int(neg[0])
            raise fail(origin, locate("gpu", i), f"gpu {int(st.gpu_rank[i])}: {col} must not be negative")


def _check_threadblocks(
    st: StepTable, ngpus: int, origin: str, locate: Locate
) -> tuple[np.ndarray, np.ndarray]:
    """Threadblock ids unique per GPU, peers valid; returns the (gpu, id) keys and their sort order."""
    tkey = (st.tb_rank << 32) | (st.tb_id & 0xFFFFFFFF)
    torder = np.argsort(tkey, kind="stable")
    dup = np.flatnonzero(np.diff(tkey[torder]) == 0)
    if len(dup):
        i = int(torder[dup[0] + 1])
        raise fail(
            origin,
            locate("tb", i),
            f"gpu {int(st.tb_rank[i])}: threadblock id {int(st.tb_id[i])} appears twice",
        )
    neg = np.flatnonzero(st.tb_id < 0)
    if len(neg):
        i = int(neg[0])
        raise fail(origin, locate("tb", i), f"gpu {int(st.tb_rank[i])}: threadblock id must not be negative")
    for col, what in (("tb_send", "send"), ("tb_recv", "recv")):
        peer = getattr(st, col)
        bad = np.flatnonzero((peer < -1) | (peer >= ngpus) | (peer == st.tb_rank))
        if len(bad):
            i = int(bad[0])
            raise fail(
                origin,
                locate("tb", i),
                f"gpu {int(st.tb_rank[i])} tb {int(st.tb_id[i])}: {what} peer {int(peer[i])} must be -1 or "
                f"another gpu in 0..{ngpus - 1}",
            )
    # a threadblock without peers moves nothing over a connection: msccl-tools writes chan="-1"
    # for it (local copies and reductions, e.g. reducing scratch chunks in place)
    local = (st.tb_send < 0) & (st.tb_recv < 0)
    neg = np.flatnonzero((st.tb_chan < 0) & ~(local & (st.tb_chan == -1)))
    if len(neg):
        i = int(neg[0])
        raise fail(
            origin,
            locate("tb", i),
            f"gpu {int(st.tb_rank[i])} tb {int(st.tb_id[i])}: chan={int(st.tb_chan[i])} must not be "
            "negative (only a threadblock without peers, send=-1 recv=-1, may say chan=-1)",
        )
    return tkey, torder


def _threadblock_of_steps(st: StepTable, tkey: np.ndarray, torder: np.ndarray, origin: str) -> np.ndarray:
    """Row of each step's threadblock; every step must name a declared one."""
    skey = (st.rank << 32) | (st.tb & 0xFFFFFFFF)
    if len(tkey) == 0:
        raise fail(origin, "", f"gpu {int(st.rank[0])} tb {int(st.tb[0])}: the threadblock is not declared")
    sorted_t = tkey[torder]
    pos = np.minimum(np.searchsorted(sorted_t, skey), len(sorted_t) - 1)
    tbrow = torder[pos]
    bad = np.flatnonzero(tkey[tbrow] != skey)
    if len(bad):
        i = int(bad[0])
        raise fail(origin, "", f"gpu {int(st.rank[i])} tb {int(st.tb[i])}: the threadblock is not declared")
    typ = st.type
    if ((typ < 0) | (typ >= len(STEP_TYPES))).any():  # pragma: no cover - readers map names first
        raise fail(origin, "", "internal: step type code out of range")
    return tbrow


def _check_step_peers(st: StepTable, tbrow: np.ndarray, origin: str, locate: Locate) -> None:
    """Sends and receives sit in threadblocks with that peer; data steps move at least one chunk."""
    typ = st.type
    bad = np.flatnonzero(SENDS[typ] & (st.tb_send[tbrow] < 0))
    if len(bad):
        i = int(bad[0])
        raise fail(
            origin,
            locate("step", i),
            f"{_step_label(st, i)}: type {STEP_TYPES[typ[i]]!r} sends, but its threadblock has send=-1",
        )
    bad = np.flatnonzero(RECVS[typ] & (st.tb_recv[tbrow] < 0))
    if len(bad):
        i = int(bad[0])
        raise fail(
            origin,
            locate("step", i),
            f"{_step_label(st, i)}: type {STEP_TYPES[typ[i]]!r} receives, but its threadblock has recv=-1",
        )
    data = NCOUNT[typ] > 0
    bad = np.flatnonzero(data & (st.cnt < 1))
    if len(bad):
        i = int(bad[0])
        raise fail(
            origin, locate("step", i), f"{_step_label(st, i)}: cnt must be at least 1, got {int(st.cnt[i])}"
        )


def _check_buffer_bounds(st: StepTable, ngpus: int, origin: str, locate: Locate) -> None:
    """The local side of every step stays inside the buffer sizes its GPU declares."""
    typ = st.type
    grow = np.full(ngpus, -1, dtype=np.int64)
    grow[st.gpu_rank] = np.arange(len(st.gpu_rank))
    sizes = (
        np.stack([st.i_chunks, st.o_chunks, st.s_chunks], axis=1)
        if len(st.gpu_rank)
        else np.zeros((0, 3), np.int64)
    )
    g = grow[st.rank]
    for local, buf, off, side in (
        (LOCAL_SRC, st.srcbuf, st.srcoff, "src"),
        (LOCAL_DST, st.dstbuf, st.dstoff, "dst"),
    ):
        used = local[typ]
        bad = np.flatnonzero(used & ((buf < 0) | (buf > 2)))
        if len(bad):
            i = int(bad[0])
            raise fail(origin, locate("step", i), f"{_step_label(st, i)}: {side}buf must be one of i, o, s")
        limit = np.where(used, sizes[g, np.clip(buf, 0, 2)], 0)
        bad = np.flatnonzero(used & ((off < 0) | (off + st.cnt > limit)))
        if len(bad):
            i = int(bad[0])
            raise fail(
                origin,
                locate("step", i),
                f"{_step_label(st, i)}: {side}buf {BUFFERS[buf[i]]}[{int(off[i])}:"
                f"{int(off[i] + st.cnt[i])}] is outside the {int(limit[i])} chunks gpu {int(st.rank[i])} "
                f"declares for buffer {BUFFERS[buf[i]]!r}",
            )


def _step_index(st: StepTable, origin: str, locate: Locate) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (rank, tb, s) keys and the step row of each; raises on duplicate step indices."""
    key = (st.rank << 42) | ((st.tb & 0x1FFFFF) << 21) | (st.s & 0x1FFFFF)
    order = np.argsort(key, kind="stable")
    sk = key[order]
    dup = np.flatnonzero(np.diff(sk) == 0)
    if len(dup):
        i = int(order[dup[0] + 1])
        raise fail(
            origin, locate("step", i), f"{_step_label(st, i)}: step index {int(st.s[i])} appears twice"
        )
    return sk, order


def resolve_targets(st: StepTable, origin: str, locate: Locate) -> np.ndarray:
    """Row of each step's depid/deps target (-1 when it has none)."""
    if ((st.s < 0) | (st.s >= 1 << 21) | (st.tb >= 1 << 21)).any():
        i = int(np.flatnonzero((st.s < 0) | (st.s >= 1 << 21) | (st.tb >= 1 << 21))[0])
        raise fail(origin, locate("step", i), f"{_step_label(st, i)}: step index out of range")
    sk, order = _step_index(st, origin, locate)
    target = np.full(st.num_steps, -1, dtype=np.int64)
    has = np.flatnonzero(st.depid >= 0)
    if len(has) == 0:
        return target
    tkey = (st.rank[has] << 42) | ((st.depid[has] & 0x1FFFFF) << 21) | (st.deps[has] & 0x1FFFFF)
    pos = np.minimum(np.searchsorted(sk, tkey), len(sk) - 1)
    found = (sk[pos] == tkey) & (st.deps[has] >= 0) & (st.depid[has] < 1 << 21) & (st.deps[has] < 1 << 21)
    if not found.all():
        i = int(has[np.flatnonzero(~found)[0]])
        raise fail(
            origin,
            locate("step", i),
            f"{_step_label(st, i)}: depid={int(st.depid[i])} deps={int(st.deps[i])} points nowhere "
            f"(gpu {int(st.rank[i])} has no step {int(st.deps[i])} in threadblock {int(st.depid[i])})",
        )
    target[has] = order[pos]
    return target


def check_cycles(st: StepTable, target: np.ndarray, origin: str, locate: Locate) -> None:
    """Raise if the cross-threadblock dependencies close a cycle (program order + depid).

    The graph has the steps that wait for or are waited on by another threadblock,
    chained in program order within each threadblock, plus one edge per
    ``depid``/``deps``; :func:`etstore.dag.find_cycle` finds one cycle to name.

    Notes
    -----
    O(S log S) for S steps with cross-threadblock dependencies.
    """
    has = np.flatnonzero(target >= 0)
    if len(has) == 0:
        return
    verts = np.unique(np.concatenate([has, target[has]]))  # rows, document order = (rank, tb, program order)
    rk, tbv = st.rank[verts], st.tb[verts]
    same = np.flatnonzero((rk[1:] == rk[:-1]) & (tbv[1:] == tbv[:-1]))
    src = np.concatenate([same, np.searchsorted(verts, target[has])])
    dst = np.concatenate([same + 1, np.searchsorted(verts, has)])
    cycle = verts[find_cycle(len(verts), src, dst)]
    if len(cycle) == 0:
        return
    text = " → ".join(f"tb {int(st.tb[c])} step {int(st.s[c])}" for c in cycle[:12])
    more = " → ..." if len(cycle) > 12 else ""
    first = int(cycle[0])
    raise fail(
        origin,
        locate("step", first),
        f"dependency cycle on gpu {int(st.rank[first])}: {text}{more} → tb {int(st.tb[first])} step "
        f"{int(st.s[first])} (depid/deps and program order wait on each other)",
    )
