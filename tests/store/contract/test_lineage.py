"""Lineage contract: a derived trace links each parent op to the ops replacing it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from etstore.algorithms.generators import generate
from etstore.errors import StoreError, UnknownTraceError
from etstore.store import EmbeddedStore
from etstore.testing import Backend
from etstore.workloads import transformer


def _ring_lineage(algo_ops: pa.Table, parent_id: int) -> pa.Table:
    """Every algorithm op on rank r derives from op ``parent_id`` of rank r."""
    return pa.table(
        {
            "rank": algo_ops["rank"],
            "id": algo_ops["id"],
            "parent_id": pa.array(np.full(algo_ops.num_rows, parent_id, dtype=np.uint64)),
        }
    )


def test_becomes_edges_and_lineage_table(backend: Backend) -> None:
    parent = transformer(ranks=2, layers=1, tp=1)
    backend.store.ingest(parent)
    coll_id = 8  # grad_allreduce_L0 on both ranks (hand-checked: 10 ops per rank, the 9th)
    assert parent.ops["name"][coll_id].as_py() == "grad_allreduce_L0"
    algo = generate("ring", coll="allreduce", ranks=2, chunks=1)
    per_rank = {r: int(pc.sum(pc.equal(algo.ops["rank"], r)).as_py()) for r in (0, 1)}
    report = backend.store.ingest(
        algo, name="derived", parent="transformer", lineage=_ring_lineage(algo.ops, coll_id)
    )
    assert report.trace.parent == "transformer"
    backend_store = backend.read()
    assert backend_store.info("derived").parent == "transformer"
    rows = backend_store.cypher(
        "MATCH (p:Trace {name: $p}), (c:Op)-[:BECOMES]->(x:Op) WHERE c.trace_id = p.trace_id "
        "RETURN c.rank AS rank, c.name AS name, count(x) AS n ORDER BY rank",
        {"p": "transformer"},
    ).to_pylist()
    assert rows == [{"rank": r, "name": "grad_allreduce_L0", "n": per_rank[r]} for r in (0, 1)]
    n = backend_store.sql(
        "SELECT count(*) FROM lineage WHERE trace = 'derived' AND parent_trace = 'transformer' "
        "AND parent_id = 8"
    ).scalar()
    assert n == algo.num_ops
    backend.store.remove("derived")
    backend_store = backend.read()
    assert backend_store.cypher("MATCH ()-[b:BECOMES]->() RETURN count(b)").scalar() == 0
    assert backend_store.sql("SELECT count(*) FROM lineage").scalar() == 0


def test_bad_lineage_stores_nothing(store: EmbeddedStore) -> None:
    store.ingest(transformer(ranks=2, layers=1, tp=1))
    algo = generate("ring", coll="allreduce", ranks=2, chunks=1)
    with pytest.raises(StoreError, match="parent op 99"):
        store.ingest(algo, name="derived", parent="transformer", lineage=_ring_lineage(algo.ops, 99))
    with pytest.raises(UnknownTraceError, match="no trace named 'nope'"):
        store.ingest(algo, name="derived", parent="nope", lineage=_ring_lineage(algo.ops, 8))
    with pytest.raises(StoreError, match="without a parent"):
        store.ingest(algo, name="derived", lineage=_ring_lineage(algo.ops, 8))
    assert [t.name for t in store.traces()] == ["transformer"]
    assert store.sql("SELECT count(*) FROM ops WHERE trace = 'derived'").scalar() == 0
    assert store.cypher("MATCH (o:Op) RETURN count(o)").scalar() == 20


def test_reingesting_a_loaded_trace_is_a_no_op(backend: Backend) -> None:
    # null slots come back from the engines (and the server's payload) with other bytes than
    # they went in with: the content's identity must not see them
    first = backend.store.ingest(transformer(ranks=4, layers=2, tp=2))
    again = backend.store.ingest(backend.read().load(first.trace.name))
    assert not again.created and again.trace.name == first.trace.name
    assert [t.name for t in backend.read().traces()] == ["transformer"]
