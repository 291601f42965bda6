"""``Trace`` nodes: one per name, carrying its content's ``trace_id`` that its ``Op`` nodes carry too.

Queries select a trace by joining its node; nothing in a query's text or parameters is
rewritten, so a string equal to a trace name stays that string.
"""

from __future__ import annotations

from etstore.app.expand import expand_stored
from etstore.store.graph import TRACE_NODE_COLUMNS
from etstore.testing import Backend
from etstore.workloads import transformer

_PER_NAME = (
    "MATCH (t:Trace), (o:Op) WHERE o.trace_id = t.trace_id "
    "RETURN t.name AS name, t.trace_id AS id, count(o) AS n ORDER BY name"
)


def test_two_names_of_one_content_are_two_nodes_over_one_graph(backend: Backend) -> None:
    trace = transformer(ranks=2, layers=1, tp=1)
    backend.store.ingest(trace, name="a")
    backend.store.ingest(trace, name="b")
    backend_store = backend.read()
    a, b = backend_store.info("a"), backend_store.info("b")
    assert a.trace_id is not None and b.trace_id == a.trace_id
    assert backend_store.cypher(_PER_NAME).to_pylist() == [
        {"name": "a", "id": a.trace_id, "n": trace.num_ops},
        {"name": "b", "id": a.trace_id, "n": trace.num_ops},
    ]
    ops = backend_store.cypher("MATCH (o:Op) RETURN count(o) AS n, count(DISTINCT o.trace_id) AS ids")
    assert ops.to_pylist() == [{"n": trace.num_ops, "ids": 1}]  # the content's ops once
    node = backend_store.cypher("MATCH (t:Trace {name: 'b'}) RETURN t").scalar()
    assert {k: node[k] for k in TRACE_NODE_COLUMNS} == {
        "name": "b",
        "trace_id": b.trace_id,
        "kind": b.kind,
        "ranks": b.ranks,
        "ops": b.ops,
        "parent": None,
        "source": b.source,
    }


def test_a_string_equal_to_a_trace_name_is_not_rewritten(backend: Backend) -> None:
    trace = transformer(ranks=2, layers=1, tp=1)
    backend.store.ingest(trace, name="a")
    backend.store.ingest(trace, name="b")
    backend_store = backend.read()
    assert backend_store.cypher("RETURN 'b' AS x").scalar() == "b"
    got = backend_store.cypher("RETURN $x AS x, $xs AS xs", {"x": "b", "xs": ["a", "b"]}).to_pylist()
    assert got == [{"x": "b", "xs": ["a", "b"]}]
    # and a name selects its own Trace node, not the first name of its content
    assert backend_store.cypher("MATCH (t:Trace {name: 'b'}) RETURN t.name").scalar() == "b"


def test_removing_one_of_two_names_removes_its_node_only(backend: Backend) -> None:
    trace = transformer(ranks=2, layers=1, tp=1)
    backend.store.ingest(trace, name="a")
    backend.store.ingest(trace, name="b")
    kept = backend.read().info("a")
    backend.store.remove("b")
    backend_store = backend.read()
    assert backend_store.cypher(_PER_NAME).to_pylist() == [
        {"name": "a", "id": kept.trace_id, "n": trace.num_ops}
    ]
    backend.store.ingest(trace, name="c")
    backend.store.remove("a")  # the first name, which the ops were stored under
    assert backend.read().cypher(_PER_NAME).to_pylist() == [
        {"name": "c", "id": kept.trace_id, "n": trace.num_ops}
    ]
    backend.store.remove("c")  # the last name: the ops go with it
    backend.read()
    assert backend_store.cypher("MATCH (t:Trace) RETURN count(t)").scalar() == 0
    assert backend_store.cypher("MATCH (o:Op) RETURN count(o)").scalar() == 0


def test_a_derived_trace_node_names_its_parent(backend: Backend) -> None:
    backend.store.ingest(transformer(ranks=2, layers=1, tp=1), name="w")
    expanded = expand_stored(backend.store, "w", "ring").report.trace
    rows = (
        backend.read()
        .cypher(
            "MATCH (t:Trace {name: $n}) RETURN t.parent AS parent, t.kind AS kind, t.ops AS ops",
            {"n": expanded.name},
        )
        .to_pylist()
    )
    assert rows == [{"parent": "w", "kind": "expanded", "ops": expanded.ops}]
