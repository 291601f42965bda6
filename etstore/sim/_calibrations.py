"""Calibration values and their rows in the warehouse: the measured curve in, the fit out.

:func:`measured_curve` reads what a calibration fits out of ``measured_runs`` and
``measurements``; :func:`record_calibration` writes a fit to ``calibrations`` and
``calibration_points`` (DDL in :data:`etstore.store.schema.CALIBRATION_DDL`, view
``v_measured_vs_sim``); :func:`load_calibration` reads one back to simulate with. The fit
itself is :mod:`etstore.sim.calibrate`, which re-exports every public name here.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from etstore.errors import OptionError, UnknownTraceError
from etstore.sim.config import SimConfig, collective_name
from etstore.sim.result import busbw_factor
from etstore.store.warehouse import Warehouse
from etstore.topology import Topology

__all__ = [
    "Calibration",
    "FitParameter",
    "MeasuredCurve",
    "StoredCalibration",
    "load_calibration",
    "measured_curve",
    "record_calibration",
]

log = logging.getLogger(__name__)

# ------------------------------------------------------------------ values


class MeasuredCurve(NamedTuple):
    """One measured run's collective time per size (what a calibration fits)."""

    run_id: int
    """``measured_runs.run_id``."""
    run: str
    """``measured_runs.name``."""
    collective: str
    """Chakra collective name (``ALL_REDUCE``)."""
    ranks: int | None
    """GPUs of the run (null when the log had no device lines)."""
    size_bytes: np.ndarray
    """nccl-tests sizes S (bytes), ascending, each once, all > 0."""
    time_us: np.ndarray
    """Mean measured time per size (µs)."""
    in_place: bool
    """Whether the rows are the in-place ones (only when the log has no out-of-place rows)."""


@dataclass(frozen=True)
class FitParameter:
    """One network parameter of a calibration: where it started, where it ended, why."""

    name: str
    """``lat_ns[k]`` (latency of axis k, ns), ``bw_gb_per_s[k]`` (bandwidth of axis k, GB = 2^30)
    or ``local_mem_bw_gb_per_s`` (reduction bandwidth, GB = 10^9)."""
    start: float
    value: float
    status: str
    """``fitted``, ``not separable`` (the data cannot tell it from other parameters: moved as
    little as the fit allows), ``not binding`` (another axis hides it where the fit ends: any
    value at least this fast fits as well), ``no effect`` (changes no simulated time, even at
    1,000 times its cost: kept) or ``fixed`` (given by the spec or the caller)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form (``calibrations.params``)."""
        return {"name": self.name, "start": self.start, "value": self.value, "status": self.status}


@dataclass(frozen=True, eq=False)
class Calibration:
    """A fitted topology and how well it reproduces a measured curve.

    Times are µs; errors are relative ``simulated / measured − 1``.
    """

    run_id: int
    run: str
    collective: str
    num_npus: int
    algorithm: str
    congestion: str
    start_spec: str
    """Canonical spec of the starting topology (the spec with its defaults written out)."""
    spec: str
    """Canonical spec of the fitted topology; ``Topology.from_spec(spec)`` rebuilds it."""
    local_mem_bw_gb_per_s: float
    """Reduction bandwidth of the fit (GB = 10^9, ``SimConfig.local_mem_bw_gb_per_s``)."""
    params: tuple[FitParameter, ...]
    size_bytes: np.ndarray
    measured_us: np.ndarray
    before_us: np.ndarray
    after_us: np.ndarray
    fitted: np.ndarray
    """Per size: inside the fitted size range."""
    rounds: int
    simulations: int
    min_size_bytes: int
    max_size_bytes: int | None
    name: str | None = None
    calibration_id: int | None = None

    @property
    def error_before(self) -> np.ndarray:
        """Relative time error per size with the starting parameters."""
        return self.before_us / self.measured_us - 1.0

    @property
    def error_after(self) -> np.ndarray:
        """Relative time error per size with the fitted parameters."""
        return self.after_us / self.measured_us - 1.0

    def summary(self) -> dict[str, float]:
        """RMS and largest absolute error (%) over the fitted sizes, before and after."""
        out = {}
        for key, err in (("before", self.error_before), ("after", self.error_after)):
            e = err[self.fitted] * 100.0
            out[f"rms_error_{key}_pct"] = float(np.sqrt(np.mean(e**2))) if e.size else math.nan
            out[f"max_error_{key}_pct"] = float(np.max(np.abs(e))) if e.size else math.nan
        return out

    def points(self) -> pa.Table:
        """Per size: size_bytes, fitted, measured/before/after time (µs) and error before/after (%)."""
        return pa.table(
            {
                "size_bytes": pa.array(self.size_bytes, pa.int64()),
                "fitted": pa.array(self.fitted, pa.bool_()),
                "measured_time_us": self.measured_us,
                "sim_before_time_us": self.before_us,
                "sim_after_time_us": self.after_us,
                "error_before_pct": self.error_before * 100.0,
                "error_after_pct": self.error_after * 100.0,
            }
        )


