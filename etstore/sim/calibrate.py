"""Calibration: fit a topology's free network parameters to a measured nccl-tests curve.

A measured run (:mod:`etstore.app.measured`) gives, per size S, the time one
collective took on ``ranks`` GPUs. :func:`calibrate` simulates the same collective at
the same sizes on a topology spec with a chosen algorithm and moves the parameters
the spec leaves free — per-axis link latency (``lat=``) and bandwidth (``bw=``), and
the reduction (local memory) bandwidth of :class:`~etstore.sim.config.SimConfig` —
until the simulated times match the measured ones.

The model. For a fixed algorithm and a fixed critical path, a simulated time is
affine in each link latency, in each inverse link bandwidth and in the inverse
reduction bandwidth (every message costs ``Σ latency + size / bandwidth``, every
reduction ``accesses · bytes / local_mem_bw``). The fit works in those coordinates,
as multiples ``u`` of the starting values, and is a Gauss-Newton iteration: one
simulation per size at ``u`` and one per free parameter give the affine model, a
bounded linear least-squares step solves it, and the step repeats until ``u`` stops
moving, typically after two rounds. Where the critical path changes (chunks pipelined
over two axes switch bottleneck) the time has kinks, and a step that overshoots one is
halved until the simulated error drops.

The objective is the relative time error ``(simulated − measured) / measured`` in
least squares. It weighs every size alike, as an error on log time would (the sizes
span ten decades, so absolute errors would fit only the largest ones), and unlike log
time it keeps each step a linear problem in ``u``. A faint pull (relative weight 1e-6) settles
directions the data cannot see: one all-reduce curve cannot tell link bandwidth from
reduction bandwidth (both cost per byte) nor one axis's latency from another's; such
parameters are reported ``not separable`` and keep their starting ratios (they move
by one common factor). A parameter's status is decided where the fit ends, not where
it starts: one whose slope is zero there is probed at a thousand times its cost, and is
``no effect`` (left where it is) only when even that changes no time. Otherwise a
slower path hides it (``not binding``: a 2-node ring:8+ring:2 at equal bandwidths
waits on axis 0 only), and the fit descends again from where it starts to bind,
keeping that result when its error is lower (the link between the nodes of a 2-node
log, the bottleneck of its large sizes, is fitted that way).

The fitted topology is the canonical spec with every value written out (``%g``, six
significant digits) — ``etstore sim``/``etstore sweep --topo`` take it as it is — and
the reduction bandwidth goes beside it. Nothing here reads or writes a store:
:func:`etstore.app.calibrate.calibrate` reads the measured curve of a stored run, fits it
here and stores the result in the warehouse table ``calibrations`` with the per-size
points in ``calibration_points`` (view ``v_measured_vs_sim``; ``docs/measured.md``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from etstore.errors import OptionError
from etstore.model import Trace
from etstore.sim._calibrate_fit import Problem, fit_parameters, parameter_values, times_us, topology_at
from etstore.sim._calibrations import Calibration, FitParameter, MeasuredCurve
from etstore.sim.config import SimConfig
from etstore.topology import DEFAULT_BANDWIDTH_GB_PER_S, DEFAULT_LATENCY_NS, Topology
from etstore.topology.spec import parse_spec

__all__ = ["Calibration", "FitParameter", "MeasuredCurve", "fit_curve"]

log = logging.getLogger(__name__)


def _problem(
    spec: str,
    collective: str,
    num_npus: int,
    algorithm: str | Trace,
    config: SimConfig,
    *,
    bandwidth_gb_per_s: float | Sequence[float],
    latency_ns: float | Sequence[float],
    local_mem_bw_gb_per_s: float | None,
) -> Problem:
    """The starting values and which of them the spec (and the caller) leave free."""
    one, two = parse_spec(spec, 1.0, 1.0), parse_spec(spec, 2.0, 2.0)
    start = parse_spec(spec, bandwidth_gb_per_s, latency_ns)
    k = len(start.dims)
    lat0 = np.array([d.latency_ns for d in start.dims], dtype=np.float64)
    bw0 = np.array([d.bandwidth_gb_per_s for d in start.dims], dtype=np.float64)
    free_lat = np.array([a.latency_ns != b.latency_ns for a, b in zip(one.dims, two.dims, strict=True)])
    free_bw = np.array(
        [a.bandwidth_gb_per_s != b.bandwidth_gb_per_s for a, b in zip(one.dims, two.dims, strict=True)]
    )
    mem_free = local_mem_bw_gb_per_s is None
    mem0 = config.local_mem_bw_gb_per_s if local_mem_bw_gb_per_s is None else float(local_mem_bw_gb_per_s)
    free = np.concatenate([free_lat, free_bw, [mem_free]])
    if not free.any():
        raise OptionError(
            f"topology spec {spec!r} gives every latency and bandwidth and the reduction bandwidth "
            "is fixed: nothing to fit (leave out bw= or lat=, or let the reduction bandwidth free)"
        )
    names = (
        *(f"lat_ns[{i}]" for i in range(k)),
        *(f"bw_gb_per_s[{i}]" for i in range(k)),
        "local_mem_bw_gb_per_s",
    )
    scale = np.concatenate([np.where(lat0 > 0, lat0, 1000.0), bw0, [mem0]])
    return Problem(spec, collective, num_npus, algorithm, config, lat0, bw0, mem0, names, free, scale)


def fit_curve(
    curve: MeasuredCurve,
    spec: str,
    *,
    algorithm: str | Trace = "native",
    config: SimConfig | None = None,
    bandwidth_gb_per_s: float | Sequence[float] = DEFAULT_BANDWIDTH_GB_PER_S,
    latency_ns: float | Sequence[float] = DEFAULT_LATENCY_NS,
    local_mem_bw_gb_per_s: float | None = None,
    min_size_bytes: int = 1,
    max_size_bytes: int | None = None,
) -> Calibration:
    """Fit the network parameters ``spec`` leaves free so that simulation reproduces ``curve``.

    Parameters
    ----------
    curve
        The measured times (:func:`etstore.app.calibrate.measured_curve` reads a stored run's).
    spec
        Topology spec (``ring:8``, ``ring:4+switch:8,bw=50/400``); an axis's latency or
        bandwidth is free when the spec has no ``lat=`` / ``bw=``. Its NPU count must
        equal the run's ranks.
    algorithm
        What the collective runs: ``native`` (ASTRA-sim's ring), a generator name
        (``ring``, ``direct``, ...) or an algorithm trace.
    config
        Simulator parameters (default :class:`SimConfig`); its reduction bandwidth is
        the starting value of the fitted one.
    bandwidth_gb_per_s, latency_ns
        Starting values of the free bandwidths (GB/s, GB = 2^30) and latencies (ns).
    local_mem_bw_gb_per_s
        A fixed reduction bandwidth (GB/s, GB = 10^9); None fits it.
    min_size_bytes, max_size_bytes
        The sizes fitted (inclusive); every size is still simulated before and after.

    Returns
    -------
    Calibration
        The fitted spec and reduction bandwidth, each parameter's status, and per size
        the measured, starting and fitted times.

    Raises
    ------
    OptionError
        Nothing is free, the topology's NPU count is not the run's rank count, or no
        measured size lies in the size range.
    SimulationError
        The algorithm cannot run the collective (one line naming run, algorithm, size).
    TopologyError
        The spec cannot be parsed.

    Notes
    -----
    O(R · (P + 1) · S) simulations for R rounds (2-3 when the critical path does not
    change), P free parameters and S fitted sizes, plus 2 · S for before and after.
    Each parameter of zero slope where the fit ends costs S more (its probe); when
    some change a time there, the descent restarted from where they bind costs about
    7 · S (the bisection) and up to 4 more rounds.
    """
    cfg = config or SimConfig()
    sizes_all, measured_all = curve.size_bytes, curve.time_us
    num_npus = Topology.from_spec(spec).num_npus
    if curve.ranks is not None and curve.ranks != num_npus:
        raise OptionError(
            f"measured run {curve.run!r} ran on {curve.ranks} ranks; topology {spec!r} has {num_npus} NPUs"
        )
    p = _problem(
        spec,
        curve.collective,
        num_npus,
        algorithm,
        cfg,
        bandwidth_gb_per_s=bandwidth_gb_per_s,
        latency_ns=latency_ns,
        local_mem_bw_gb_per_s=local_mem_bw_gb_per_s,
    )
    fitted = (sizes_all >= min_size_bytes) & (
        sizes_all <= (max_size_bytes if max_size_bytes is not None else np.iinfo(np.int64).max)
    )
    if not fitted.any():
        hi = "" if max_size_bytes is None else f" and {max_size_bytes} B"
        raise OptionError(f"measured run {curve.run!r} has no size between {min_size_bytes} B{hi}")
    sizes, measured = sizes_all[fitted], measured_all[fitted]
    start_topo = topology_at(p, p.lat0, p.bw0)
    before = times_us(p, start_topo, cfg.replace(local_mem_bw_gb_per_s=p.mem0), sizes_all, curve.run)
    u = np.concatenate([np.where(p.lat0 > 0, 1.0, 0.0), np.ones(len(p.names) - len(p.lat0))])
    fit = fit_parameters(p, u, sizes, measured, curve.run)
    u, statuses, rounds = fit.u, fit.statuses, fit.rounds
    sims = len(sizes_all) + fit.simulations
    lat, bw, mem = parameter_values(p, u)
    fitted_topo = topology_at(p, lat, bw)
    final = Topology.from_spec(fitted_topo.name)  # the spec as written: what a reuse will build
    mem = float(f"{mem:g}")
    after = times_us(p, final, cfg.replace(local_mem_bw_gb_per_s=mem), sizes_all, curve.run)
    sims += len(sizes_all)
    return Calibration(
        run_id=curve.run_id,
        run=curve.run,
        collective=curve.collective,
        num_npus=num_npus,
        algorithm=algorithm if isinstance(algorithm, str) else algorithm.name,
        congestion=cfg.congestion,
        start_spec=start_topo.name,
        spec=final.name,
        local_mem_bw_gb_per_s=mem,
        params=_parameters(p, statuses, final, mem),
        size_bytes=sizes_all,
        measured_us=measured_all,
        before_us=before,
        after_us=after,
        fitted=fitted,
        rounds=rounds,
        simulations=sims,
        min_size_bytes=int(min_size_bytes),
        max_size_bytes=None if max_size_bytes is None else int(max_size_bytes),
    )


def _parameters(p: Problem, statuses: list[str], final: Topology, mem: float) -> tuple[FitParameter, ...]:
    """Each parameter's start, fitted value (as the written spec holds it) and status."""
    dims = parse_spec(final.name, 1.0, 1.0).dims  # the written spec gives every value
    values = [float(d.latency_ns) for d in dims] + [float(d.bandwidth_gb_per_s) for d in dims] + [mem]
    starts = [*p.lat0.tolist(), *p.bw0.tolist(), p.mem0]
    return tuple(
        FitParameter(name, float(s), float(v), st)
        for name, s, v, st in zip(p.names, starts, values, statuses, strict=True)
    )
