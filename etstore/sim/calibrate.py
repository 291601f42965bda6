"""Calibration: fit a topology's free network parameters to a measured nccl-tests curve.

A measured run (:mod:`etstore.store.measured`) gives, per size S, the time one
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
the reduction bandwidth goes beside it; :func:`record_calibration` stores both in the
warehouse table ``calibrations`` with the per-size points in ``calibration_points``
(view ``v_measured_vs_sim``; ``docs/measured.md``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from etstore.errors import ConfigError, OptionError, SimulationError, TemplateError, UnsatisfiableError
from etstore.model import Trace
from etstore.sim._calibrations import (
    Calibration,
    FitParameter,
    MeasuredCurve,
    StoredCalibration,
    load_calibration,
    measured_curve,
    record_calibration,
)
from etstore.sim._lsq import NO_EFFECT, column_status, pulled_lstsq
from etstore.sim.config import SimConfig
from etstore.sim.engine import simulate
from etstore.sim.sweep import collective_workload
from etstore.store.warehouse import Warehouse
from etstore.topology import DEFAULT_BANDWIDTH_GB_PER_S, DEFAULT_LATENCY_NS, Topology
from etstore.topology.spec import parse_spec

__all__ = [
    "Calibration",
    "FitParameter",
    "MeasuredCurve",
    "StoredCalibration",
    "calibrate",
    "fit_curve",
    "load_calibration",
    "measured_curve",
    "record_calibration",
]

log = logging.getLogger(__name__)

_PULL = 1e-6  # weight of the pulls that settle what the data leave open, relative to one size's
# squared error
_MAX_ROUNDS = 12
_HALVINGS = 12  # a step is halved at most this often (to 1/2048) before the fit stops
# the iteration ends when u moves less than this (relative to max(1, u); values keep 6 digits), or
# the error drops by less than its square (relative)
_CONVERGED = 1e-5
_U_FLOOR = 1e-6  # inverse bandwidths stay above 1e-6 x the start: bandwidth at most 1e6 x the start
_PROBE = 1000.0  # a parameter of no slope is probed at this many times its cost (at least its start's)
_BIND_RATIO = 1.25  # where a hidden parameter starts to bind is found to within this factor
_MAX_RESTARTS = 4  # descents from where hidden parameters bind, at most
_RESTART_ROUNDS = 4  # rounds such a descent has to beat the fit it restarts from
_BETTER = 1e-6  # a restart is kept when it lowers the error by more than this (relative)


# ------------------------------------------------------------------ the fit


class _Problem(NamedTuple):
    """What one simulation needs, and the free parameters as multiples ``u`` of their start."""

    spec: str
    collective: str
    num_npus: int
    algorithm: str | Trace
    config: SimConfig
    lat0: np.ndarray  # per axis, ns
    bw0: np.ndarray  # per axis, GB/s (GB = 2^30)
    mem0: float  # GB/s (GB = 10^9)
    names: tuple[str, ...]  # every parameter: lat per axis, bw per axis, mem
    free: np.ndarray  # per parameter
    scale: np.ndarray  # per parameter: the value u = 1 stands for (1 µs for a latency starting at 0)


def _values(p: _Problem, u: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Latencies, bandwidths and reduction bandwidth at ``u`` (inverse bandwidths scale with u)."""
    k = len(p.lat0)
    lat = np.where(p.free[:k], u[:k] * p.scale[:k], p.lat0)
    bw = np.where(p.free[k : 2 * k], p.bw0 / u[k : 2 * k], p.bw0)
    mem = p.mem0 / u[-1] if p.free[-1] else p.mem0
    return lat, bw, float(mem)


def _topology(p: _Problem, lat: np.ndarray, bw: np.ndarray) -> Topology:
    """The spec with these values where it leaves them free (its own values win)."""
    return Topology.from_spec(
        p.spec, bandwidth_gb_per_s=[float(x) for x in bw], latency_ns=[float(x) for x in lat]
    )