class StoredCalibration(NamedTuple):
    """A calibration as stored: enough to simulate with it again."""

    calibration_id: int
    name: str
    run: str
    collective: str
    algorithm: str
    spec: str
    local_mem_bw_gb_per_s: float

    def topology(self) -> Topology:
        """The fitted topology."""
        return Topology.from_spec(self.spec)

    def config(self, base: SimConfig | None = None) -> SimConfig:
        """``base`` (default: :class:`SimConfig`) with the fitted reduction bandwidth."""
        return (base or SimConfig()).replace(local_mem_bw_gb_per_s=self.local_mem_bw_gb_per_s)


# ------------------------------------------------------------------ the measured curve


def measured_curve(warehouse: Warehouse, run: str | int, *, collective: str | None = None) -> MeasuredCurve:
    """The time per size of one measured run (out-of-place rows; in-place when there are no others).

    Parameters
    ----------
    warehouse
        The warehouse holding ``measured_runs`` and ``measurements``.
    run
        The run's name, or its ``run_id``.
    collective
        The collective, when the run does not say (all-gather and the like leave it null).

    Returns
    -------
    MeasuredCurve
        Sizes > 0 ascending; a size printed more than once takes the mean of its times.

    Raises
    ------
    UnknownTraceError
        No measured run of that name or id.
    OptionError
        The run names no collective and none is given, or it has no timed row of a size > 0.
    ConfigError
        ``collective`` is not a collective name.

    Notes
    -----
    O(rows of the run) in DuckDB.
    """
    row = _run_row(warehouse, run)
    coll = collective_name(collective) if collective else row["collective"]
    if not coll:
        raise OptionError(
            f"measured run {row['name']!r} does not say which collective it measured; name the collective"
        )
    t = warehouse.query(
        """SELECT in_place, size_bytes, avg(time_us) AS time_us FROM measurements
        WHERE run_id = $id AND size_bytes > 0 AND time_us > 0 GROUP BY ALL ORDER BY in_place, size_bytes""",
        {"id": row["run_id"]},
    ).to_arrow()
    in_place = t["in_place"].to_numpy(zero_copy_only=False).astype(bool)
    if not len(in_place):
        raise OptionError(f"measured run {row['name']!r} has no timed row of a size above 0 bytes")
    use = ~in_place if (~in_place).any() else in_place
    return MeasuredCurve(
        run_id=int(row["run_id"]),
        run=str(row["name"]),
        collective=str(coll),
        ranks=None if row["ranks"] is None else int(row["ranks"]),
        size_bytes=t["size_bytes"].to_numpy()[use].astype(np.int64),
        time_us=t["time_us"].to_numpy()[use].astype(np.float64),
        in_place=not (~in_place).any(),
    )


