"""Names are handles on content stored once: written into a store, read on every backend, the
same answers."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from etstore.algorithms.generators import generate
from etstore.app.expand import expand_stored
from etstore.errors import QueryError, StoreError, TraceFormatError, UnknownTraceError
from etstore.formats import read_chakra_json, read_et, write_chakra_json
from etstore.formats.msccl_writer import to_msccl_xml
from etstore.formats.msccl_xml import parse_msccl_xml
from etstore.store import EmbeddedStore, Store
from etstore.testing import Backend
from etstore.workloads import transformer


def _op_counts(store: Store, name: str) -> tuple[int, int]:
    """(ops Cypher finds under ``name``, ops SQL finds under ``name``)."""
    q = "MATCH (t:Trace {name: $t}), (o:Op) WHERE o.trace_id = t.trace_id RETURN count(o)"
    cy = store.cypher(q, {"t": name}).scalar()
    sq = store.sql("SELECT count(*) FROM ops WHERE trace = $t", {"t": name}).scalar()
    return cy, sq


def test_known_content_under_a_new_name(backend: Backend) -> None:
    trace = transformer(ranks=4, layers=2, tp=2)
    first = backend.store.ingest(trace, name="a")
    second = backend.store.ingest(trace, name="b")
    assert second.created and second.same_as == "a" and second.trace.name == "b"
    assert second.trace.trace_id == first.trace.trace_id and second.trace.ops == trace.num_ops
    backend_store = backend.read()
    assert [t.name for t in backend_store.traces()] == ["a", "b"]
    assert backend_store.info("a").trace_id == backend_store.info("b").trace_id
    # content once in the graph, under both names in SQL and in Cypher (literal or parameter)
    assert backend_store.cypher("MATCH (o:Op) RETURN count(o)").scalar() == trace.num_ops
    assert _op_counts(backend_store, "b") == (trace.num_ops, trace.num_ops)
    lit = backend_store.cypher(
        "MATCH (t:Trace {name: 'b'}), (o:Op) WHERE o.trace_id = t.trace_id RETURN count(o)"
    ).scalar()
    assert lit == trace.num_ops
    assert backend_store.sql("SELECT count(DISTINCT trace_id) FROM traces").scalar() == 1
    back = backend_store.load("b")
    assert back.name == "b" and back.ops.equals(trace.ops) and back.deps.equals(trace.deps)
    again = backend.store.ingest(trace, name="b")  # that name already points at it
    assert not again.created and again.trace.name == "b"


def test_removing_one_name_keeps_the_other(backend: Backend) -> None:
    trace = transformer(ranks=2, layers=1, tp=1)
    backend.store.ingest(trace, name="a")
    backend.store.ingest(trace, name="b")
    backend.read()
    backend.store.remove("a")  # the first name
    backend_store = backend.read()
    assert [t.name for t in backend_store.traces()] == ["b"]
    assert _op_counts(backend_store, "b") == (trace.num_ops, trace.num_ops)
    assert _op_counts(backend_store, "a") == (0, 0)
    assert backend_store.cypher("MATCH (t:Trace) RETURN t.name").scalar() == "b"
    with pytest.raises(UnknownTraceError, match="no trace named 'a'"):
        backend_store.load("a")
    # a new content may take the freed name without meeting the old nodes
    other = transformer(ranks=4, layers=1, tp=1)
    backend.store.ingest(other, name="a")
    assert _op_counts(backend.read(), "a") == (other.num_ops, other.num_ops)
    backend.store.remove("b")
    backend.store.remove("a")
    backend.read()
    assert backend_store.cypher("MATCH (o:Op) RETURN count(o)").scalar() == 0
    assert backend_store.sql("SELECT count(*) FROM ops").scalar() == 0


def test_default_name_taken_by_other_content_gets_a_suffix(store: EmbeddedStore) -> None:
    store.ingest(transformer(ranks=2, layers=1, tp=1), name="x")
    one = store.ingest(transformer(ranks=4, layers=1, tp=1).replace(name="x"))
    assert one.trace.name == "x-2" and one.created
    again = store.ingest(transformer(ranks=4, layers=1, tp=1).replace(name="x"))
    assert again.trace.name == "x-2" and not again.created  # found under the suffixed name
    with pytest.raises(StoreError, match="already named 'x'"):
        store.ingest(transformer(ranks=8, layers=1, tp=1), name="x")


def test_expanding_two_names_of_one_content(backend: Backend) -> None:
    trace = transformer(ranks=2, layers=1, tp=1)
    backend.store.ingest(trace, name="w1")
    backend.store.ingest(trace, name="w2")
    one = expand_stored(backend.store, "w1", "ring")
    two = expand_stored(backend.store, "w2", "ring")
    backend_store = backend.read()
    assert (one.report.trace.name, one.report.trace.parent) == ("w1-expanded", "w1")
    assert (two.report.trace.name, two.report.trace.parent) == ("w2-expanded", "w2")
    assert two.report.created and two.report.same_as == "w1-expanded"
    assert two.report.trace.trace_id == one.report.trace.trace_id
    assert backend_store.info("w2-expanded").params["workload"] == "w2"  # each name its own params
    n_expanded = one.report.trace.ops
    # lineage rows under each name, naming each name's own parent
    rows = backend_store.sql(
        "SELECT trace, parent_trace, count(*) AS n FROM lineage GROUP BY ALL ORDER BY trace"
    ).to_pylist()
    lineage_rows = rows[0]["n"]
    assert rows == [
        {"trace": "w1-expanded", "parent_trace": "w1", "n": lineage_rows},
        {"trace": "w2-expanded", "parent_trace": "w2", "n": lineage_rows},
    ]
    becomes = backend_store.cypher(
        "MATCH (p:Trace {name: $p}), (t:Trace {name: $t}), (c:Op)-[:BECOMES]->(x:Op) "
        "WHERE c.trace_id = p.trace_id AND x.trace_id = t.trace_id RETURN count(*)",
        {"p": "w2", "t": "w2-expanded"},
    ).scalar()
    assert becomes == lineage_rows > 0
    backend.store.remove("w1-expanded")
    backend_store = backend.read()
    assert backend_store.sql("SELECT count(*) FROM lineage").scalar() == lineage_rows
    assert _op_counts(backend_store, "w2-expanded") == (n_expanded, n_expanded)


def _variant(text: str, **attrs: str) -> str:
    head = re.search(r"<algo [^>]*>", text)
    assert head is not None
    new = head[0]
    for k, v in attrs.items():
        new = re.sub(rf'{k}="[^"]*"', f'{k}="{v}"', new)
    return text.replace(head[0], new, 1)


def test_algorithms_differing_only_in_header_stay_apart(
    backend: Backend, shared_fixture: Callable[[str], Path]
) -> None:
    ll = shared_fixture("msccl/allreduce-allpairs-8n-ll-32tb.xml").read_text()
    simple = _variant(ll, proto="Simple", minBytes="25600", maxBytes="65536")
    redop = _variant(ll, name="allreduce_pairs_max")
    got = {}
    for name, text in (("ll", ll), ("simple", simple), ("renamed", redop)):
        report = backend.store.ingest(parse_msccl_xml(text, name=name))
        assert report.created and report.same_as is None, name
    backend_store = backend.read()
    for name, text in (("ll", ll), ("simple", simple), ("renamed", redop)):
        got[name] = backend_store.info(name).trace_id
        back = to_msccl_xml(backend_store.load(name))
        head = re.search(r"<algo [^>]*>", text)
        assert head is not None and back.splitlines()[0] == head[0], name  # byte for byte
    assert len(set(got.values())) == 3
    with pytest.raises(StoreError, match="already named 'll'"):
        backend.store.ingest(parse_msccl_xml(simple, name="x"), name="ll")


def test_missing_cypher_parameter_is_named(backend: Backend) -> None:
    backend.store.ingest(transformer(ranks=2, layers=1, tp=1))
    backend_store = backend.read()
    with pytest.raises(QueryError, match=r"parameter \$t but no value was given"):
        backend_store.cypher("MATCH (t:Trace {name: $t}) RETURN t.ops")
    with pytest.raises(QueryError, match=r"\$rank .*given: \$t"):
        backend_store.cypher(
            "MATCH (t:Trace {name: $t}), (o:Op {rank: $rank}) WHERE o.trace_id = t.trace_id RETURN o",
            {"t": "transformer"},
        )
    # a $ inside a string or a comment is no parameter
    q = "MATCH (o:Op) WHERE o.name <> '$t' // $nope\nRETURN count(o)"
    assert backend_store.cypher(q).scalar() == 20


def test_json_export_reingests_as_the_same_trace(backend: Backend, rt_template: Path, tmp_path: Path) -> None:
    first = backend.store.ingest(read_et(rt_template))
    assert first.trace.name == "chakra_trace"
    paths = write_chakra_json(backend.read().load("chakra_trace"), tmp_path / "json" / "chakra_trace")
    assert len(paths) == 8 and '"global_metadata_raw"' in paths[0].read_text()
    again = backend.store.ingest(read_chakra_json(tmp_path / "json" / "chakra_trace"))
    assert not again.created and again.trace.name == "chakra_trace"
    assert [t.name for t in backend.read().traces()] == ["chakra_trace"]
    bad = tmp_path / "bad.0.json"
    bad.write_text('{"workload_graph": [], "global_metadata_raw": 5}')
    with pytest.raises(TraceFormatError, match="'global_metadata_raw' must be the base64 text"):
        read_chakra_json(bad)


def test_a_second_name_from_another_parent_gets_its_own_lineage(backend: Backend) -> None:
    t1 = transformer(ranks=2, layers=1, tp=1)
    durations = t1.ops["duration_micros"].to_pylist()
    durations[0] += 1  # another workload, the same collective op 8 on both ranks
    t2 = t1.replace(ops=t1.ops.set_column(4, "duration_micros", pa.array(durations, pa.uint64())))
    assert t1.ops.schema.names[4] == "duration_micros"
    backend.store.ingest(t1, name="t1")
    backend.store.ingest(t2, name="t2")
    algo = generate("ring", coll="allreduce", ranks=2, chunks=1)
    lineage = pa.table(
        {
            "rank": algo.ops["rank"],
            "id": algo.ops["id"],
            "parent_id": pa.array(np.full(algo.num_ops, 8, dtype=np.uint64)),
        }
    )
    backend.store.ingest(algo, name="d1", parent="t1", lineage=lineage)
    second = backend.store.ingest(algo, name="d2", parent="t2", lineage=lineage)
    assert second.same_as == "d1" and second.trace.parent == "t2"
    backend_store = backend.read()

    def becomes(parent: str) -> int:
        q = (
            "MATCH (p:Trace {name: $p}), (c:Op)-[:BECOMES]->(x:Op) WHERE c.trace_id = p.trace_id "
            "RETURN count(x)"
        )
        return int(backend_store.cypher(q, {"p": parent}).scalar())

    rows = backend_store.sql("SELECT trace, parent_trace, count(*) AS n FROM lineage GROUP BY ALL ORDER BY 1")
    assert rows.to_pylist() == [
        {"trace": "d1", "parent_trace": "t1", "n": algo.num_ops},
        {"trace": "d2", "parent_trace": "t2", "n": algo.num_ops},
    ]
    assert becomes("t1") == becomes("t2") == algo.num_ops
    backend.store.remove("d2")
    backend_store = backend.read()
    assert (becomes("t1"), becomes("t2")) == (algo.num_ops, 0)
    assert backend_store.sql("SELECT count(*) FROM lineage").scalar() == algo.num_ops
