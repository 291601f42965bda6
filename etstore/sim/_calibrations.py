"""Calibration values: the measured curve a fit takes, each fitted parameter, the fit itself.

The fit is :mod:`etstore.sim.calibrate`, which re-exports every public name here; reading a
measured curve out of a store and storing a fit (``calibrations``, ``calibration_points``)
is :mod:`etstore.app.calibrate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

__all__ = ["Calibration", "FitParameter", "MeasuredCurve"]


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
