"""Event-driven replay of a :class:`~etstore.model.Trace` over a network, ASTRA-sim style.

Issue semantics (FORMATS.md §1, ASTRA-sim's workload layer):

* an op is *ready* when every dependency (data and ctrl) has finished;
* per NPU at most ``max_comp_ops`` compute, ``max_cpu_ops`` CPU, ``max_comm_ops``
  communication (sends and collectives) and ``max_mem_ops`` memory ops run at once,
  receives are unlimited unless ``max_recv_ops`` says otherwise; whenever an op
  ends, the ready ops of its rank take free slots in ascending node id (ASTRA-sim's
  workload issue loop), whatever the scheduling policy;
* ``COMP_NODE`` lasts ``duration_micros · 1000`` ns (1 ns when 0);
* a send completes when its message arrives; a receive completes when its matching
  message has arrived and the receive was posted; sends and receives match on
  (src, dst, tag) (plus size with ``match_on_size``), the n-th send to the n-th
  receive;
* a ``COMM_COLL_NODE`` holds the communication slot while its algorithm runs: the
  node expands, on its rank, into that rank's part of the algorithm chosen for its
  collective type (ASTRA-sim's native ring, a generator, or a stored algorithm); the
  k-th collective of a communicator group on every member rank is one instance;
* one cost model on every path: a reduction or copy inside an algorithm costs its
  local-memory passes whether the algorithm runs inside a node or after ``expand``
  (docs/simulator.md, "Cost model"); the steps ``expand`` wrote take NPU slots as
  ``config.expanded_slots`` says (:mod:`~etstore.sim._slots`): none, as inside the node
  (``"collective"``), or each its own, as ASTRA-sim runs the exported files (``"astra"``);
* under the congestion-unaware model, links offered more than their bandwidth are
  listed in ``SimResult.overloaded``.

The trace is converted once into integer-indexed arrays (CSR successors, per-op
kind, duration, size, peer, match key) and replayed by one heap-based loop over
``(time_ns, op)`` tuples; there is no Python object per op. The phases live in
their own modules: :mod:`~etstore.sim._algorithms` (which algorithm each collective
instance runs), :mod:`~etstore.sim._build` (the arrays), :mod:`~etstore.sim._holds`
(an expanded collective's block holds the communication slot as its node did),
:mod:`~etstore.sim._slots` (which slot each op takes), :mod:`~etstore.sim._loop`
(the loop, Python and native) with :mod:`~etstore.sim._loopprep` (what it takes
prepared), :mod:`~etstore.sim._defer` (with the native loop, a
collective's steps are made as they become due, so memory follows the steps in flight),
:mod:`~etstore.sim._tables` (the result tables) and :mod:`~etstore.sim._stuck` (why a
replay stopped).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from etstore.errors import TemplateError
from etstore.gcpause import gc_paused
from etstore.model import Trace
from etstore.progress import ProgressFn
from etstore.sim._algorithms import Algorithms, AlgorithmSpec
from etstore.sim._build import build, loop_inputs
from etstore.sim._loop import NoProgress, native_loop, run_loop
from etstore.sim._stuck import no_progress_error, stuck_error
from etstore.sim._tables import result_tables
from etstore.sim.config import SimConfig
from etstore.sim.network import Network
from etstore.sim.result import SimResult, not_stuck
from etstore.topology import Topology

__all__ = ["simulate"]

log = logging.getLogger(__name__)

RECORDED = "recorded"
"""``trace.params["execution"]`` of a trace recorded as it ran (PyTorch ET + Kineto): each op's
host thread or GPU stream is in its dependencies, so no per-NPU slot caps apply."""

DEFER_COLLECTIVES = True
"""With the native loop, leave template-run collectives for the loop to expand as they
start (:mod:`._defer`); False expands them all up front (the reference the tests compare)."""


def simulate(
    trace: Trace,
    topo: Topology,
    *,
    config: SimConfig | None = None,
    algorithms: Mapping[str, AlgorithmSpec] | None = None,
    groups: Mapping[str, Sequence[int]] | None = None,
    dims: Sequence[int] | None = None,
    progress: ProgressFn | None = None,
) -> SimResult:
    """Replay ``trace`` on ``topo`` and measure it.

    Parameters
    ----------
    trace
        A workload (or an algorithm, or an expanded trace); rank ``r`` runs on NPU ``r``.
    topo
        The network; bandwidth GB/s with GB = 2^30, latency ns.
    config
        Issue, network and collective parameters (:class:`SimConfig`; default:
        ASTRA-sim's regression-case system config, congestion-unaware).
    algorithms
        Per collective type (``"ALL_REDUCE"``, ``"allgather"``, ...), the algorithm a
        ``COMM_COLL_NODE`` runs: ``"native"`` (ASTRA-sim's ring), a generator name
        (``"ring"``, ``"direct"``, ...), ``"replay"`` (the node's own duration) or an
        algorithm :class:`Trace` with as many ranks as the group. Defaults come from
        ``config.*_impl``; collectives with no default replay their duration.
    groups
        Communicator groups by ``pg_name`` (ASTRA-sim's comm-group JSON); ``""`` and
        ``"0"`` mean every rank. When given, they replace the trace's own
        ``params["comm_groups"]`` and every other name must be in them; when not,
        the trace's groups are used, and a name in neither means the ranks whose
        collectives carry it.
    dims
        Network dimensions for dimension-order routing and native collectives;
        default from the topology.
    progress
        Called as ``progress(phase, done, total)`` on the caller's thread: ``build``
        (trace ops, 0 then all), ``loop`` (ops finished of the ops replayed, about every
        0.1 s with the native loop), ``tables`` (0 then 1 of 1).

    Returns
    -------
    SimResult
        Op timings, rank breakdown, collectives, link utilization and totals.

    Raises
    ------
    SimulationError
        A receive never gets its message, a dependency cycle, a collective missing on
        some rank of its group, or an op without the fields it needs. Stuck replays
        raise with ``.stuck`` listing the ops that never finished; nothing hangs.
    TopologyError
        The trace has more ranks than the topology has NPUs, or a peer is unreachable.
    ConfigError
        An unknown collective name in ``algorithms``; ``groups`` lacks a group that a
        collective names.

    Notes
    -----
    O(V + E) preparation with numpy over the expanded trace (V ops, E deps), then
    O(events · log V) for the loop; events ≈ ops + messages (+ link hops when
    congestion-aware). Semantics follow ASTRA-sim; see ``docs/simulator.md``.

    Examples
    --------
    >>> from etstore.model import ops_table, Trace
    >>> from etstore.topology import Topology
    >>> ops = ops_table({"rank": [0, 1], "id": [1, 1], "type": ["COMM_SEND_NODE", "COMM_RECV_NODE"],
    ...                  "comm_dst": [1, None], "comm_src": [None, 0], "comm_tag": [0, 0],
    ...                  "comm_size": [1 << 20, 1 << 20]})
    >>> simulate(Trace(ops), Topology.ring(2)).total_ns  # 500 ns + 1 MiB / 50 GiB/s
    20031.0
    """
    # the replay allocates ~one list per op and many small tuples, none in a cycle
    with gc_paused():
        return _simulate(trace, topo, config or SimConfig(), algorithms, groups, dims, progress)


def _simulate(
    trace: Trace,
    topo: Topology,
    config: SimConfig,
    algorithms: Mapping[str, AlgorithmSpec] | None,
    groups: Mapping[str, Sequence[int]] | None,
    dims: Sequence[int] | None,
    progress: ProgressFn | None = None,
) -> SimResult:
    """:func:`simulate` with the garbage collector paused: build, loop, tables."""
    t0 = time.perf_counter()
    if trace.params.get("execution") == RECORDED:
        # a recorded trace's threads and streams are chains of dependencies already; a per-NPU
        # cap would serialise work that ran side by side (host threads, compute and NCCL streams)
        config = config.replace(max_comp_ops=None, max_cpu_ops=None, max_comm_ops=None)
    if progress is not None:
        progress("build", 0, trace.num_ops)
    defer = DEFER_COLLECTIVES and native_loop()
    try:
        net = Network(topo, dims, hops=config.hops)
        algos = Algorithms(config, algorithms, net.dims, topo.num_npus)
        built = build(trace, net, config, algos, groups, defer=defer)
    except TemplateError as exc:
        raise not_stuck(str(exc)) from exc
    inputs = loop_inputs(built, config)
    n = len(inputs.kind)
    looped = None
    if progress is not None:
        progress("build", trace.num_ops, trace.num_ops)
        progress("loop", 0, n)
        looped = lambda done, total: progress("loop", done, total)  # noqa: E731
    try:
        out = run_loop(inputs, net, config, built.n0, looped, built.deferred)
        if (out.end < 0).any():
            if built.deferred is not None:  # diagnose on the full expansion: its queues name every sub-op
                built = build(trace, net, config, algos, groups)
                inputs = loop_inputs(built, config)
                out = run_loop(inputs, net, config, built.n0)
            raise stuck_error(trace, built, inputs, out)
    except NoProgress as exc:  # the clock cannot move: name the op in one line
        raise no_progress_error(trace, built, inputs, exc) from None
    if progress is not None:
        progress("loop", n, n)
        progress("tables", 0, 1)
    tables = result_tables(trace, built, inputs, out, net, aware=config.congestion == "aware")
    if progress is not None:
        progress("tables", 1, 1)
    wall = time.perf_counter() - t0
    log.debug(
        "simulated %s: %d ops (%d made as collectives started, at most %d at once), %d events in %.3f s",
        trace.name,
        len(inputs.kind) + out.sub_ops,
        out.sub_ops,
        out.peak_sub_ops,
        out.events,
        out.loop_s,
    )
    return SimResult(
        ops=tables.ops,
        ranks=tables.ranks,
        collectives=tables.collectives,
        links=tables.links,
        total_ns=tables.total_ns,
        wall_s=wall,
        loop_s=out.loop_s,
        events=out.events,
        sim_ops=len(inputs.kind) + out.sub_ops,
        trace_name=trace.name,
        topology=topo.name,
        num_npus=topo.num_npus,
        config=config,
        algorithms=dict(algos.labels),
        overloaded=tables.overloaded,
    )
