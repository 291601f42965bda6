"""Every run a store records, one row each: simulations, measured runs, tuner runs, calibrations.

Each lives in its own warehouse tables (``runs``, ``measured_runs``, ``tuner_runs``,
``calibrations``; ``docs/simulator.md``, ``docs/measured.md``); ``etstore runs`` and the
report's run ids need one list of them, with what each run is in a line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from etstore.errors import OptionError

if TYPE_CHECKING:
    import pyarrow as pa

    from etstore.store.base import Store

__all__ = ["RUN_KINDS", "list_runs"]

_QUERIES = {
    "sim": """SELECT 'sim' AS kind, run_id AS id, trace AS name,
        concat_ws(', ', topology, congestion, printf('%.3f ms', total_ns / 1e6),
                  printf('%d sim ops', sim_ops)) AS summary,
        created_at FROM runs""",
    "measured": """SELECT 'measured' AS kind, run_id AS id, name,
        concat_ws(', ', concat_ws(' ', tool, collective), printf('%d ranks', ranks),
                  printf('%d rows', rows), printf('avg busbw %.2f GB/s', avg_busbw_gb_per_s)) AS summary,
        created_at FROM measured_runs""",
    "tuner": """SELECT 'tuner' AS kind, run_id AS id, name,
        concat_ws(', ', format, printf('%d steps', rows), printf('%d linked to traces', linked)) AS summary,
        created_at FROM tuner_runs""",
    "calibration": """SELECT 'calibration' AS kind, calibration_id AS id, name,
        concat_ws(', ', concat('of ', measured_run), spec,
                  printf('RMS error %.1f%% -> %.1f%%', rms_error_before_pct, rms_error_after_pct)) AS summary,
        created_at FROM calibrations""",
}

RUN_KINDS: tuple[str, ...] = tuple(_QUERIES)
"""What a run can be: a simulation, a measured nccl-tests run, a tuner trajectory, a calibration."""


def list_runs(store: Store, kinds: tuple[str, ...] | None = None) -> pa.Table:
    """The store's runs, oldest first: ``kind``, ``id``, ``name``, ``summary``, ``created_at``.

    Parameters
    ----------
    store
        An open store (either backend; read-only is enough).
    kinds
        Which of :data:`RUN_KINDS` to list (default: all).

    Returns
    -------
    pyarrow.Table
        One row per run; ``id`` is what ``etstore report`` (simulations) or the run's own
        tables (``run_id``, ``calibration_id``) know it by.

    Raises
    ------
    OptionError
        A kind that is not one of :data:`RUN_KINDS`.

    Notes
    -----
    One SQL query over the four run tables, O(runs).
    """
    chosen = RUN_KINDS if kinds is None else kinds
    unknown = [k for k in chosen if k not in _QUERIES]
    if unknown:
        raise OptionError(f"unknown run kind {unknown[0]!r}: expected one of {', '.join(RUN_KINDS)}")
    query = " UNION ALL ".join(f"({_QUERIES[k]})" for k in chosen)
    return store.sql(f"SELECT * FROM ({query}) ORDER BY created_at, kind, id").to_arrow()
