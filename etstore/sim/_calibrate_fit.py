"""The descent behind :func:`etstore.sim.calibrate.fit_curve`: a topology's free link
parameters and reduction bandwidth fitted to a measured curve.

Gauss-Newton on the simulated times (affine in each latency and inverse bandwidth for a fixed
critical path), each round a line search; a parameter's status (fitted, not separable, not
binding, no effect) is decided where the fit ends, and parameters another axis hides are tried
from where they start to bind (``docs/measured.md``, "What is fitted").
"""

from __future__ import annotations

import logging
import math
from typing import NamedTuple

import numpy as np

from etstore.errors import ConfigError, SimulationError, TemplateError, UnsatisfiableError
from etstore.model import Trace
from etstore.sim._lsq import NO_EFFECT, column_status, pulled_lstsq
from etstore.sim.config import SimConfig
from etstore.sim.engine import simulate
from etstore.sim.sweep import collective_workload
from etstore.topology import Topology

__all__ = ["Problem", "fit_parameters", "parameter_values", "times_us", "topology_at"]

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


class Problem(NamedTuple):
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


def parameter_values(p: Problem, u: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Latencies, bandwidths and reduction bandwidth at ``u`` (inverse bandwidths scale with u)."""
    k = len(p.lat0)
    lat = np.where(p.free[:k], u[:k] * p.scale[:k], p.lat0)
    bw = np.where(p.free[k : 2 * k], p.bw0 / u[k : 2 * k], p.bw0)
    mem = p.mem0 / u[-1] if p.free[-1] else p.mem0
    return lat, bw, float(mem)


def topology_at(p: Problem, lat: np.ndarray, bw: np.ndarray) -> Topology:
    """The spec with these values where it leaves them free (its own values win)."""
    return Topology.from_spec(
        p.spec, bandwidth_gb_per_s=[float(x) for x in bw], latency_ns=[float(x) for x in lat]
    )


def times_us(p: Problem, topo: Topology, config: SimConfig, sizes: np.ndarray, run: str) -> np.ndarray:
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


def _simulate_at(p: Problem, u: np.ndarray, sizes: np.ndarray, run: str) -> np.ndarray:
    """Times (µs) at ``u`` on the fit's exact clock (no truncation to whole ns: exactly affine)."""
    lat, bw, mem = parameter_values(p, u)
    cfg = p.config.replace(local_mem_bw_gb_per_s=mem, integer_ns=False)
    return times_us(p, topology_at(p, lat, bw), cfg, sizes, run)


def _step(
    p: Problem, u: np.ndarray, t0: np.ndarray, jac: np.ndarray, measured: np.ndarray, statuses: list[str]
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


def _jacobian(p: Problem, u: np.ndarray, t0: np.ndarray, sizes: np.ndarray, run: str) -> np.ndarray:
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
    p: Problem,
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


def _statuses(p: Problem, jac: np.ndarray, measured: np.ndarray) -> list[str]:
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
    p: Problem,
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
    p: Problem, fit: _Fit, sizes: np.ndarray, measured: np.ndarray, run: str
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
    p: Problem, fit: _Fit, ks: list[int], sizes: np.ndarray, measured: np.ndarray, run: str
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


def fit_parameters(p: Problem, u: np.ndarray, sizes: np.ndarray, measured: np.ndarray, run: str) -> _Fit:
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
