"""The event loop: the Python reference :func:`_run`, its list adapter, and the C adapter.

:func:`run_loop` prepares the message model (per-send times, or routes for the
congestion-aware one), renumbers ops for memory locality, runs the native loop
(``_simloop``, built from ``_simloop.c`` by setup.py) when it is available, else
:func:`_run` on Python lists, and maps the output back to op order. Both loops
take the same inputs and give bit-identical outputs (``tests/sim/test_simloop.py``).
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from etstore.sim._build import LoopInputs
from etstore.sim._defer import Deferred, PairTotals
from etstore.sim._kinds import K_RECV, K_SEND, LINK_ITEM
from etstore.sim._loopprep import NoProgress, item_op, locality_order, loop_links, message_model, run_watched
from etstore.sim.config import SimConfig
from etstore.sim.network import Network

try:  # the optional native loop (setup.py); _run below stays the reference and the fallback
    from etstore.sim import _simloop  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the build
    _simloop = None

__all__ = ["LoopOutput", "LoopProgress", "NoProgress", "locality_order", "native_loop", "run_loop"]

LoopProgress = Callable[[int, int], None]
"""``progress(done, total)``: ops finished of the ops the loop replays."""


@dataclass(frozen=True, eq=False)
class LoopOutput:
    """The loop's output in op order; times in ns, -1 for ops that never started or ended."""

    start: np.ndarray  # start time of ops that waited for an NPU slot, else -1
    end: np.ndarray
    indeg: np.ndarray  # dependencies left unfinished (> 0 only on a stuck replay)
    events: int
    t: float  # time of the last event
    send_q: dict[int, list[int]]  # on a stuck replay: unmatched sends / posted receives by match key
    recv_q: dict[int, list[int]]
    waitq: list[list[int]]  # on a stuck replay: ops still waiting for a slot
    lbusy: np.ndarray  # congestion-aware only: per link busy ns, bytes and messages
    lbytes: np.ndarray
    lmsgs: np.ndarray
    loop_s: float  # CPU seconds of the loop
    pairs: PairTotals | None = None  # deferred collectives: their messages per NPU pair
    sub_ops: int = 0  # deferred collectives: sub-ops made, and most alive at once
    peak_sub_ops: int = 0


def native_loop() -> bool:
    """Whether the C loop is built (and so collectives can be expanded as they start)."""
    return _simloop is not None


