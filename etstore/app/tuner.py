"""Tuner runs: a parsed trajectory into ``tuner_runs``/``tuner_steps`` and ``TunerStep`` graph nodes.

One file is one run: a ``tuner_runs`` row and one ``tuner_steps`` row per logged call,
written in one warehouse transaction; the graph has one ``(:TunerStep)`` node per call so
Cypher reaches the steps too (the embedded store's graph index derives them from the rows;
Neo4j gets them written here). Storing the same bytes again returns the run already stored
(the content hash decides, as for measured runs). Each step is linked to the stored
algorithm trace its action ran (:func:`link_steps`), and its node's ``trace_id`` equals
``Op.trace_id`` of that trace's ops, so ``MATCH (s:TunerStep), (o:Op) WHERE
o.trace_id = s.trace_id`` joins a step to the DAG it ran, on both backends.

The tables are declared in :data:`~etstore.store.schema.TUNER_DDL` and documented in
``docs/measured.md``; the node table in :data:`~etstore.store.graph.TUNER_STEP_NODE_DDL`.
"""

from __future__ import annotations

import logging
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from etstore.collective import short_name
from etstore.errors import EtstoreError, QueryError, StoreError, UnknownTraceError
from etstore.ingest.tuner import TunerLog
from etstore.store.base import Store
from etstore.store.graph import TUNER_STEP_PROPERTIES
from etstore.store.warehouse import Warehouse

__all__ = ["TunerReport", "link_steps", "remove_tuner_run", "store_tuner_run"]

log = logging.getLogger(__name__)

_BATCH_ROWS = 5000  # steps per CREATE statement: one parameter list of this many maps


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
        A writable store (embedded or Neo4j): the rows go to its warehouse, the
        ``TunerStep`` nodes to its graph.
    parsed
        What :func:`~etstore.ingest.tuner.read_tuner_log` returned.
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
        ``name`` is held by a file with other content, or an engine refuses the rows
        (a read-only store); nothing is left behind in either engine.

    Notes
    -----
    O(steps + stored algorithm traces): one columnar insert per table, one bulk ``COPY``
    of the nodes from Arrow (Ladybug; 100,000 steps in about 0.4 s) or one Cypher
    ``UNWIND ... CREATE`` per 5,000 steps (Neo4j), one graph lookup per distinct linked trace.
    """
    warehouse = store.warehouse
    nodes_written = False
    run_id = 0
    try:
        with warehouse.transaction():
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
                pa.Table.from_pylist(
                    [{**parsed.run_row(), "name": chosen, "run_id": run_id, "linked": linked}]
                ),
            )
            warehouse.append("tuner_steps", _with_run(steps, run_id))
            nodes_written = True
            _create_nodes(store, steps, run_id, chosen, parsed.content_hash)
    except BaseException:
        if nodes_written:
            with suppress(EtstoreError):  # the nodes of a run whose rows did not land
                _delete_nodes(store, run_id, parsed.content_hash)
        raise
    log.debug(
        "stored tuner run %s (%d steps, %d linked) from %s", chosen, steps.num_rows, linked, parsed.source
    )
    return TunerReport(run_id, chosen, True, steps.num_rows, linked, parsed.source)


def remove_tuner_run(store: Store, name: str) -> None:
    """Remove tuner run ``name``: its rows and its ``TunerStep`` nodes.

    Raises
    ------
    UnknownTraceError
        No tuner run has that name.
    StoreError
        An engine refuses the removal (a read-only store).

    Notes
    -----
    O(steps of the run). The rows go in one transaction, after the nodes: a failure
    between the two leaves the run listed, and removing it again finishes the job.
    """
    warehouse = store.warehouse
    found = warehouse.query(
        "SELECT run_id, content_hash FROM tuner_runs WHERE name = $n", {"n": name}
    ).to_pylist()
    if not found:
        raise UnknownTraceError(f"no tuner run named {name!r} in {store.location}")
    run_id, digest = int(found[0]["run_id"]), str(found[0]["content_hash"])
    _delete_nodes(store, run_id, digest)
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
        Rows of :data:`~etstore.ingest.tuner.TUNER_STEP_SCHEMA`.

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


def _node_table(steps: pa.Table, run_id: int, run: str, digest: str, ids: dict[str, int]) -> pa.Table:
    """The ``TunerStep`` nodes as Arrow, columns in the order and types of
    :data:`~etstore.store.graph.TUNER_STEP_PROPERTIES`."""
    n = steps.num_rows
    step = steps["step"].cast(pa.int64())
    linked = [None if t is None else ids.get(t) for t in steps["trace"].to_pylist()]
    given = {
        "uid": pc.add(step, pa.scalar(run_id << 32, pa.int64())),
        "run": pa.array([run] * n, pa.string()),
        "run_id": pa.array([run_id] * n, pa.int64()),
        "content_hash": pa.array([digest] * n, pa.string()),
        "trace_id": pa.array(linked, pa.int64()),
    }
    return pa.table({k: given[k] if k in given else steps[k] for k in TUNER_STEP_PROPERTIES})


def _trace_ids(store: Store, names: list[str]) -> dict[str, int]:
    """Each linked trace's content id, as its ops carry it in ``Op.trace_id``."""
    out: dict[str, int] = {}
    for name in names:
        with suppress(UnknownTraceError):
            tid = store.info(name).trace_id
            if tid is not None:
                out[name] = tid
    return out


_CREATE = (
    "UNWIND $rows AS r CREATE (s:TunerStep {" + ", ".join(f"{k}: r.{k}" for k in TUNER_STEP_PROPERTIES) + "})"
)


def _create_nodes(store: Store, steps: pa.Table, run_id: int, run: str, digest: str) -> None:
    """One ``TunerStep`` node per step, one Cypher ``UNWIND ... CREATE`` per batch: for a store
    whose graph is its own (Neo4j); an embedded store's graph index derives them from the rows."""
    if getattr(store, "graph_is_derived", False):
        return
    linked = sorted({t for t in steps["trace"].to_pylist() if t is not None})
    nodes = _node_table(steps, run_id, run, digest, _trace_ids(store, linked))
    try:
        for batch in nodes.to_batches(max_chunksize=_BATCH_ROWS):
            store.cypher(_CREATE, {"rows": batch.to_pylist()})
    except QueryError as exc:
        raise StoreError(f"cannot store the tuner steps of {run!r} in the graph: {exc}") from exc


def _delete_nodes(store: Store, run_id: int, digest: str) -> None:
    """Delete the ``TunerStep`` nodes of one run (no edges touch them; none in a derived graph)."""
    if getattr(store, "graph_is_derived", False):
        return
    store.cypher(
        "MATCH (s:TunerStep) WHERE s.run_id = $r AND s.content_hash = $h DELETE s", {"r": run_id, "h": digest}
    )
