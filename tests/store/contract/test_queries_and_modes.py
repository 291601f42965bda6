"""Contract: the README's Cypher, the documented Ladybug spellings, and read-only mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from etstore.errors import QueryError, StoreError
from etstore.formats import read_et
from etstore.store import Store, open_store
from etstore.testing import Backend
from etstore.workloads import transformer

# transformer(ranks=4, layers=1, tp=1): a ring of 4 sends, one per rank (hand-checked: 10 ops per rank)
RING = [(0, 1), (1, 2), (2, 3), (3, 0)]


def _rows(store: Store, query: str, **params: object) -> list[tuple[object, ...]]:
    return sorted(store.cypher(query, params))


def test_readme_cypher_examples(backend: Backend) -> None:
    backend.store.ingest(transformer(ranks=4, layers=1, tp=1), name="workload")
    backend_store = backend.read()
    res = backend_store.cypher(
        "MATCH (t:Trace {name: $t}), (s:Op)-[:MSG]->(r:Op) WHERE s.trace_id = t.trace_id "
        "RETURN s.rank, r.rank, count(*)",
        {"t": "workload"},
    )
    assert res.columns[:2] == ["s.rank", "r.rank"]
    assert sorted(res) == [(s, d, 1) for s, d in RING]
    types = {
        k: n
        for k, n in _rows(
            backend_store,
            "MATCH (t:Trace {name: $t}), (o:Op) WHERE o.trace_id = t.trace_id RETURN o.type, count(*)",
            t="workload",
        )
    }
    assert types == {"COMM_SEND_NODE": 4, "COMM_RECV_NODE": 4, "COMM_COLL_NODE": 4, "COMP_NODE": 28}
    waits = backend_store.cypher(
        "MATCH (t:Trace {name: $t}), (s:Op)-[:MSG]->(r:Op)-[:DEP]->(c:Op) WHERE s.trace_id = t.trace_id "
        "RETURN s.rank AS from_rank, r.rank AS to_rank, s.name AS send, c.name AS waits ORDER BY from_rank",
        {"t": "workload"},
    ).to_pylist()
    assert [(w["from_rank"], w["to_rank"], w["waits"]) for w in waits] == [
        (s, d, "embedding") for s, d in RING
    ]


def test_point_lookup_and_walk(backend: Backend) -> None:
    backend.store.ingest(transformer(ranks=2, layers=2, tp=1))
    backend_store = backend.read()
    uid = backend_store.sql("SELECT uid FROM ops WHERE rank = 1 AND id = 0").scalar()
    op = backend_store.cypher(
        "MATCH (o:Op {uid: $u}) RETURN o.rank AS rank, o.id AS id, o.name AS name", {"u": uid}
    ).to_pylist()
    assert op == [{"rank": 1, "id": 0, "name": "send_embeddings"}]
    reach = backend_store.cypher(
        "MATCH (a:Op {uid: $u})-[:DEP*1..5]->(b:Op) RETURN count(DISTINCT b) AS n", {"u": uid}
    ).scalar()
    sql_reach = backend_store.sql(
        "WITH RECURSIVE w(uid, d) AS (SELECT $u, 0 UNION SELECT dst_uid, d + 1 FROM deps JOIN w "
        "ON src_uid = w.uid WHERE d < 5) SELECT count(DISTINCT uid) - 1 FROM w",
        {"u": uid},
    ).scalar()
    assert reach == sql_reach > 0


def test_ladybug_label_spelling(backend: Backend) -> None:
    backend.store.ingest(transformer(ranks=4, layers=1, tp=1))
    backend_store = backend.read()
    rows = backend_store.cypher(
        "MATCH (t:Trace {name: $t}), (a:Op)-[r]->(b:Op) WHERE a.trace_id = t.trace_id "
        "AND a.name <> 'label(r)' "
        "RETURN label(r) AS rel, label(a) AS node, count(*) AS n ORDER BY rel",
        {"t": "transformer"},
    ).to_pylist()
    deps = backend_store.sql("SELECT count(*) FROM deps").scalar()
    assert rows == [
        {"rel": "DEP", "node": "Op", "n": deps},
        {"rel": "MSG", "node": "Op", "n": 4},
    ]


def test_read_only_mode(backend: Backend, rt_template: Path) -> None:
    backend.store.ingest(read_et(rt_template))
    backend.read()
    backend.store.close()
    with open_store(backend.location, read_only=True) as ro:
        assert [t.name for t in ro.traces()] == ["chakra_trace"]
        assert ro.cypher("MATCH (o:Op) RETURN count(o)").scalar() == 8
        assert ro.sql("SELECT count(*) FROM ops").scalar() == 8
        assert ro.load("chakra_trace").num_ops == 8
        with pytest.raises(StoreError, match="read-only"):
            ro.ingest(transformer(ranks=2, layers=1, tp=1))
        with pytest.raises(StoreError, match="read-only"):
            ro.remove("chakra_trace")
        with pytest.raises(QueryError, match="Cypher"):
            ro.cypher("MATCH (o:Op) SET o.name = 'changed'")
    if backend.url is not None:  # a server is never opened for writing: its data comes by publish
        with pytest.raises(StoreError, match=r"read-only: .*then run etstore publish"):
            open_store(backend.location, write=True)
    with open_store(backend.location) as again:
        names = again.cypher("MATCH (o:Op) RETURN DISTINCT o.name AS name").to_pylist()
        assert {"name": "changed"} not in names and len(names) > 0