def _run(
    kind: list[int],
    dur: list[float],
    succs: list[list[int]],
    indeg: list[int],
    acq: list[int],
    rel: list[int],
    free: list[float],
    mkey: list[int],
    mt: list[float],
    aware: bool,
    cur: list[int],
    dstn: list[int],
    size: list[float],
    hop: list[list[int] | None],
    ldst: list[int],
    llat: list[float],
    lbw: list[float],
    integer_ns: bool,
    overhead: float,
    prio: list[int],
    n: int,
    cut_through: bool = False,
) -> dict[str, Any]:
    """The event loop: a calendar of distinct times (a heap of floats) with a bucket of items each.

    An item ``x >= 0`` finishes op ``x``; ``x < 0`` moves the message of send ``~x``
    (one hop, or its arrival). Items of one time run in the order they were
    scheduled. An op that needs an NPU slot joins its slot's ready queue; after each
    item (and after the roots) every touched slot is given to its ready ops in
    ascending ``(prio, op)`` order while places are free — ASTRA-sim's workload layer
    issues the dependency-free nodes of a rank in ascending node id each time a node
    finishes. Ready and start times are not recorded here (they follow from the end
    times, see :func:`simulate`), except for ops that took a slot.

    A congestion-aware hop (``hop[dst][node]`` a link of ``ldst``/``llat``/``lbw``) is
    store-and-forward, as ASTRA-sim's congestion-aware ``Link``: a link serializes one
    message at a time for ``size / bandwidth`` and the message is at the next node
    ``latency + size / bandwidth`` after the hop started (truncated as one delay); a
    message that reaches a busy link waits in the link's FIFO, and the link takes the
    next one when an item ``~(LINK_ITEM + link)`` says it is free. A send's first hop
    is taken as it starts (ASTRA-sim's ``sim_send`` hands the message to its first link
    at once) unless ``overhead`` delays it. The order these items are scheduled in is
    ASTRA-sim's, so messages that meet at a link queue in ASTRA-sim's order. With
    ``cut_through`` the next hop may start ``latency`` after this one did, but no link
    finishes before the message's tail has reached it (``tail``), and the destination
    receives the tail.

    A time that is not a number would stop the clock: the loop raises
    :class:`NoProgress` naming the item instead of running on.
    """
    end_t = [-1.0] * n
    start_t = [-1.0] * n  # only for ops that took an NPU slot
    partner = [-1] * n
    arrived = [False] * n
    nres = len(free)
    waitq: list[list[tuple[int, int]]] = [[] for _ in range(nres)]
    touched = [False] * nres
    dirty: list[int] = []
    send_q: dict[int, deque[int]] = {}
    recv_q: dict[int, deque[int]] = {}
    nl = len(ldst)
    lfree = [0.0] * nl
    sending = [False] * nl  # store-and-forward: the link is serializing a message
    pending: list[deque[int]] = [deque() for _ in range(nl)] if aware and not cut_through else []
    lbusy = [0.0] * nl
    lbytes = [0.0] * nl
    lmsgs = [0] * nl
    tail = [0.0] * n  # cut-through: when the message's last byte reaches its current node
    cal: list[float] = []
    buckets: dict[float, list[int]] = {}
    push = heapq.heappush
    pop = heapq.heappop
    floor = int
    t = 0.0
    nev = 0
    store_forward = aware and not cut_through

    def at(t2: float, x: int) -> None:
        b = buckets.get(t2)
        if b is None:
            buckets[t2] = [x]
            push(cal, t2)
        else:
            b.append(x)

    def transmit(link: int, s: int) -> None:
        """Link ``link`` starts serializing message ``s`` now."""
        sending[link] = True
        sz = size[s]
        raw = sz / lbw[link]
        fin = t + (floor(raw) if integer_ns else raw)
        lbusy[link] += fin - t
        lbytes[link] += sz
        lmsgs[link] += 1
        cur[s] = ldst[link]
        at(t + (floor(llat[link] + raw) if integer_ns else llat[link] + raw), ~s)
        at(fin, ~(LINK_ITEM + link))

    def forward(s: int) -> None:
        """Message ``s`` is at a node short of its destination: onto its next link, or into its FIFO."""
        link = hop[dstn[s]][cur[s]]  # type: ignore[index]
        if sending[link]:
            pending[link].append(s)
        else:
            transmit(link, s)

    def begin(j: int) -> None:
        """Op ``j`` starts at ``t``: match its message, schedule its end (or its message's first move)."""
        k = kind[j]
        if k == K_SEND:
            mk = mkey[j]
            q = recv_q.get(mk)
            if q:
                partner[j] = q.popleft()
            else:
                q = send_q.get(mk)
                if q is None:
                    send_q[mk] = deque((j,))
                else:
                    q.append(j)
            if store_forward and not overhead and cur[j] != dstn[j]:
                forward(j)
                return
            t2 = t + (overhead if aware else mt[j])
            x = ~j
        elif k == K_RECV:
            mk = mkey[j]
            q = send_q.get(mk)
            if q:
                s = q.popleft()
                if not arrived[s]:
                    partner[s] = j
                    return
                t2, x = t, j
            else:
                q = recv_q.get(mk)
                if q is None:
                    recv_q[mk] = deque((j,))
                else:
                    q.append(j)
                return
        else:
            t2, x = t + dur[j], j
        at(t2, x)

    def ready(j: int) -> None:
        """Op ``j``'s dependencies are done: start it, or queue it for its slot."""
        c = acq[j]
        if c < 0:
            begin(j)
            return
        push(waitq[c], (prio[j], j))
        if not touched[c]:
            touched[c] = True
            dirty.append(c)

    def dispatch() -> None:
        """Give every touched slot's free places to its ready ops, lowest (prio, op) first."""
        for c in dirty:
            touched[c] = False
            w = waitq[c]
            while w and free[c] > 0:
                free[c] -= 1
                j = pop(w)[1]
                start_t[j] = t
                begin(j)
        dirty.clear()

    for i in range(n):
        if indeg[i] == 0:
            ready(i)
    dispatch()
    while cal:
        t = pop(cal)
        items = buckets.pop(t)
        if t != t:  # a NaN time never compares equal: no later event could be ordered after it
            raise NoProgress(items[0], t)
        freed = 0
        for x in items:
            if x < 0:
                s = ~x
                if s >= LINK_ITEM:  # a link has serialized its message: it takes the next one
                    link = s - LINK_ITEM
                    sending[link] = False
                    if pending[link]:
                        transmit(link, pending[link].popleft())
                    freed += 1
                    continue
                if aware:
                    u = cur[s]
                    d = dstn[s]
                    if u != d and store_forward:
                        forward(s)
                        continue
                    if u != d:
                        link = hop[d][u]  # type: ignore[index]
                        st = lfree[link]
                        if st < t:
                            st = t
                        sz = size[s]
                        raw = sz / lbw[link]
                        ser = floor(raw) if integer_ns else raw
                        fin = st + ser
                        nxt = ldst[link]
                        if fin < tail[s]:
                            fin = tail[s]
                        lat = floor(llat[link]) if integer_ns else llat[link]
                        tail[s] = fin + lat
                        t2 = tail[s] if nxt == d else st + lat
                        lfree[link] = fin
                        lbusy[link] += fin - st
                        lbytes[link] += sz
                        lmsgs[link] += 1
                        cur[s] = nxt
                        at(t2, x)
                        continue
                arrived[s] = True
                r = partner[s]
                if r >= 0:
                    items.append(r)  # the matched receive finishes now too (same instant)
                y = s
            else:
                y = x
            end_t[y] = t
            c = rel[y]
            if c >= 0:
                free[c] += 1
                if waitq[c] and not touched[c]:
                    touched[c] = True
                    dirty.append(c)
            for j in succs[y]:
                d = indeg[j] - 1
                indeg[j] = d
                if not d:
                    ready(j)
            if dirty:
                dispatch()
        nev += len(items) - freed
    return {
        "start": start_t,
        "end": end_t,
        "events": nev,
        "t": t,
        "indeg": indeg,
        "send_q": send_q,
        "recv_q": recv_q,
        "waitq": [[j for _, j in sorted(w)] for w in waitq],
        "lbusy": lbusy,
        "lbytes": lbytes,
        "lmsgs": lmsgs,
    }


