"""Calibration against a stored measured run: read its curve, fit it, store the fit by name.

The fit is :func:`etstore.sim.calibrate.fit_curve` (pure: a measured curve and a topology spec
in, a :class:`~etstore.sim.calibrate.Calibration` out). This module is what reads and writes
the warehouse around it: :func:`measured_curve` reads what a calibration fits out of
``measured_runs`` and ``measurements`` (:mod:`etstore.app.measured` stores them);
:func:`record_calibration` writes a fit to ``calibrations`` and ``calibration_points`` (declared
here with view ``v_measured_vs_sim``: :data:`CALIBRATION_TABLES`);
:func:`load_calibration` reads one back to simulate with; :func:`calibrate` does all three.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from etstore.algorithms.nccl_tuning import system_for
from etstore.errors import OptionError, UnknownTraceError
from etstore.model import Trace
from etstore.sim.calibrate import Calibration, MeasuredCurve, fit_curve
from etstore.sim.config import SimConfig, collective_name
from etstore.sim.result import busbw_factor
from etstore.store.tables import TableSet
from etstore.store.warehouse import Warehouse
from etstore.topology import DEFAULT_BANDWIDTH_GB_PER_S, DEFAULT_LATENCY_NS, Topology

__all__ = [
    "CALIBRATION_TABLES",
    "StoredCalibration",
    "calibrate",
    "load_calibration",
    "measured_curve",
    "nccl_algorithm",
    "record_calibration",
]

log = logging.getLogger(__name__)

CALIBRATION_TABLES = TableSet(
    "calibrations",
    {
        "calibrations": """CREATE TABLE IF NOT EXISTS calibrations (
        calibration_id BIGINT PRIMARY KEY, name VARCHAR NOT NULL UNIQUE, measured_run_id BIGINT,
        measured_run VARCHAR, collective VARCHAR, ranks INTEGER, algorithm VARCHAR, congestion VARCHAR,
        start_spec VARCHAR, spec VARCHAR, local_mem_bw_gb_per_s DOUBLE, params VARCHAR, busbw_factor DOUBLE,
        min_size_bytes BIGINT, max_size_bytes BIGINT, points INTEGER, rms_error_before_pct DOUBLE,
        rms_error_after_pct DOUBLE, max_error_before_pct DOUBLE, max_error_after_pct DOUBLE, rounds INTEGER,
        simulations INTEGER, created_at TIMESTAMP DEFAULT (now()::TIMESTAMP))""",
        "calibration_points": """CREATE TABLE IF NOT EXISTS calibration_points (
        calibration_id BIGINT NOT NULL, size_bytes BIGINT, fitted BOOLEAN, measured_time_us DOUBLE,
        sim_before_time_us DOUBLE, sim_after_time_us DOUBLE)""",
    },
    {
        "v_measured_vs_sim": """CREATE OR REPLACE VIEW v_measured_vs_sim AS
        SELECT c.measured_run_id, c.measured_run, c.calibration_id, c.name AS calibration, c.collective,
            c.ranks, c.algorithm, c.spec, c.local_mem_bw_gb_per_s, p.size_bytes, p.fitted,
            p.measured_time_us, p.size_bytes / p.measured_time_us / 1e3 * c.busbw_factor
                AS measured_busbw_gb_per_s,
            p.sim_before_time_us, p.size_bytes / p.sim_before_time_us / 1e3 * c.busbw_factor
                AS sim_before_busbw_gb_per_s,
            p.sim_after_time_us, p.size_bytes / p.sim_after_time_us / 1e3 * c.busbw_factor
                AS sim_after_busbw_gb_per_s,
            100 * (p.sim_before_time_us / p.measured_time_us - 1) AS error_before_pct,
            100 * (p.sim_after_time_us / p.measured_time_us - 1) AS error_after_pct
        FROM calibration_points p JOIN calibrations c USING (calibration_id)""",
    },
)
"""The calibrations (``docs/measured.md`` documents them) and view ``v_measured_vs_sim``: per
calibrated size, the measured time beside the simulated ones before and after the fit. Its
bandwidths are computed from the times the way nccl-tests does (``size / time · busbw_factor``,
bytes per ns), so they are GB/s with GB = 10^9, the one unit of every reported rate: they
compare directly with ``measurements`` and with the simulator's ``collectives`` and
``sweep_points``."""


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
        What :func:`~etstore.sim.calibrate.fit_curve` returned.
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
        warehouse.ensure(CALIBRATION_TABLES)
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


_GPU_PRESETS = (("H100", "h100"), ("H200", "h100"), ("H800", "h100"), ("A100", "a100"), ("A800", "a100"))


def nccl_algorithm(warehouse: Warehouse, run: str | int) -> str:
    """The NCCL algorithm spec that stands for a measured run in the simulator.

    A log of a run that forced one algorithm and one protocol (``NCCL_ALGO=Ring``,
    ``NCCL_PROTO=LL``; the reader keeps NCCL's ``set by environment to`` lines in the
    header's ``nccl_env``) is ``nccl-ring:CH:LL`` (``nccl-tree:CH:PROTO:NODES``), CH the
    log's ``coll channels`` or else the preset's communicator channels; any other run
    (NCCL choosing per size, or a forced algorithm etstore does not build) is
    ``nccl:GPU:NODES``, NCCL's tuning model picking per size on the preset of its GPU
    model (``a100`` when the model is unknown).

    Raises
    ------
    UnknownTraceError
        No measured run ``run``.
    """
    row = _run_row(warehouse, run)
    query = "SELECT gpu_model, nodes, header FROM measured_runs WHERE run_id = $id"
    info = warehouse.query(query, {"id": row["run_id"]}).to_arrow().to_pylist()[0]
    header = json.loads(info["header"]) if isinstance(info["header"], str) else info["header"] or {}
    env = {k: str(v) for k, v in (header.get("nccl_env") or {}).items()}
    model = str(info["gpu_model"] or "").upper()
    gpu = next((preset for key, preset in _GPU_PRESETS if key in model), "a100")
    nodes = int(info["nodes"] or 1)
    algo, proto = env.get("NCCL_ALGO", "").lower(), env.get("NCCL_PROTO", "").lower()
    if algo in ("ring", "tree") and proto in ("ll", "ll128", "simple"):
        channels = int(header.get("nccl_coll_channels") or 2 * system_for(gpu, nodes).channels)
        return f"nccl-{algo}:{channels}:{proto}" + (f":{nodes}" if algo == "tree" else "")
    return f"nccl:{gpu}:{nodes}"


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

    :func:`measured_curve`, then :func:`~etstore.sim.calibrate.fit_curve`, then
    :func:`record_calibration`;
    the parameters are theirs (``record=False`` stores nothing). ``algorithm="nccl"``
    becomes :func:`nccl_algorithm` of the run: NCCL's algorithm and protocol as the run
    forced them, so each (algorithm, protocol) gets its own fit.

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
    See :func:`~etstore.sim.calibrate.fit_curve`.

    Examples
    --------
    >>> cal = calibrate(store.warehouse, "ar", "ring:8", algorithm="native")  # doctest: +SKIP
    >>> cal.spec, cal.summary()["max_error_after_pct"]  # doctest: +SKIP
    """
    curve = measured_curve(warehouse, run, collective=collective)
    if algorithm == "nccl":  # the (algorithm, protocol) the run forced, else NCCL's pick per size
        algorithm = nccl_algorithm(warehouse, run)
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
