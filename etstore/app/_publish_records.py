"""What ``etstore publish`` sends of a store's runs and metrics: one node per run, its summary rows.

Each kind is a node label keyed by ``key``: a hash of the run's identifying columns as the
store holds them (``content_hash`` where the run has one), so the same run published twice,
or from two copies of a store, is one node. Child rows hang off their run by a relationship
and are written with it, in one transaction; links to ``Trace`` nodes and other runs are
made when both ends are on the server (again on every publish, for traces published since).
``docs/neo4j.md`` ("Publishing to Neo4j") documents the shape for dashboards.

Left out: a run's per-op timings (``op_timings``, as many rows as the trace has ops, per
run); ``link_util`` and ``collectives`` go as summaries (per run, and per collective type,
algorithm, group size and size).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from etstore.store._neo4j_runs import Children, RecordSet
from etstore.store.graph import TUNER_STEP_PROPERTIES
from etstore.store.warehouse import Warehouse

__all__ = ["RECORD_KINDS", "RecordKind", "read_records"]


def _run_key(r: str) -> str:
    """A simulation run's key: what makes it that run, whatever store holds it."""
    return f"md5(CAST(({r}.run_id, {r}.trace, {r}.created_at, {r}.total_ns, {r}.params) AS VARCHAR))"


@dataclass(frozen=True)
class RecordKind:
    """One kind of record: its label, its rows (SQL with a ``key`` column), children, links."""

    label: str
    sql: str
    children: tuple[tuple[str, str, str], ...] = ()  # (label, relationship, SQL with a parent column)
    links: tuple[str, ...] = ()  # Cypher over $keys (new or this store's records) and $store
    traces: tuple[str, ...] = ()  # columns naming the traces a record is about (publish --trace)


# MERGE, not CREATE: it locks both ends before it looks again, so two publishers linking one
# record at once make one relationship
_OF_TRACE = (
    "UNWIND $keys AS k MATCH (n:{label} {{key: k}}) WHERE NOT (n)-[:{rel}]->(:Trace) "
    "MATCH (t:Trace {{name: n.{column}, store: $store}}) MERGE (n)-[:{rel}]->(t) "
    "ON CREATE SET n.trace_id = t.trace_id"
)

_SWEEPS = """SELECT sweep_id, count(*) AS points,
        string_agg(DISTINCT collective, ',' ORDER BY collective) AS collectives,
        string_agg(DISTINCT topology, ',' ORDER BY topology) AS topologies,
        md5(string_agg(CAST((topology, num_npus, collective, algorithm, congestion, size_bytes, time_ns,
            events, wall_s, params) AS VARCHAR), ';' ORDER BY topology, num_npus, collective, algorithm,
            congestion, size_bytes, time_ns)) AS key
    FROM sweep_points GROUP BY sweep_id"""
"""A bus-bandwidth sweep as one row, keyed by a hash of its points."""