def _run_lists(
    perm: np.ndarray,
    inv: np.ndarray,
    succ: np.ndarray,
    ptr: np.ndarray,
    cols: dict[str, np.ndarray],
    free: list[float],
    aware: bool,
    hop: list[list[int] | None],
    net: Network,
    config: SimConfig,
    progress: LoopProgress | None = None,
) -> tuple[dict[str, Any], float]:
    """:func:`_run` on renumbered Python lists; (its output, CPU seconds of list conversion + loop)."""
    ldst, llat, lbw = loop_links(net, aware)
    n = len(perm)
    succ_new = inv[succ].tolist()
    ptr_new = ptr[perm]
    cnt_new = (ptr[perm + 1] - ptr_new).tolist()
    ptr_new = ptr_new.tolist()
    succs = [succ_new[p : p + c] for p, c in zip(ptr_new, cnt_new, strict=True)]
    t_loop = time.process_time()
    col = {k: v[perm] for k, v in cols.items()}
    out = _run(
        col["kind"].tolist(),
        col["dur"].astype(np.float64).tolist(),
        succs,
        col["indeg"].tolist(),
        col["acq"].tolist(),
        col["rel"].tolist(),
        free,
        col["mkey"].tolist(),
        col["mt"].tolist(),
        aware,
        col["cur"].tolist(),
        col["dstn"].tolist(),
        col["size"].astype(np.float64).tolist(),
        hop,
        ldst.tolist(),
        llat.tolist(),
        lbw.tolist(),
        config.integer_ns,
        float(config.message_overhead_ns),
        col["prio"].tolist(),
        n,
        cut_through=net.hops == "cut-through",
    )
    return out, time.process_time() - t_loop


