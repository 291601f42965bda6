"""What the event loops share: the op order, the message model, the links, one error, a watcher.

:func:`locality_order` renumbers ops so that ops likely to run together are adjacent
in memory; :func:`message_model` gives each send its congestion-unaware network time
or the routes the congestion-aware loop walks; :func:`loop_links` the links it walks.
:class:`NoProgress` is how either loop stops rather than spin on a time that is not a
number, and :func:`item_op` names the op behind the loop item it reports.
:func:`run_watched` reports the native loop's progress while it runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from etstore.sim._build import LoopInputs
from etstore.sim._defer import Deferred
from etstore.sim._kinds import K_SEND, LINK_ITEM
from etstore.sim.config import SimConfig
from etstore.sim.network import Network

__all__ = ["NoProgress", "item_op", "locality_order", "loop_links", "message_model", "run_watched"]


class NoProgress(Exception):
    """The loop met an event time that is not a number; ``item`` is the loop's item, ``op`` its op
    in op order (-1 when it is not one) once :func:`run_loop` has mapped it back."""

    def __init__(self, item: int, t: float, op: int = -1) -> None:
        super().__init__(f"the next event's time is {t}")
        self.item, self.t, self.op = item, t, op


def loop_links(net: Network, aware: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(destination node, latency ns, bytes/ns) per link the loop walks (aware: the hop graph)."""
    if aware:
        graph = net.hop_graph()
        return graph.dst, graph.latency_ns, graph.bytes_per_ns
    return net.dst, net.latency_ns, net.bytes_per_ns


def locality_order(rank: np.ndarray, owner: np.ndarray, n0: int) -> np.ndarray:
    """Op order for the loop: by position within its rank (sub-ops at their collective's), then rank."""
    n = len(rank)
    top_rank = rank[:n0]
    order = np.argsort(top_rank, kind="stable")
    first = np.zeros(n0, dtype=np.int64)
    if n0:
        r_sorted = top_rank[order]
        starts = np.flatnonzero(np.r_[True, r_sorted[1:] != r_sorted[:-1]])
        group_start = np.repeat(starts, np.diff(np.r_[starts, n0]))
        first[order] = np.arange(n0) - group_start
    within = np.empty(n, dtype=np.int64)
    within[:n0] = first
    if n > n0:
        within[n0:] = first[owner[n0:]]
    return np.lexsort((np.arange(n), rank, within))


def message_model(
    inp: LoopInputs, net: Network, config: SimConfig, aware: bool, native: bool, deferred: Deferred | None
) -> tuple[np.ndarray, list[list[int] | None]]:
    """(mt, hop): per-send network time (congestion-unaware), or the routes the aware loop walks.

    The native loop reads the aware graph's next-link array (rows built by
    ``net.prepare_hops``); the Python loop takes them as lists (``hop[dst][node]``).
    """
    sends = np.flatnonzero(inp.kind == K_SEND)
    mt = np.zeros(len(inp.kind))
    hop: list[list[int] | None] = []
    if aware and deferred is not None:  # the routes the deferred sub-ops' messages take too
        net.prepare_hops(deferred.destinations(config))
    if len(sends):
        mdst = inp.mdst[sends]
        if aware and native:
            net.prepare_hops(mdst)
        elif aware:
            hop = net.hop_table(mdst)
        else:
            mt[sends] = net.message_times_ns(
                inp.msrc[sends],
                mdst,
                inp.size[sends],
                integer_ns=config.integer_ns,
                overhead_ns=config.message_overhead_ns,
            )
    return mt, hop


def item_op(item: int, perm: np.ndarray) -> int:
    """The op (in op order) behind a loop item over the renumbered ops ``perm``, or -1 for none.

    >>> item_op(~1, np.array([5, 7, 9])), item_op(2, np.array([5, 7, 9])), item_op(~(1 << 62), np.array([5]))
    (7, 9, -1)
    """
    j = item if item >= 0 else ~item
    return int(perm[j]) if 0 <= j < len(perm) and j < LINK_ITEM else -1


def run_watched(
    run: Callable[..., Any], args: tuple[Any, ...], end: np.ndarray, progress: Callable[[int, int], None]
) -> Any:
    """``run(*args)`` (the C loop) on a helper thread (the C loop releases the GIL) while this
    thread reports how many ops have an end time, about every 0.1 s and never more than
    ~2 % of one core (a count over ``end`` costs O(ops)); callbacks stay on the caller's thread.
    A daemon thread, so that Ctrl-C ends the process without waiting for the loop."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["out"] = run(*args)
        except BaseException as exc:  # re-raised on the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=work, name="etstore-simloop", daemon=True)
    total = len(end)
    progress(0, total)
    worker.start()
    wait_s = 0.1
    while True:
        worker.join(wait_s)
        if not worker.is_alive():
            break
        t0 = time.perf_counter()
        done = int(np.count_nonzero(end >= 0))
        wait_s = max(0.1, 50 * (time.perf_counter() - t0))
        progress(done, total)
    if "error" in box:
        raise box["error"]
    progress(int(np.count_nonzero(end >= 0)), total)
    return box["out"]
