"""Removing one trace leaves every other trace's nodes and edges exactly as they were, as every
backend reads them."""

from __future__ import annotations

from etstore.store import EmbeddedStore, Store
from etstore.testing import Backend
from etstore.workloads import transformer


def _graph_counts(store: Store, trace: str) -> tuple[int, int, int]:
    p = {"t": trace}
    named = "MATCH (t:Trace {name: $t}), "
    ops = store.cypher(named + "(o:Op) WHERE o.trace_id = t.trace_id RETURN count(o) AS n", p).scalar()
    deps = store.cypher(
        named + "(a:Op)-[d:DEP]->(:Op) WHERE a.trace_id = t.trace_id RETURN count(d) AS n", p
    ).scalar()
    msgs = store.cypher(
        named + "(a:Op)-[m:MSG]->(:Op) WHERE a.trace_id = t.trace_id RETURN count(m) AS n", p
    ).scalar()
    return ops, deps, msgs


def test_remove_one_of_several(backend: Backend) -> None:
    a = backend.store.ingest(transformer(ranks=4, layers=2, tp=2), name="a").trace
    b = backend.store.ingest(transformer(ranks=8, layers=1, tp=2), name="b").trace
    assert _graph_counts(backend.read(), "b") == (b.ops, b.deps, b.messages)
    backend.store.remove("a")
    backend_store = backend.read()
    assert _graph_counts(backend_store, "a") == (0, 0, 0)
    assert _graph_counts(backend_store, "b") == (b.ops, b.deps, b.messages)
    assert backend_store.cypher("MATCH (o:Op) RETURN count(o) AS n").scalar() == b.ops
    backend.store.remove("b")  # the last one: the graph is empty and usable again
    assert backend.read().cypher("MATCH (o:Op) RETURN count(o) AS n").scalar() == 0
    again = backend.store.ingest(transformer(ranks=4, layers=2, tp=2), name="a").trace
    assert (
        _graph_counts(backend.read(), "a")
        == (again.ops, again.deps, again.messages)
        == (a.ops, a.deps, a.messages)
    )


def test_ingest_counts_ops_on_or_behind_a_cycle(store: EmbeddedStore) -> None:
    from etstore.model import Trace, deps_table, ops_table

    # rank 0: 0 → 1 → 2 → 1 (a 2-cycle) and 2 → 3; rank 1: 0 → 1, acyclic
    ops = ops_table({"rank": [0, 0, 0, 0, 1, 1], "id": [0, 1, 2, 3, 0, 1], "type": ["COMP_NODE"] * 6})
    deps = deps_table([0, 0, 0, 0, 1], [0, 1, 2, 2, 0], [1, 2, 1, 3, 1])
    report = store.ingest(Trace(ops, deps, name="cyclic"))
    assert report.cycles == 3  # ops 1 and 2 on the cycle, op 3 waits behind it