def _run_native(
    perm: np.ndarray,
    inv: np.ndarray,
    succ: np.ndarray,
    ptr: np.ndarray,
    cols: dict[str, np.ndarray],
    free: list[float],
    aware: bool,
    hop: list[list[int] | None],
    net: Network,
    config: SimConfig,
    progress: LoopProgress | None = None,
    deferred: tuple[object, ...] | None = None,
) -> tuple[dict[str, Any], float]:
    """The C loop (``_simloop.run``) on the same renumbered inputs as :func:`_run_lists`, same output.

    ``deferred`` (:meth:`Deferred.spec`) hands it the collectives to expand as they start.

    Successors stay CSR (each op's list in its original order, which fixes the order
    ready ops are scheduled in); the routing table is the network's ``[dst, src]`` array.
    """
    n = len(perm)
    starts = ptr[perm]
    cnt = ptr[perm + 1] - starts
    sptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(cnt, out=sptr[1:])
    gather = np.arange(int(sptr[-1]), dtype=np.int64) - np.repeat(sptr[:-1] - starts, cnt)
    succ_new = np.ascontiguousarray(inv[succ[gather]], dtype=np.int64)
    ldst, llat, lbw = loop_links(net, aware)
    nl = len(ldst)
    # the aware graph's [dst, node] next-link array (rows built by net.prepare_hops) instead of ``hop``
    nh = np.zeros(0, np.int32)
    if aware:
        nh = np.ascontiguousarray(net.hop_graph().next_link, dtype=np.int32).ravel()
    t_loop = time.process_time()

    def i64(name: str) -> np.ndarray:
        return np.ascontiguousarray(cols[name][perm], dtype=np.int64)

    def f64(name: str) -> np.ndarray:
        return np.ascontiguousarray(cols[name][perm], dtype=np.float64)

    indeg_new = i64("indeg")
    start = np.full(n, -1.0)
    end = np.full(n, -1.0)
    lbusy = np.zeros(nl)
    lbytes = np.zeros(nl)
    lmsgs = np.zeros(nl, dtype=np.int64)
    args = (
        i64("kind"),
        f64("dur"),
        sptr,
        succ_new,
        indeg_new,
        i64("acq"),
        i64("rel"),
        np.array(free, dtype=np.float64),
        i64("mkey"),
        f64("mt"),
        i64("cur"),
        i64("dstn"),
        f64("size"),
        nh,
        np.ascontiguousarray(ldst, dtype=np.int64),
        np.ascontiguousarray(llat, dtype=np.float64),
        np.ascontiguousarray(lbw, dtype=np.float64),
        start,
        end,
        np.zeros(nl),
        lbusy,
        lbytes,
        lmsgs,
        aware,
        bool(config.integer_ns),
        float(config.message_overhead_ns),
        i64("prio"),
        net.hops == "cut-through",
        deferred,
    )
    try:
        ret = _simloop.run(*args) if progress is None else run_watched(_simloop.run, args, end, progress)
    except ValueError as exc:  # the C loop's guard: (message, item) when a time is not a number
        if len(exc.args) == 2 and isinstance(exc.args[1], int):
            raise NoProgress(exc.args[1], float("nan")) from None
        raise
    events, t, send_q, recv_q, waitq = ret[:5]
    loop_s = time.process_time() - t_loop
    out = {
        "start": start,
        "end": end,
        "events": events,
        "t": t,
        "indeg": indeg_new,
        "send_q": send_q,
        "recv_q": recv_q,
        "waitq": waitq,
        "lbusy": lbusy,
        "lbytes": lbytes,
        "lmsgs": lmsgs,
    }
    if deferred is not None:
        out["sub_ops"], out["peak_sub_ops"], out["pairs"] = ret[5]
    return out, loop_s


