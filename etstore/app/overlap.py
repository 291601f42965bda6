"""Find overlap, chunk and reorder opportunities in a stored trace, with estimated gains.

Three finders (``docs/overlap.md`` has the worked 2-rank example):

``overlap`` (coarse)
    Per collective ``C``: the compute ops on its rank that do not need ``C``'s data
    (neither ancestor nor descendant of ``C`` in the rank's *data*-dependency DAG)
    but wait for it through ctrl (issue-order) edges. Gain: ``min(C's simulated time,
    their total simulated duration)`` — the time they could hide under ``C``.
``chunk``
    On an expanded trace: a compute op consuming one expanded collective's output,
    whose chunks arrive at different times. Split into pieces (one per group of
    chunk slots, at most ``max_pieces``, each ≥ 1 µs) it could start when the first
    chunk lands. Gain: simulated end − end of the pipelined pieces.
``reorder``
    Per send or collective ``S``: the compute ops ahead of it in issue order (ctrl
    edges) whose data it does not need. Gain: how much earlier ``S`` could issue —
    its simulated ready time − the latest end among the predecessors it keeps.

Candidates come from Cypher on the graph (the edge shapes above; lineage
``BECOMES`` edges for chunks); what each pass frees comes from the passes themselves
(:mod:`etstore.analysis._finders` runs :mod:`etstore.analysis._rankgraph`, the same code the
rewrites use, so what is found is what gets applied); timings and gains come from SQL over
the simulated op timings.
:func:`explain` lists every query. Nothing is written: :mod:`etstore.app.opportunities`
records what is found in DuckDB table ``opportunities``
(:data:`~etstore.app.opportunities.OPPORTUNITY_TABLES`), replacing the trace's earlier rows.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.algorithms._instances import find_collectives
from etstore.analysis._finders import chunk_rows, freed_pairs
from etstore.analysis._gains import measure_gains
from etstore.analysis.hoists import find_hoists
from etstore.analysis.lane_split import find_splits
from etstore.analysis.split import SplitCost
from etstore.errors import EtstoreError, OptionError, UnknownTraceError
from etstore.model import Trace
from etstore.progress import ProgressFn, in_phase
from etstore.sim import SimConfig, simulate
from etstore.sim.engine import RECORDED
from etstore.store.base import Store
from etstore.topology import Topology, default_topology, parse_topology

__all__ = [
    "CHUNK_CONSUMERS_CYPHER",
    "EXPANSIONS_SQL",
    "OPPORTUNITIES_SCHEMA",
    "OPPORTUNITY_KINDS",
    "OVERLAP_GAIN_SQL",
    "OVERLAP_SEEDS_CYPHER",
    "REORDER_GAIN_SQL",
    "REORDER_SEEDS_CYPHER",
    "TIMINGS_SQL",
    "expansions_of",
    "explain",
    "find_opportunities",
    "opportunity_timings",
]

log = logging.getLogger(__name__)

OPPORTUNITY_KINDS = ("overlap", "chunk", "reorder")

OPPORTUNITIES_SCHEMA = pa.schema(
    [
        ("trace", pa.string()),
        ("kind", pa.string()),
        ("rank", pa.int32()),
        ("op_id", pa.uint64()),
        ("other_id", pa.uint64()),
        ("gain_ns", pa.float64()),
        ("detail", pa.string()),
        ("id", pa.int32()),
    ]
)

# --- Cypher: candidate shapes on the graph
OVERLAP_SEEDS_CYPHER = """\
MATCH (t:Trace {name: $trace}), (c:Op)-[d:DEP]->(x:Op)
WHERE c.trace_id = t.trace_id AND c.type = 'COMM_COLL_NODE' AND x.type = 'COMP_NODE' AND d.kind = 'ctrl'
RETURN DISTINCT c.rank AS rank"""

REORDER_SEEDS_CYPHER = """\
MATCH (t:Trace {name: $trace}), (x:Op)-[d:DEP]->(s:Op)
WHERE s.trace_id = t.trace_id AND s.type IN ['COMM_SEND_NODE', 'COMM_COLL_NODE'] AND x.type = 'COMP_NODE'
  AND d.kind = 'ctrl'
RETURN DISTINCT s.rank AS rank"""

CHUNK_CONSUMERS_CYPHER = """\
MATCH (t:Trace {name: $trace}), (c:Op)-[:BECOMES]->(e:Op)-[:DEP]->(x:Op)
WHERE e.trace_id = t.trace_id AND c.type = 'COMM_COLL_NODE' AND x.type = 'COMP_NODE'
  AND NOT EXISTS { MATCH (c)-[:BECOMES]->(x) }