def _times_us(p: _Problem, topo: Topology, config: SimConfig, sizes: np.ndarray, run: str) -> np.ndarray:
    """Simulated time (µs) of the collective at each size."""
    label = p.algorithm if isinstance(p.algorithm, str) else p.algorithm.name
    out = np.empty(len(sizes))
    for i, size in enumerate(sizes):
        work = collective_workload(p.collective, p.num_npus, int(size))
        try:
            res = simulate(work, topo, config=config, algorithms={p.collective: p.algorithm})
        except (SimulationError, TemplateError, ConfigError, UnsatisfiableError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SimulationError(
                f"calibrating {run!r}: algorithm {label!r} cannot simulate {p.collective} of {int(size)} B "
                f"on {topo.name}: {first}"
            ) from exc
        out[i] = res.total_ns / 1e3
    return out


def _simulate_at(p: _Problem, u: np.ndarray, sizes: np.ndarray, run: str) -> np.ndarray:
    """Times (µs) at ``u`` on the fit's exact clock (no truncation to whole ns: exactly affine)."""
    lat, bw, mem = _values(p, u)
    cfg = p.config.replace(local_mem_bw_gb_per_s=mem, integer_ns=False)
    return _times_us(p, _topology(p, lat, bw), cfg, sizes, run)


def _step(
    p: _Problem, u: np.ndarray, t0: np.ndarray, jac: np.ndarray, measured: np.ndarray, statuses: list[str]
) -> np.ndarray:
    """The bounded least-squares solution of the affine model ``t0 + jac (u' − u) ≈ measured``.

    Parameters of one kind (latencies; inverse bandwidths with the reduction's) that the
    data cannot tell apart are pulled towards a common multiple of their starts, so they
    keep their starting ratios; those of no effect here stay where they are.
    """
    free = np.flatnonzero(p.free)
    a = jac[:, free] / measured[:, None]
    b = (measured - t0 + jac[:, free] @ u[free]) / measured
    is_lat = np.array([n.startswith("lat") for n in p.names])[free]
    effect = np.array([statuses[k] != "no effect" for k in free])
    tied = np.array([statuses[k] == "not separable" for k in free])
    out = u.copy()
    out[free] = pulled_lstsq(
        a,
        b,
        np.where(is_lat, 0.0, _U_FLOOR),
        [is_lat & tied, ~is_lat & tied],
        effect,
        _PULL,
        anchor=np.where(effect, 1.0, u[free]),
    )
    return out


def _jacobian(p: _Problem, u: np.ndarray, t0: np.ndarray, sizes: np.ndarray, run: str) -> np.ndarray:
    """d time / d u per size and free parameter, from one extra simulation per parameter.

    The step is small (0.1 % of the value) so the slope is the current critical path's:
    where another path takes over (chunks pipelined over two axes), the time has a kink.
    """
    jac = np.zeros((len(sizes), len(u)))
    for k in np.flatnonzero(p.free):
        h = 1e-3 * max(float(u[k]), 0.01)
        v = u.copy()
        v[k] += h
        jac[:, k] = (_simulate_at(p, v, sizes, run) - t0) / h
    return jac


def _sse(times: np.ndarray, measured: np.ndarray) -> float:
    """The objective: the sum of squared relative time errors."""
    return float(np.sum((times / measured - 1.0) ** 2))


def _line_search(
    p: _Problem,
    u: np.ndarray,
    t0: np.ndarray,
    target: np.ndarray,
    sizes: np.ndarray,
    measured: np.ndarray,
    run: str,
) -> tuple[np.ndarray, np.ndarray | None, int]:
    """The step towards ``target``, halved until the simulated error drops: (u, its times or None, tries).

    The affine model is exact along one critical path; a step that crosses a kink may
    overshoot, and halving it keeps every round an improvement.
    """
    error = _sse(t0, measured)
    step = target - u
    for tries in range(1, _HALVINGS + 1):
        cand = u + step
        times = _simulate_at(p, cand, sizes, run)
        if _sse(times, measured) <= error * (1.0 + 1e-12):
            return cand, times, tries
        step = step / 2.0
    return u, None, _HALVINGS


def _statuses(p: _Problem, jac: np.ndarray, measured: np.ndarray) -> list[str]:
    """Per parameter: fixed, or what :func:`~etstore.sim._lsq.column_status` says of its column."""
    free = np.flatnonzero(p.free)
    found = column_status(jac[:, free] / measured[:, None])
    out = ["fixed"] * len(p.names)
    for k, status in zip(free, found, strict=True):
        out[k] = status
    return out


class _Fit(NamedTuple):
    """Where one descent ended: ``u``, its times (µs, fitted sizes) and each parameter's status there."""

    u: np.ndarray
    times: np.ndarray
    statuses: list[str]
    rounds: int
    simulations: int
    settled: bool  # False when the rounds ran out first


def _descend(
    p: _Problem,
    u: np.ndarray,
    t0: np.ndarray,
    sizes: np.ndarray,
    measured: np.ndarray,
    run: str,
    max_rounds: int,
) -> _Fit:
    """Gauss-Newton rounds from ``u`` (times ``t0``) until ``u`` settles; statuses at the end point.

    Each round's step treats the parameters by their status at that round's point; the
    descent ends only once the statuses at the point it settled on are those its last
    step used, so a parameter that gains an effect on the way (another axis got faster
    and no longer hides it) is fitted, not left where it was.
    """
    rounds = sims = 0
    settled, used = False, None
    while True:
        jac = _jacobian(p, u, t0, sizes, run)
        sims += len(sizes) * int(p.free.sum())
        statuses = _statuses(p, jac, measured)
        if settled and statuses == used:
            break
        if rounds == max_rounds:
            settled = False
            break
        rounds, used = rounds + 1, statuses
        target = _step(p, u, t0, jac, measured, statuses)
        new, t_new, tries = _line_search(p, u, t0, target, sizes, measured, run)
        sims += tries * len(sizes)
        if t_new is None:  # no step lowers the error: u is a minimum of the model, statuses are u's
            settled = True
            break
        moved = float(np.max(np.abs(new - u) / np.maximum(1.0, np.abs(u))))
        gain = _sse(t0, measured) - _sse(t_new, measured)
        u, t0 = new, t_new
        log.debug("calibration round %d: u = %s (moved %.3g, error down %.3g)", rounds, u, moved, gain)
        settled = moved < _CONVERGED or gain <= _CONVERGED**2 * _sse(t0, measured)
    return _Fit(u, t0, statuses, rounds, sims, settled)


def _probe_value(u: np.ndarray, k: int) -> float:
    """Parameter ``k`` at :data:`_PROBE` times the cost of its value or of its start, whichever is more."""
    return max(float(u[k]), 1.0) * _PROBE


def _changes(times: np.ndarray, t0: np.ndarray, measured: np.ndarray) -> bool:
    """Whether ``times`` differ from ``t0`` anywhere (relative to the measured times)."""
    return float(np.linalg.norm((times - t0) / measured)) > NO_EFFECT


def _not_binding(
    p: _Problem, fit: _Fit, sizes: np.ndarray, measured: np.ndarray, run: str
) -> tuple[list[str], int]:
    """Statuses with each ``no effect`` parameter probed far away: ``not binding`` where a time changes.

    A zero slope is local: a link hidden behind a slower axis (chunks pipelined over two
    axes) changes nothing until it is slow enough to become the bottleneck. Only a
    parameter that changes no time even at :data:`_PROBE` times its cost has no effect.
    """
    out, sims = list(fit.statuses), 0
    for k in np.flatnonzero(p.free).tolist():
        if out[k] != "no effect":
            continue
        v = fit.u.copy()
        v[k] = _probe_value(fit.u, k)
        sims += len(sizes)
        if _changes(_simulate_at(p, v, sizes, run), fit.times, measured):
            out[k] = "not binding"
    return out, sims


def _where_they_bind(
    p: _Problem, fit: _Fit, ks: list[int], sizes: np.ndarray, measured: np.ndarray, run: str
) -> tuple[np.ndarray, np.ndarray, int]:
    """``fit.u`` with parameters ``ks`` moved together just past where the first of them changes a time.

    Each moves geometrically from its value (changes nothing) towards its probe (changes
    a time), all by one common fraction of the way, found by bisection to within a
    factor :data:`_BIND_RATIO`: (u, its times, simulations).
    """
    lo = np.array([max(float(fit.u[k]), _probe_value(fit.u, k) / _PROBE**2) for k in ks])
    hi = np.array([_probe_value(fit.u, k) for k in ks])
    span = float(np.max(np.log(hi / lo)))
    v = fit.u.copy()
    v[ks] = hi
    t_hi, sims = _simulate_at(p, v, sizes, run), len(sizes)
    g_lo, g_hi = 0.0, 1.0
    while (g_hi - g_lo) * span > math.log(_BIND_RATIO):
        g = (g_lo + g_hi) / 2.0
        v[ks] = lo * (hi / lo) ** g
        times = _simulate_at(p, v, sizes, run)
        sims += len(sizes)
        if _changes(times, fit.times, measured):
            g_hi, t_hi = g, times
        else:
            g_lo = g
    v[ks] = lo * (hi / lo) ** g_hi
    return v, t_hi, sims


def _fit(p: _Problem, u: np.ndarray, sizes: np.ndarray, measured: np.ndarray, run: str) -> _Fit:
    """Descend from ``u``, then from where the ``not binding`` parameters start to bind; keep the best.

    A parameter that a slower path hides where one descent settles may still be what
    the measured curve needs (a 2-node log: the link between nodes, hidden at the start
    behind axis 0, is the bottleneck of the large sizes). Those parameters are moved to
    where they start to change a time and the fit descends again from there, for
    :data:`_RESTART_ROUNDS` rounds; when that lowers the error, the descent goes on to
    the end and the search repeats from its result (at most :data:`_MAX_RESTARTS` times).
    """
    t0 = _simulate_at(p, u, sizes, run)
    best = _descend(p, u, t0, sizes, measured, run, _MAX_ROUNDS)
    statuses, n = _not_binding(p, best, sizes, measured, run)
    rounds, sims = best.rounds, len(sizes) + best.simulations + n
    for _ in range(_MAX_RESTARTS):
        hidden = [k for k, status in enumerate(statuses) if status == "not binding"]
        if not hidden:
            break
        v, t_v, n = _where_they_bind(p, best, hidden, sizes, measured, run)
        cand = _descend(p, v, t_v, sizes, measured, run, _RESTART_ROUNDS)
        rounds, sims = rounds + cand.rounds, sims + n + cand.simulations
        error, cand_error = _sse(best.times, measured), _sse(cand.times, measured)
        log.debug(
            "calibration: descent from %s binding: error %.6g -> %.6g",
            [p.names[k] for k in hidden],
            error,
            cand_error,
        )
        if not cand_error < error * (1.0 - _BETTER):
            break
        best = cand
        if not cand.settled:
            best = _descend(p, cand.u, cand.times, sizes, measured, run, _MAX_ROUNDS - cand.rounds)
            rounds, sims = rounds + best.rounds, sims + best.simulations
        statuses, n = _not_binding(p, best, sizes, measured, run)
        sims += n
    return _Fit(best.u, best.times, statuses, rounds, sims, best.settled)


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
) -> _Problem:
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
    return _Problem(spec, collective, num_npus, algorithm, config, lat0, bw0, mem0, names, free, scale)


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
        The measured times (:func:`measured_curve`).
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
    start_topo = _topology(p, p.lat0, p.bw0)
    before = _times_us(p, start_topo, cfg.replace(local_mem_bw_gb_per_s=p.mem0), sizes_all, curve.run)
    u = np.concatenate([np.where(p.lat0 > 0, 1.0, 0.0), np.ones(len(p.names) - len(p.lat0))])
    fit = _fit(p, u, sizes, measured, curve.run)
    u, statuses, rounds = fit.u, fit.statuses, fit.rounds
    sims = len(sizes_all) + fit.simulations
    lat, bw, mem = _values(p, u)
    fitted_topo = _topology(p, lat, bw)
    final = Topology.from_spec(fitted_topo.name)  # the spec as written: what a reuse will build
    mem = float(f"{mem:g}")
    after = _times_us(p, final, cfg.replace(local_mem_bw_gb_per_s=mem), sizes_all, curve.run)
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