def run_loop(
    inp: LoopInputs,
    net: Network,
    config: SimConfig,
    n0: int,
    progress: LoopProgress | None = None,
    deferred: Deferred | None = None,
) -> LoopOutput:
    """Replay the ops of ``inp`` (the first ``n0`` are the trace's) and return when each ended.

    ``deferred`` collectives (native loop only) are expanded by the loop as they start;
    their messages come back summed per NPU pair (:attr:`LoopOutput.pairs`).

    ``progress(done, total)``, when given, is called on the caller's thread with the ops
    finished so far, about every 0.1 s (native loop; the Python loop reports its end only).

    Raises :class:`NoProgress` (``op`` in op order) where an event's time is not a number.

    Notes
    -----
    O(events · log T) for T distinct event times; events ≈ ops + messages (+ link
    hops when congestion-aware).
    """
    aware = config.congestion == "aware"
    native = _simloop is not None
    if deferred is not None and not native:
        raise RuntimeError("collectives expanded as they start need the native loop")
    mt, hop = message_model(inp, net, config, aware, native, deferred)
    n = len(inp.kind)
    cur = np.where(inp.kind == K_SEND, inp.rank, 0)
    # Renumber ops so that ops likely to run at about the same time sit next to each other
    # (k-th op of every rank together): the loop touches ~10 lists per op and locality
    # makes it ~2x faster on large traces. Results are mapped back afterwards.
    perm = locality_order(inp.rank, inp.owner, n0)
    inv = np.empty(n, dtype=np.int64)
    inv[perm] = np.arange(n)
    cols = {
        "kind": inp.kind,
        "dur": inp.dur,
        "indeg": inp.indeg,
        "acq": inp.acq,
        "rel": inp.rel,
        "mkey": inp.mkey,
        "mt": mt,
        "cur": cur,
        "dstn": inp.mdst,
        "size": inp.size,
        "prio": inp.prio,
    }
    try:
        if deferred is not None:
            spec = deferred.spec(n, perm, inv, net, config, aware)
            out, loop_s = _run_native(
                perm, inv, inp.succ, inp.ptr, cols, list(inp.free), aware, hop, net, config, progress, spec
            )
        else:
            run = _run_native if native else _run_lists
            args = (perm, inv, inp.succ, inp.ptr, cols, list(inp.free), aware, hop, net, config, progress)
            out, loop_s = run(*args)
    except NoProgress as exc:
        raise NoProgress(exc.item, exc.t, item_op(exc.item, perm)) from None
    pairs = PairTotals.from_loop(out["pairs"], net.num_nodes) if deferred is not None else None
    for key in ("end", "start", "indeg"):
        out[key] = np.asarray(out[key])[inv]
    send_q: dict[int, list[int]] = {}
    recv_q: dict[int, list[int]] = {}
    waitq: list[list[int]] = []
    if (out["end"] < 0).any():  # stuck: what is left in the queues, as ops in op order
        send_q = {k: [int(perm[j]) for j in q] for k, q in out["send_q"].items() if q}
        recv_q = {k: [int(perm[j]) for j in q] for k, q in out["recv_q"].items() if q}
        waitq = [[int(perm[j]) for j in q] for q in out["waitq"] if q]
    lbusy, lbytes, lmsgs = out["lbusy"], out["lbytes"], out["lmsgs"]
    if aware:  # per topology link (the aware graph may add switch ports)
        sends = np.flatnonzero(inp.kind == K_SEND)
        src, dst, nbytes = inp.msrc[sends], inp.mdst[sends], inp.size[sends]
        count = np.ones(len(sends), np.int64)
        if pairs is not None:
            src, dst = np.concatenate([src, pairs.src]), np.concatenate([dst, pairs.dst])
            nbytes, count = np.concatenate([nbytes, pairs.nbytes]), np.concatenate([count, pairs.count])
        lbusy, lbytes, lmsgs = net.link_counters(lbusy, lbytes, lmsgs, src, dst, nbytes, count)
    return LoopOutput(
        start=out["start"],
        end=out["end"],
        indeg=out["indeg"],
        events=int(out["events"]),
        t=out["t"],
        send_q=send_q,
        recv_q=recv_q,
        waitq=waitq,
        lbusy=np.asarray(lbusy, dtype=np.float64),
        lbytes=np.asarray(lbytes, dtype=np.float64),
        lmsgs=np.asarray(lmsgs, dtype=np.int64),
        loop_s=loop_s,
        pairs=pairs,
        sub_ops=int(out.get("sub_ops", 0)),
        peak_sub_ops=int(out.get("peak_sub_ops", 0)),
    )
