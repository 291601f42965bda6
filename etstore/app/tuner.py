"""Tuner runs: a parsed trajectory into ``tuner_runs``/``tuner_steps``, so ``TunerStep`` graph nodes.

One file is one run: a ``tuner_runs`` row and one ``tuner_steps`` row per logged call,
written in one warehouse transaction; the graph has one ``(:TunerStep)`` node per call so
Cypher reaches the steps too (the embedded store's graph index derives them from the rows;
``etstore publish`` sends them to a server). Storing the same bytes again returns the run
already stored (the content hash decides, as for measured runs). Each step is linked to the stored
algorithm trace its action ran (:func:`link_steps`), and its node's ``trace_id`` equals
``Op.trace_id`` of that trace's ops, so ``MATCH (s:TunerStep), (o:Op) WHERE
o.trace_id = s.trace_id`` joins a step to the DAG it ran, in a store and on a server.

The tables and views are declared here (:data:`TUNER_TABLES`) and documented in
``docs/measured.md``; the node table in :data:`~etstore.store.graph.TUNER_STEP_NODE_DDL`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from etstore.collective import short_name
from etstore.errors import UnknownTraceError
from etstore.formats.tuner import TunerLog
from etstore.store.base import Store
from etstore.store.tables import TableSet
from etstore.store.warehouse import Warehouse

__all__ = [
    "SIZE_BUCKET_SQL",
    "TUNER_TABLES",
    "TunerReport",
    "link_steps",
    "remove_tuner_run",
    "store_tuner_run",
]

log = logging.getLogger(__name__)

_TABLES = {
    "tuner_runs": """CREATE TABLE IF NOT EXISTS tuner_runs (
        run_id BIGINT PRIMARY KEY, name VARCHAR NOT NULL UNIQUE, source VARCHAR,
        content_hash VARCHAR NOT NULL, format VARCHAR, fields VARCHAR, rows BIGINT, linked BIGINT,
        created_at TIMESTAMP DEFAULT (now()::TIMESTAMP))""",
    "tuner_steps": """CREATE TABLE IF NOT EXISTS tuner_steps (
        run_id BIGINT NOT NULL, step BIGINT NOT NULL, line INTEGER, collective VARCHAR, size_bytes BIGINT,
        ranks INTEGER, nodes INTEGER, topology VARCHAR, gpu_model VARCHAR, algorithm VARCHAR,
        protocol VARCHAR, channels INTEGER, chunk_bytes BIGINT, algorithm_trace VARCHAR, trace VARCHAR,
        trace_rule VARCHAR, time_us DOUBLE, busbw_gb_per_s DOUBLE, reward DOUBLE, extra VARCHAR)""",
}

# A step's size bucket is the power of two at or below its size (0 for empty messages).
_SIZE_BUCKET = "CASE WHEN s.size_bytes > 0 THEN 1::BIGINT << floor(log2(s.size_bytes))::INTEGER ELSE 0 END"
SIZE_BUCKET_SQL = _SIZE_BUCKET
"""SQL of a row's size bucket as ``v_tuner_best`` has it (the row's alias is ``s``), so what else
buckets sizes (:mod:`etstore.app.tuner_config`) agrees with the view."""

_VIEWS: dict[str, str] = {
    "v_tuner_best": f"""CREATE OR REPLACE VIEW v_tuner_best AS
        WITH per_action AS (
            SELECT s.run_id, r.name AS run, s.topology, s.collective, {_SIZE_BUCKET} AS size_bucket_bytes,
                s.algorithm, s.protocol, s.channels, s.chunk_bytes, s.trace, count(*) AS steps,
                median(s.time_us) AS median_time_us, median(s.busbw_gb_per_s) AS median_busbw_gb_per_s
            FROM tuner_steps s JOIN tuner_runs r USING (run_id) GROUP BY ALL)
        SELECT *, count(*) OVER bucket AS actions_tried, sum(steps) OVER bucket AS bucket_steps
        FROM per_action
        WINDOW bucket AS (PARTITION BY run_id, topology, collective, size_bucket_bytes)
        QUALIFY row_number() OVER (PARTITION BY run_id, topology, collective, size_bucket_bytes
            ORDER BY median_time_us, algorithm, protocol, channels, chunk_bytes, trace) = 1""",
    "v_tuner_vs_sim": """CREATE OR REPLACE VIEW v_tuner_vs_sim AS
        WITH per_algorithm AS (
            SELECT sweep_id, topology, congestion, collective, num_npus, size_bytes, algorithm,
                min(time_ns) AS time_ns
            FROM sweep_points GROUP BY ALL),
        fastest AS (
            SELECT sweep_id, topology, congestion, collective, num_npus, size_bytes,
                arg_min(algorithm, time_ns) AS sim_fastest, min(time_ns) / 1e3 AS sim_fastest_us,
                count(*) AS sim_algorithms
            FROM per_algorithm GROUP BY ALL),
        joined AS (
            SELECT s.run_id, r.name AS run, s.step, s.collective, s.size_bytes, s.ranks, s.topology,
                coalesce(s.algorithm, s.trace) AS picked, s.algorithm, s.trace, s.time_us,
                f.sweep_id, f.topology AS sim_topology, f.congestion, f.sim_algorithms, f.sim_fastest,
                f.sim_fastest_us,
                (SELECT min(p.time_ns) FROM per_algorithm p
                 WHERE p.sweep_id = f.sweep_id AND p.topology IS NOT DISTINCT FROM f.topology
                    AND p.congestion IS NOT DISTINCT FROM f.congestion AND p.collective = f.collective
                    AND p.num_npus = f.num_npus AND p.size_bytes = f.size_bytes
                    AND (lower(p.algorithm) = lower(s.algorithm) OR p.algorithm = s.trace)
                ) / 1e3 AS sim_picked_us
            FROM tuner_steps s JOIN tuner_runs r USING (run_id)
            JOIN fastest f
                ON f.collective = s.collective AND f.num_npus = s.ranks AND f.size_bytes = s.size_bytes)
        SELECT *,
            CASE WHEN sim_picked_us IS NOT NULL
                THEN coalesce(lower(sim_fastest) = lower(algorithm), false)
                    OR coalesce(sim_fastest = trace, false) END AS picked_is_fastest
        FROM joined""",
}
TUNER_TABLES = TableSet("tuner", _TABLES, _VIEWS, requires=("runs",))
"""The tuner-trajectory tables and views: the best action per size bucket (``v_tuner_best``)
and each step beside the simulator's sweeps of the same collective, ranks and size
(``v_tuner_vs_sim``, which reads ``sweep_points``: it requires the ``runs`` set); columns in
``docs/measured.md``."""


@dataclass(frozen=True)
class TunerReport:
    """What storing one trajectory did: its run id and name, whether it was new, what it holds."""

    run_id: int
    name: str
    created: bool
    rows: int
    linked: int
    source: str

    def as_row(self) -> dict[str, Any]:
        """JSON-able dict (the ingest summary's row)."""
        return {
            "tuner_run": self.name,
            "run_id": self.run_id,
            "status": "new" if self.created else "already stored",
            "rows": self.rows,
            "linked": self.linked,
        }


def store_tuner_run(store: Store, parsed: TunerLog, *, name: str | None = None) -> TunerReport:
    """Store one parsed trajectory as a tuner run, all or nothing; the same bytes twice store once.

    Parameters
    ----------
    store
        A writable store: the rows go to its warehouse, from which its graph index
        derives the ``TunerStep`` nodes.
    parsed
        What :func:`~etstore.formats.tuner.read_tuner_log` returned.
    name
        The run's name (default: ``parsed.name``, or ``parsed.name-2``, ``-3``, ... when
        another file holds it); an explicit name held by another file is an error.

    Returns
    -------
    TunerReport
        The stored run (``created`` is False when a file with the same content hash was
        already stored; its name is then the stored one). ``linked`` counts the steps
        linked to a stored algorithm trace.

    Raises
    ------
    StoreError
        ``name`` is held by a file with other content, or the engine refuses the rows
        (a read-only store); nothing is left behind.

    Notes
    -----
    O(steps + stored algorithm traces): one columnar insert per table; the graph index
    loads the nodes with one bulk ``COPY`` from Arrow (100,000 steps in about 0.4 s) when
    it next catches up.
    """
    warehouse = store.warehouse
    with warehouse.transaction():
        warehouse.ensure(TUNER_TABLES)
        found = warehouse.query(
            "SELECT run_id, name, rows, linked FROM tuner_runs WHERE content_hash = $h "
            "ORDER BY run_id LIMIT 1",
            {"h": parsed.content_hash},
        ).to_pylist()
        if found:
            row = found[0]
            return TunerReport(
                int(row["run_id"]),
                str(row["name"]),
                False,
                int(row["rows"]),
                int(row["linked"]),
                parsed.source,
            )
        wanted = name or parsed.name
        clash = f"tuner run {wanted!r} already holds another file; choose another name"
        chosen = warehouse.unused_name("tuner_runs", wanted, explicit=name is not None, clash=clash)
        run_id = warehouse.next_id("tuner_runs", "run_id")
        steps = link_steps(warehouse, parsed.steps)
        linked = steps.num_rows - steps["trace"].null_count
        warehouse.append(
            "tuner_runs",
            pa.Table.from_pylist([{**parsed.run_row(), "name": chosen, "run_id": run_id, "linked": linked}]),
        )
        warehouse.append("tuner_steps", _with_run(steps, run_id))
    log.debug(
        "stored tuner run %s (%d steps, %d linked) from %s", chosen, steps.num_rows, linked, parsed.source
    )
    return TunerReport(run_id, chosen, True, steps.num_rows, linked, parsed.source)


def remove_tuner_run(store: Store, name: str) -> None:
    """Remove tuner run ``name``: its rows (and so, once the graph index catches up, its
    ``TunerStep`` nodes).

    Raises
    ------
    UnknownTraceError
        No tuner run has that name.
    StoreError
        An engine refuses the removal (a read-only store).

    Notes
    -----
    O(steps of the run), in one transaction.
    """
    warehouse = store.warehouse
    found = warehouse.query(
        "SELECT run_id, content_hash FROM tuner_runs WHERE name = $n", {"n": name}
    ).to_pylist()
    if not found:
        raise UnknownTraceError(f"no tuner run named {name!r} in {store.location}")
    run_id = int(found[0]["run_id"])
    with warehouse.transaction():
        warehouse.execute("DELETE FROM tuner_steps WHERE run_id = $r", {"r": run_id})
        warehouse.execute("DELETE FROM tuner_runs WHERE run_id = $r", {"r": run_id})


def link_steps(warehouse: Warehouse, steps: pa.Table) -> pa.Table:
    """``steps`` with ``trace`` and ``trace_rule``: the stored algorithm trace each action ran.

    The first rule that finds a trace of kind ``algorithm`` in the warehouse's ``traces``
    decides (``trace_rule`` says which):

    ``named``
        ``algorithm_trace`` is its name, or else ``algorithm`` is (exactly).
    ``matched``
        Its collective (``params.collective``) is the step's, its ``ranks`` the step's,
        and the step's ``algorithm`` equals, ignoring case, its generator
        (``params.generator``: ``ring``, ``tree``, ...), its MSCCL-IR name
        (``params.algo_name``) or its name; of several, the first by name.

    A step no rule links gets null in both.

    Parameters
    ----------
    warehouse
        The warehouse holding ``traces``.
    steps
        Rows of :data:`~etstore.formats.tuner.TUNER_STEP_SCHEMA`.

    Returns
    -------
    pyarrow.Table
        ``steps`` with ``trace`` and ``trace_rule`` inserted after ``algorithm_trace``.

    Notes
    -----
    O(steps × algorithm traces) in DuckDB (hash joins on names, one filtered join for
    the match); the link is made when the run is stored.
    """
    shorts = pa.array([short_name(c) for c in steps["collective"].to_pylist()], pa.string())
    probe = pa.table(
        {
            "step": steps["step"],
            "coll": shorts,
            "ranks": steps["ranks"],
            "algorithm": steps["algorithm"],
            "algorithm_trace": steps["algorithm_trace"],
        }
    )
    with warehouse.registered(_etstore_tuner_probe=probe):
        links = warehouse.query(_LINK_SQL).to_arrow()
    trace, rule = links["trace"], links["trace_rule"]
    at = steps.schema.get_field_index("algorithm_trace") + 1
    return steps.add_column(at, "trace", trace.cast(pa.string())).add_column(
        at + 1, "trace_rule", rule.cast(pa.string())
    )


_LINK_SQL = """
WITH algos AS (
    SELECT name, ranks, lower(params->>'collective') AS coll, lower(params->>'generator') AS generator,
        lower(params->>'algo_name') AS algo_name
    FROM traces WHERE kind = 'algorithm'),
by_name AS (
    SELECT p.step, coalesce(min(a.name) FILTER (WHERE a.name = p.algorithm_trace),
                            min(a.name) FILTER (WHERE a.name = p.algorithm)) AS trace
    FROM _etstore_tuner_probe p JOIN algos a ON a.name IN (p.algorithm_trace, p.algorithm)
    GROUP BY p.step),
by_match AS (
    SELECT p.step, min(a.name) AS trace
    FROM _etstore_tuner_probe p JOIN algos a
      ON a.coll = p.coll AND a.ranks = p.ranks
     AND lower(p.algorithm) IN (a.generator, a.algo_name, lower(a.name))
    GROUP BY p.step)
SELECT coalesce(n.trace, m.trace) AS trace,
    CASE WHEN n.trace IS NOT NULL THEN 'named' WHEN m.trace IS NOT NULL THEN 'matched' END AS trace_rule
FROM _etstore_tuner_probe p LEFT JOIN by_name n USING (step) LEFT JOIN by_match m USING (step)
ORDER BY p.step
"""


def _with_run(steps: pa.Table, run_id: int) -> pa.Table:
    return steps.add_column(0, "run_id", pa.array([run_id] * steps.num_rows, pa.int64()))