def _run_row(warehouse: Warehouse, run: str | int) -> dict[str, Any]:
    """The ``measured_runs`` row named ``run`` (or numbered, when no run has that name)."""
    rows = warehouse.query(
        "SELECT run_id, name, collective, ranks FROM measured_runs WHERE name = $n "
        "OR (NOT EXISTS (SELECT 1 FROM measured_runs WHERE name = $n) AND CAST(run_id AS VARCHAR) = $n)",
        {"n": str(run)},
    ).to_arrow()
    if rows.num_rows == 0:
        names = warehouse.query("SELECT name FROM measured_runs ORDER BY run_id LIMIT 6").to_arrow()
        known = names["name"].to_pylist()
        hint = (
            f"stored: {', '.join(known[:5])}{', ...' if len(known) > 5 else ''}" if known else "none stored"
        )
        raise UnknownTraceError(f"no measured run {str(run)!r} ({hint}; ingest a nccl-tests log first)")
    return rows.to_pylist()[0]


# ------------------------------------------------------------------ storing


def record_calibration(warehouse: Warehouse, cal: Calibration, *, name: str | None = None) -> Calibration:
    """Store a calibration under a name: a ``calibrations`` row and its ``calibration_points``.

    Parameters
    ----------
    warehouse
        A writable warehouse.
    cal
        What :func:`fit_curve` returned.
    name
        The calibration's name (default ``<run>-<algorithm>``, then ``-2``, ``-3``, ...
        when taken); an explicit name already taken is an error.

    Returns
    -------
    Calibration
        ``cal`` with its ``name`` and ``calibration_id``.

    Raises
    ------
    StoreError
        ``name`` is taken, or DuckDB refuses the rows; nothing is stored then.

    Notes
    -----
    O(sizes): one row and one columnar insert, in one transaction.
    """
    with warehouse.transaction():
        wanted = name or f"{cal.run}-{cal.algorithm}"
        clash = f"calibration {wanted!r} already exists; choose another name"
        chosen = warehouse.unused_name("calibrations", wanted, explicit=name is not None, clash=clash)
        cid = warehouse.next_id("calibrations", "calibration_id")
        summary = cal.summary()
        row = {
            "calibration_id": cid,
            "name": chosen,
            "measured_run_id": cal.run_id,
            "measured_run": cal.run,
            "collective": cal.collective,
            "ranks": cal.num_npus,
            "algorithm": cal.algorithm,
            "congestion": cal.congestion,
            "start_spec": cal.start_spec,
            "spec": cal.spec,
            "local_mem_bw_gb_per_s": cal.local_mem_bw_gb_per_s,
            "params": json.dumps([q.as_dict() for q in cal.params]),
            "busbw_factor": busbw_factor(cal.collective, cal.num_npus),
            "min_size_bytes": cal.min_size_bytes,
            "max_size_bytes": cal.max_size_bytes,
            "points": int(cal.fitted.sum()),
            **summary,
            "rounds": cal.rounds,
            "simulations": cal.simulations,
        }
        warehouse.append("calibrations", pa.Table.from_pylist([row]))
        pts = cal.points().drop_columns(["error_before_pct", "error_after_pct"])
        pts = pts.add_column(0, "calibration_id", pa.array([cid] * pts.num_rows, pa.int64()))
        warehouse.append("calibration_points", pts)
    log.debug("stored calibration %s (%d sizes): %s", chosen, len(cal.size_bytes), cal.spec)
    return replace(cal, name=chosen, calibration_id=cid)


def load_calibration(warehouse: Warehouse, name: str) -> StoredCalibration:
    """A stored calibration by name: its fitted spec and reduction bandwidth, ready to simulate with.

    Raises
    ------
    UnknownTraceError
        No calibration of that name.
    """
    rows = warehouse.query(
        "SELECT calibration_id, name, measured_run, collective, algorithm, spec, local_mem_bw_gb_per_s "
        "FROM calibrations WHERE name = $n",
        {"n": name},
    ).to_pylist()
    if not rows:
        raise UnknownTraceError(f"no calibration {name!r}")
    r = rows[0]
    return StoredCalibration(
        int(r["calibration_id"]),
        str(r["name"]),
        str(r["measured_run"]),
        str(r["collective"]),
        str(r["algorithm"]),
        str(r["spec"]),
        float(r["local_mem_bw_gb_per_s"]),
    )