RETURN DISTINCT e.rank AS rank, c.id AS coll_id, x.id AS consumer_id"""

# --- SQL: lineage, timings and gains
EXPANSIONS_SQL = """\
SELECT l.rank, l.id, l.parent_id AS coll_id, l.parent_trace
FROM lineage l
JOIN ops p ON p.trace = l.parent_trace AND p.rank = l.rank AND p.id = l.parent_id
WHERE l.trace = $trace AND p.type = 'COMM_COLL_NODE'"""

TIMINGS_SQL = """\
SELECT rank, id, ready_ns, start_ns, end_ns FROM op_timings
WHERE run_id = $run AND trace = $trace"""

# _etstore_pairs(rank, coll_id, compute_id, compute_row): compute freed from a collective
OVERLAP_GAIN_SQL = """\
SELECT p.rank, p.coll_id AS op_id, arg_min(p.compute_id, p.compute_row) AS other_id,
       least(any_value(tc.end_ns - tc.start_ns), sum(tx.end_ns - tx.start_ns)) AS gain_ns,
       any_value(tc.end_ns - tc.start_ns) AS collective_ns,
       sum(tx.end_ns - tx.start_ns) AS compute_ns,
       list(p.compute_id ORDER BY p.compute_row) AS compute_ids
FROM _etstore_pairs p
JOIN _etstore_timings tc ON tc.rank = p.rank AND tc.id = p.coll_id
JOIN _etstore_timings tx ON tx.rank = p.rank AND tx.id = p.compute_id
GROUP BY p.rank, p.coll_id
ORDER BY p.rank, p.coll_id"""

# _etstore_pairs(rank, comm_id, compute_id, compute_row): compute a send/collective passes;
# _etstore_preds(rank, comm_id, pred_id): its predecessors after the reorder
REORDER_GAIN_SQL = """\
WITH kept AS (
  SELECT k.rank, k.comm_id, max(tp.end_ns) AS ready_ns
  FROM _etstore_preds k JOIN _etstore_timings tp ON tp.rank = k.rank AND tp.id = k.pred_id
  GROUP BY k.rank, k.comm_id)
SELECT p.rank, p.comm_id AS op_id, arg_max(p.compute_id, p.compute_row) AS other_id,
       greatest(any_value(ts.ready_ns) - coalesce(any_value(kept.ready_ns), 0), 0) AS gain_ns,
       any_value(ts.ready_ns) AS issued_ns, coalesce(any_value(kept.ready_ns), 0) AS ready_ns,
       list(p.compute_id ORDER BY p.compute_row) AS compute_ids