RECORD_KINDS: tuple[RecordKind, ...] = (
    RecordKind(
        "Run",
        f"""SELECT {_run_key("r")} AS key, r.run_id, r.trace, r.topology, r.num_npus, r.congestion,
            r.scheduling_policy, r.params, r.total_ns, r.wall_s, r.loop_s, r.events, r.events_per_s,
            r.num_ops, r.sim_ops, r.created_at, l.links, l.link_bytes, l.max_link_utilization,
            l.mean_link_utilization
        FROM runs r LEFT JOIN (
            SELECT run_id, count(*) AS links, sum(bytes) AS link_bytes,
                max(utilization) AS max_link_utilization, avg(utilization) AS mean_link_utilization
            FROM link_util GROUP BY run_id) l ON l.run_id = r.run_id
        ORDER BY r.run_id""",
        children=(
            (
                "CollectiveStat",
                "COLLECTIVE",
                f"""SELECT {_run_key("r")} AS parent, c.comm_type, c.algorithm, c.group_size, c.size_bytes,
                    count(*) AS count, avg(c.time_ns) AS time_ns, min(c.time_ns) AS min_time_ns,
                    max(c.time_ns) AS max_time_ns, sum(c.time_ns) AS total_time_ns,
                    avg(c.algbw_gb_per_s) AS algbw_gb_per_s, avg(c.busbw_gb_per_s) AS busbw_gb_per_s,
                    min(c.busbw_gb_per_s) AS min_busbw_gb_per_s, max(c.busbw_gb_per_s) AS max_busbw_gb_per_s
                FROM collectives c JOIN runs r ON r.run_id = c.run_id
                GROUP BY ALL ORDER BY ALL""",
            ),
            (
                "RankTime",
                "RANK",
                f"""SELECT {_run_key("r")} AS parent, b.rank, b.total_ns, b.compute_ns, b.comm_ns,
                    b.exposed_comm_ns, b.overlap_ns, b.idle_ns
                FROM rank_breakdown b JOIN runs r ON r.run_id = b.run_id ORDER BY b.run_id, b.rank""",
            ),
        ),
        links=(_OF_TRACE.format(label="Run", rel="OF", column="trace"),),
        traces=("trace",),
    ),
    RecordKind(
        "Comparison",
        f"""SELECT md5(CAST((c.comparison_id, c.trace_a, c.trace_b, c.created_at) AS VARCHAR)) AS key,
            c.comparison_id, c.trace_a, c.trace_b, c.run_a, c.run_b, c.topology, c.congestion,
            c.total_a_ns, c.total_b_ns, c.diff_ns, c.speedup, c.exposed_comm_a_ns, c.exposed_comm_b_ns,
            c.idle_a_ns, c.idle_b_ns, c.overlap_a_ns, c.overlap_b_ns, c.created_at,
            {_run_key("ra")} AS run_a_key, {_run_key("rb")} AS run_b_key
        FROM comparisons c LEFT JOIN runs ra ON ra.run_id = c.run_a LEFT JOIN runs rb ON rb.run_id = c.run_b
        WHERE c.rank IS NULL ORDER BY c.comparison_id""",
        children=(
            (
                "ComparisonRank",
                "RANK",
                """SELECT md5(CAST((t.comparison_id, t.trace_a, t.trace_b, t.created_at) AS VARCHAR))
                    AS parent, c.rank, c.total_a_ns, c.total_b_ns, c.diff_ns, c.speedup, c.exposed_comm_a_ns,
                    c.exposed_comm_b_ns, c.idle_a_ns, c.idle_b_ns, c.overlap_a_ns, c.overlap_b_ns
                FROM comparisons c JOIN comparisons t ON t.comparison_id = c.comparison_id AND t.rank IS NULL
                WHERE c.rank IS NOT NULL ORDER BY c.comparison_id, c.rank""",
            ),
        ),
        links=(
            "UNWIND $keys AS k MATCH (n:Comparison {key: k}) WHERE NOT (n)-[:A]->() "
            "MATCH (r:Run {key: n.run_a_key}) MERGE (n)-[:A]->(r)",
            "UNWIND $keys AS k MATCH (n:Comparison {key: k}) WHERE NOT (n)-[:B]->() "
            "MATCH (r:Run {key: n.run_b_key}) MERGE (n)-[:B]->(r)",
        ),
        traces=("trace_a", "trace_b"),
    ),
    RecordKind(
        "Opportunity",
        """SELECT DISTINCT md5(CAST((trace, kind, rank, op_id, other_id, gain_ns, detail, id)
                AS VARCHAR)) AS key, trace, kind, rank, op_id, other_id, gain_ns, detail, id
        FROM opportunities ORDER BY trace, id, key""",
        links=(_OF_TRACE.format(label="Opportunity", rel="IN", column="trace"),),
        traces=("trace",),
    ),
    RecordKind(
        "MeasuredRun",
        "SELECT content_hash AS key, * FROM measured_runs ORDER BY run_id",
        children=(
            (
                "Measurement",
                "POINT",
                """SELECT m.content_hash AS parent, x.* EXCLUDE (run_id)
                FROM measurements x JOIN measured_runs m ON m.run_id = x.run_id ORDER BY x.run_id, x.line""",
            ),
        ),
    ),
    RecordKind(
        "TunerRun",
        """SELECT content_hash AS key, run_id, name, source, content_hash, format, fields, rows, linked,
            created_at FROM tuner_runs ORDER BY run_id""",
        children=(
            (
                "TunerStep",
                "STEP",
                "SELECT r.content_hash AS parent, "
                + ", ".join(
                    {
                        "uid": "(s.run_id * 4294967296 + s.step) AS uid",
                        "run": "r.name AS run",
                        "content_hash": "r.content_hash",
                        "trace_id": "NULL::BIGINT AS trace_id",
                    }.get(c, f"s.{c}")
                    for c in TUNER_STEP_PROPERTIES
                )
                + ", s.trace FROM tuner_steps s JOIN tuner_runs r ON r.run_id = s.run_id "
                "ORDER BY s.run_id, s.step",
            ),
        ),
        links=(
            "UNWIND $keys AS k MATCH (:TunerRun {key: k})-[:STEP]->(s:TunerStep) WHERE s.trace IS NOT NULL "
            "MATCH (t:Trace {name: s.trace, store: $store}) "
            "WHERE s.trace_id IS NULL OR s.trace_id <> t.trace_id SET s.trace_id = t.trace_id",
        ),
    ),
    RecordKind(
        "Calibration",
        """SELECT md5(CAST((calibration_id, name, created_at) AS VARCHAR)) AS key, *
        FROM calibrations ORDER BY calibration_id""",
        children=(
            (
                "CalibrationPoint",
                "POINT",
                """SELECT md5(CAST((c.calibration_id, c.name, c.created_at) AS VARCHAR)) AS parent,
                    p.* EXCLUDE (calibration_id)
                FROM calibration_points p JOIN calibrations c ON c.calibration_id = p.calibration_id
                ORDER BY p.calibration_id, p.size_bytes""",
            ),
        ),
    ),
    RecordKind(
        "Sweep",
        f"SELECT key, sweep_id, points, collectives, topologies FROM ({_SWEEPS}) ORDER BY sweep_id",
        children=(
            (
                "SweepPoint",
                "POINT",
                f"""SELECT s.key AS parent, p.* EXCLUDE (sweep_id)
                FROM sweep_points p JOIN ({_SWEEPS}) s ON s.sweep_id = p.sweep_id
                ORDER BY p.sweep_id, p.topology, p.collective, p.algorithm, p.size_bytes""",
            ),
        ),
    ),
)
"""Every kind of record publish sends, in the order it sends them (runs before what links to them)."""


def read_records(
    wh: Warehouse, kind: RecordKind, traces: Collection[str] | None
) -> tuple[RecordSet, list[str]]:
    """``kind``'s records to send (those about ``traces`` when given; then none of a kind that is
    about no trace) and the keys of every record of that kind the store holds."""
    rows = wh.query(kind.sql).to_pylist()
    seen: dict[str, dict[str, object]] = {}
    for row in rows:
        seen.setdefault(str(row["key"]), row)
    every = list(seen)
    if traces is not None:
        chosen = [r for r in seen.values() if kind.traces and any(r.get(c) in traces for c in kind.traces)]
    else:
        chosen = list(seen.values())
    wanted = {str(r["key"]) for r in chosen}
    children = []
    for label, rel, sql in kind.children:  # every kind of child, rows or none: pruning needs the shape
        by_parent: dict[str, list[dict[str, object]]] = {}
        for row in wh.query(sql).to_pylist() if wanted else ():
            parent = str(row.pop("parent"))
            if parent in wanted:
                by_parent.setdefault(parent, []).append(row)
        children.append(Children(label, rel, by_parent))
    return RecordSet(kind.label, chosen, tuple(children), kind.links), every