def _parameters(p: _Problem, statuses: list[str], final: Topology, mem: float) -> tuple[FitParameter, ...]:
    """Each parameter's start, fitted value (as the written spec holds it) and status."""
    dims = parse_spec(final.name, 1.0, 1.0).dims  # the written spec gives every value
    values = [float(d.latency_ns) for d in dims] + [float(d.bandwidth_gb_per_s) for d in dims] + [mem]
    starts = [*p.lat0.tolist(), *p.bw0.tolist(), p.mem0]
    return tuple(
        FitParameter(name, float(s), float(v), st)
        for name, s, v, st in zip(p.names, starts, values, statuses, strict=True)
    )


def calibrate(
    warehouse: Warehouse,
    run: str | int,
    spec: str,
    *,
    algorithm: str | Trace = "native",
    name: str | None = None,
    collective: str | None = None,
    config: SimConfig | None = None,
    bandwidth_gb_per_s: float | Sequence[float] = DEFAULT_BANDWIDTH_GB_PER_S,
    latency_ns: float | Sequence[float] = DEFAULT_LATENCY_NS,
    local_mem_bw_gb_per_s: float | None = None,
    min_size_bytes: int = 1,
    max_size_bytes: int | None = None,
    record: bool = True,
) -> Calibration:
    """Fit ``spec`` to a stored measured run and (by default) store the result by name.

    :func:`measured_curve`, then :func:`fit_curve`, then :func:`record_calibration`;
    the parameters are theirs (``record=False`` stores nothing).

    Raises
    ------
    UnknownTraceError
        No measured run ``run``.
    OptionError
        Nothing to fit, rank count and topology disagree, no size in range, or the
        run names no collective.
    SimulationError
        The algorithm cannot run the run's collective.
    StoreError
        An explicit ``name`` is taken.

    Notes
    -----
    See :func:`fit_curve`.

    Examples
    --------
    >>> cal = calibrate(store.warehouse, "ar", "ring:8", algorithm="native")  # doctest: +SKIP
    >>> cal.spec, cal.summary()["max_error_after_pct"]  # doctest: +SKIP
    """
    curve = measured_curve(warehouse, run, collective=collective)
    cal = fit_curve(
        curve,
        spec,
        algorithm=algorithm,
        config=config,
        bandwidth_gb_per_s=bandwidth_gb_per_s,
        latency_ns=latency_ns,
        local_mem_bw_gb_per_s=local_mem_bw_gb_per_s,
        min_size_bytes=min_size_bytes,
        max_size_bytes=max_size_bytes,
    )
    return record_calibration(warehouse, cal, name=name) if record else cal