FROM _etstore_pairs p
JOIN _etstore_timings ts ON ts.rank = p.rank AND ts.id = p.comm_id
LEFT JOIN kept ON kept.rank = p.rank AND kept.comm_id = p.comm_id
GROUP BY p.rank, p.comm_id
ORDER BY p.rank, p.comm_id"""


def explain() -> list[tuple[str, str, str]]:
    """Every query the finders run: ``(finder, engine, text)`` (recording them adds
    :func:`etstore.app.opportunities.explain`'s)."""
    return [
        ("overlap", "cypher", OVERLAP_SEEDS_CYPHER),
        ("overlap", "sql", OVERLAP_GAIN_SQL),
        ("chunk", "sql", EXPANSIONS_SQL),
        ("chunk", "cypher", CHUNK_CONSUMERS_CYPHER),
        ("reorder", "cypher", REORDER_SEEDS_CYPHER),
        ("reorder", "sql", REORDER_GAIN_SQL),
        ("timings", "sql", TIMINGS_SQL),
    ]


def opportunity_timings(
    store: Store,
    trace: Trace,
    *,
    topo: Topology | str | None = None,
    config: SimConfig | None = None,
    run_id: int | None = None,
) -> pa.Table:
    """Per-op ``rank, id, ready_ns, start_ns, end_ns`` of ``trace``: from run ``run_id``
    in DuckDB (:data:`TIMINGS_SQL`), else from a fresh simulation on ``topo`` (a
    :class:`~etstore.topology.Topology` or spec; default :func:`~etstore.topology.default_topology`).

    Raises
    ------
    UnknownTraceError
        ``run_id`` has no timings of this trace.
    TopologyError, SimulationError
        A bad topology, or a trace that cannot be replayed.
    """
    if run_id is not None:
        t = store.sql(TIMINGS_SQL, {"run": int(run_id), "trace": trace.name}).to_arrow()
        if t.num_rows == 0:
            raise UnknownTraceError(f"run {run_id} has no op timings of trace {trace.name!r}")
        return t
    topology = topo if isinstance(topo, Topology) else parse_topology(topo or default_topology(trace))
    res = simulate(trace, topology, config=config)
    return res.ops.select(["rank", "id", "ready_ns", "start_ns", "end_ns"])


def _ranks(store: Store, query: str, trace: str) -> set[int]:
    return {int(r) for r in store.cypher(query, {"trace": trace}).to_arrow()["rank"].to_pylist()}


def _overlap_rows(
    store: Store, trace: Trace, timings: pa.Table, progress: ProgressFn | None = None
) -> list[dict[str, Any]]:
    seeds = _ranks(store, OVERLAP_SEEDS_CYPHER, trace.name)
    table, _ = freed_pairs(trace, seeds, "overlap", in_phase(progress, "overlap: ranks"))
    if table.num_rows == 0:
        return []
    with store.warehouse.registered(_etstore_pairs=table, _etstore_timings=timings):
        rows = store.warehouse.query(OVERLAP_GAIN_SQL).to_pylist()
    return _opportunity_rows("overlap", rows, ("collective_ns", "compute_ns", "compute_ids"))


def _opportunity_rows(kind: str, rows: list[dict[str, Any]], detail: tuple[str, ...]) -> list[dict[str, Any]]:
    """Gain-SQL rows with a positive gain as opportunity rows; ``detail`` columns go to ``detail``."""
    return [
        {
            "kind": kind,
            "rank": r["rank"],
            "op_id": r["op_id"],
            "other_id": r["other_id"],
            "gain_ns": float(r["gain_ns"]),
            "detail": {k: r[k] for k in detail},
        }
        for r in rows
        if r["gain_ns"] > 0
    ]


def _reorder_rows(
    store: Store, trace: Trace, timings: pa.Table, progress: ProgressFn | None = None
) -> list[dict[str, Any]]:
    seeds = _ranks(store, REORDER_SEEDS_CYPHER, trace.name)
    pair_table, pred_table = freed_pairs(trace, seeds, "reorder", in_phase(progress, "reorder: ranks"))
    if pair_table.num_rows == 0:
        return []
    with store.warehouse.registered(
        _etstore_pairs=pair_table, _etstore_preds=pred_table, _etstore_timings=timings
    ):
        rows = store.warehouse.query(REORDER_GAIN_SQL).to_pylist()
    return _opportunity_rows("reorder", rows, ("issued_ns", "ready_ns", "compute_ids"))


def expansions_of(store: Store, trace: str) -> pa.Table:
    """The expansion lineage of a stored trace (:data:`EXPANSIONS_SQL`: ``rank``, ``id``,
    ``coll_id``, ``parent_trace``) with what each collective is to its rank: ``coll_type``,
    ``group_pos`` (the rank's place in its group) and ``group_size``, from the parent's
    collective instances, so the chunk finder knows which slots are a rank's own output."""
    table = store.sql(EXPANSIONS_SQL, {"trace": trace}).to_arrow()
    if table.num_rows == 0:
        return table
    parent = store.load(str(table["parent_trace"][0].as_py()))
    colls = find_collectives(parent, None)
    info = pa.table(
        {
            "rank": pa.array(colls.rank).cast(table.schema.field("rank").type),
            "coll_id": pa.array(colls.ids).cast(table.schema.field("coll_id").type),
            "coll_type": pa.array([str(t) for t in colls.ctype.tolist()], pa.string()),
            "group_pos": pa.array(colls.apos, pa.int32()),
            "group_size": pa.array(colls.gsize[colls.pg_code], pa.int32()),
        }
    )
    info = info.group_by(["rank", "coll_id"], use_threads=False).aggregate(  # one row per op, the last
        [(c, "last") for c in ("coll_type", "group_pos", "group_size")]
    )
    rows = table.select(["rank", "coll_id"]).append_column("row", pa.array(np.arange(table.num_rows)))
    got = rows.join(info, ["rank", "coll_id"], join_type="left outer").sort_by("row")
    return (
        table.append_column("coll_type", pc.fill_null(got["coll_type_last"], ""))
        .append_column("group_pos", pc.fill_null(got["group_pos_last"], -1))
        .append_column("group_size", pc.fill_null(got["group_size_last"], 0))
    )


def _chunk_rows(
    store: Store,
    trace: Trace,
    timings: pa.Table,
    expansions: pa.Table,
    *,
    max_pieces: int,
    unit_ns: float,
    split: SplitCost,
    progress: ProgressFn | None = None,
) -> list[dict[str, Any]]:
    if expansions.num_rows == 0:
        return []
    cands = store.cypher(CHUNK_CONSUMERS_CYPHER, {"trace": trace.name}).to_arrow()
    wanted = set(zip(cands["rank"].to_pylist(), cands["consumer_id"].to_pylist(), strict=True))
    return chunk_rows(
        trace,
        timings,
        expansions,
        wanted,
        max_pieces=max_pieces,
        unit_ns=unit_ns,
        split=split,
        progress=in_phase(progress, "chunk: consumers"),
    )


def find_opportunities(
    store: Store,
    trace: str,
    *,
    topo: Topology | str | None = None,
    config: SimConfig | None = None,
    run_id: int | None = None,
    kinds: Sequence[str] = OPPORTUNITY_KINDS,
    max_pieces: int = 8,
    limit: int = 32,
    progress: ProgressFn | None = None,
    measure: bool = True,
    split: SplitCost | None = None,
) -> pa.Table:
    """Overlap, chunk and reorder opportunities of a stored trace, with their gains.

    Gains are measured: each opportunity is applied (on top of the ones of its kind taken
    before it) and the trace simulated again. A recorded trace (PyTorch ET + Kineto) has
    overlap opportunities, each a hoist in its lanes (:mod:`etstore.analysis.hoists`), and,
    expanded, chunk opportunities, a consumer split per chunk in its lane
    (:mod:`etstore.analysis.lane_split`), replayed on ``topo`` (default as it ran). Other
    traces get the three finders below,
    whose estimates choose what is measured (:mod:`etstore.analysis._gains`).

    Parameters
    ----------
    store
        An open store (embedded: Cypher on Ladybug, SQL on DuckDB).
    trace
        Name of the stored trace.
    topo
        Topology (object, spec or file) to simulate on; default
        :func:`~etstore.topology.default_topology`. Ignored with ``run_id``.
    config
        :class:`~etstore.sim.SimConfig` for the simulation (default ASTRA-sim's).
    run_id
        Take timings from this recorded run of ``trace`` instead of simulating.
    kinds
        Which finders to run (``overlap``, ``chunk``, ``reorder``).
    max_pieces
        Chunk finder: at most this many pieces per consumer.
    limit
        Measure at most this many opportunities per kind (largest estimates first; two
        simulations each).
    progress
        Called with (phase, done, total): ``overlap: ranks``, ``reorder: ranks`` and ``chunk:
        consumers`` as the finders go, then after each measurement.
    measure
        False: keep the finders' estimates (a quick look; not for a recording).
    split
        Chunk finder: what pieces cost, which ops split (:class:`~etstore.analysis.split.SplitCost`).

    Returns
    -------
    pa.Table
        :data:`OPPORTUNITIES_SCHEMA`: ``trace``, ``kind``, ``rank``, ``op_id`` (the
        collective, or the send/collective for reorder), ``other_id`` (overlap: the
        first freed compute op; chunk: the consumer; reorder: the compute op right
        ahead), ``gain_ns`` (> 0), ``detail`` (JSON: timings in ns and op ids),
        ``id`` (1, 2, ... in row order: what ``etstore rewrite --opportunity``
        takes). Ordered by kind, then in the order measured (largest estimate first); with
        ``measure=False``, by kind, rank, op_id.

    Raises
    ------
    UnknownTraceError
        No such trace (or run).
    EtstoreError
        An unknown kind; a dependency cycle; simulation or topology errors.

    Notes
    -----
    Per rank O(V + E) plus searches around the edges a pass changes (:mod:`etstore.analysis._reach`;
    a few ops each on a trace's ranks), plus one simulation O(events log V).
    """
    bad = [k for k in kinds if k not in OPPORTUNITY_KINDS]
    if bad:
        raise OptionError(f"unknown opportunity kind {bad[0]!r}; expected {', '.join(OPPORTUNITY_KINDS)}")
    tr = store.load(trace)
    rows: list[dict[str, Any]] = []
    if tr.params.get("execution") == RECORDED:  # its lanes, as recorded (expanded too)
        if run_id is not None and ("overlap" in kinds or "chunk" in kinds):
            raise OptionError(
                f"{trace!r} is a recording: its opportunities are measured by replaying it, not read "
                "from a run (leave out --run)"
            )
        rows = _recorded_rows(tr, topo, config, limit, progress, kinds, split or SplitCost(), max_pieces)
    else:
        topology = _measure_topology(store, tr, topo, run_id)
        base_ns = None
        if run_id is None:  # one simulation gives the finders their timings and the gains their base
            res = simulate(tr, topology, config=config)
            timings, base_ns = res.ops.select(["rank", "id", "ready_ns", "start_ns", "end_ns"]), res.total_ns
        else:
            timings = opportunity_timings(store, tr, run_id=run_id)
        cost = split or SplitCost()
        unit_ns = float((config or SimConfig()).duration_unit_ns)
        expansions = expansions_of(store, trace) if "chunk" in kinds else None
        if "overlap" in kinds:
            rows += _overlap_rows(store, tr, timings, progress)
        if expansions is not None:
            rows += _chunk_rows(
                store,
                tr,
                timings,
                expansions,
                max_pieces=max_pieces,
                unit_ns=unit_ns,
                split=cost,
                progress=progress,
            )
        if "reorder" in kinds:
            rows += _reorder_rows(store, tr, timings, progress)
        if measure and rows:
            rows = measure_gains(
                tr,
                rows,
                topology=topology,
                base_ns=base_ns,
                config=config,
                expansions=expansions,
                max_pieces=max_pieces,
                limit=limit,
                progress=progress,
                split=cost,
            )
        else:
            order = {k: i for i, k in enumerate(OPPORTUNITY_KINDS)}
            rows.sort(key=lambda r: (order[r["kind"]], r["rank"], r["op_id"], r["other_id"]))
    table = pa.table(
        {
            "trace": pa.array([trace] * len(rows), pa.string()),
            "kind": pa.array([r["kind"] for r in rows], pa.string()),
            "rank": pa.array([r["rank"] for r in rows], pa.int32()),
            "op_id": pa.array([r["op_id"] for r in rows], pa.uint64()),
            "other_id": pa.array([r["other_id"] for r in rows], pa.uint64()),
            "gain_ns": pa.array([r["gain_ns"] for r in rows], pa.float64()),
            "detail": pa.array([json.dumps(r["detail"], sort_keys=True) for r in rows], pa.string()),
            "id": pa.array(range(1, len(rows) + 1), pa.int32()),
        },
        schema=OPPORTUNITIES_SCHEMA,
    )
    log.debug("found %d opportunities in %s", table.num_rows, trace)
    return table


def _measure_topology(
    store: Store, trace: Trace, topo: Topology | str | None, run_id: int | None
) -> Topology:
    """Where gains are measured: ``topo``, else the topology run ``run_id`` ran on, else the
    trace's default."""
    if isinstance(topo, Topology):
        return topo
    if topo is None and run_id is not None:
        spec = store.sql("SELECT topology FROM runs WHERE run_id = $r", {"r": int(run_id)}).to_arrow()
        if spec.num_rows and spec["topology"][0].as_py():
            try:
                return parse_topology(str(spec["topology"][0].as_py()))
            except EtstoreError:
                log.info("run %s's topology cannot be read back; measuring on the default", run_id)
    return parse_topology(topo or default_topology(trace))


def _recorded_rows(
    trace: Trace,
    topo: Topology | str | None,
    config: SimConfig | None,
    limit: int,
    progress: ProgressFn | None,
    kinds: Sequence[str],
    cost: SplitCost,
    max_pieces: int,
) -> list[dict[str, Any]]:
    """A recording's opportunities, one row per change, gains measured by replay: hoists
    (``overlap``) and, on an expanded recording, consumers split per chunk (``chunk``)."""
    topology = None if topo is None else topo if isinstance(topo, Topology) else parse_topology(topo)
    rows: list[dict[str, Any]] = []
    base = None
    if "overlap" in kinds:
        base, found = find_hoists(trace, topo=topology, config=config, limit=limit, progress=progress)
        for o in found:
            detail = o.detail(trace)
            first = detail["moves"][0]
            detail["makespan_ns"] = float(base.result.total_ns)
            detail["network"] = base.label
            rows.append(
                {
                    "kind": "overlap",
                    "rank": first["rank"],
                    "op_id": first["before"],
                    "other_id": first["moved"][0],
                    "gain_ns": o.gain_ns,
                    "detail": detail,
                }
            )
    if "chunk" in kinds and trace.params.get("chunk_reads"):
        base, splits = find_splits(
            trace,
            topo=topology,
            config=config,
            cost=cost,
            max_pieces=max_pieces,
            limit=limit,
            progress=progress,
            base=base,
        )
        parents = trace.params["collective_blocks"]["parent_id"]
        for sp in splits:
            detail = sp.detail(trace, cost)
            first = detail["splits"][0]
            detail["makespan_ns"] = float(base.result.total_ns)
            detail["network"] = base.label
            rows.append(
                {
                    "kind": "chunk",
                    "rank": first["rank"],
                    "op_id": int(parents[first["block"]]),
                    "other_id": first["op"],
                    "gain_ns": sp.gain_ns,
                    "detail": detail,
                }
            )
    return rows
