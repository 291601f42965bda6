"""Chakra's JSON trace form against its .et twin, and our lossless JSON export."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow.compute as pc
import pytest

from etstore.errors import TraceFormatError
from etstore.ingest import read_chakra_json, read_et, read_trace, write_chakra_json


def test_json_twin_has_the_same_ops_as_the_et(feeder: Path, shared_fixture: Callable[[str], Path]) -> None:
    j = read_trace(shared_fixture("chakra/json_trace.chakra.0.json"))
    e = read_et(feeder)
    assert j.num_ops == e.num_ops == 3664
    for column in ("id", "type", "duration_micros", "is_cpu_op"):
        assert j.ops[column].equals(e.ops[column]), column
    # upstream's JSON replaced "id" by "Id" inside names (voId, Namespace): equal ignoring case
    assert [a.lower() for a in j.ops["name"].to_pylist()] == [b.lower() for b in e.ops["name"].to_pylist()]
    data = e.deps.filter(pc.equal(e.deps["kind"], "data"))
    assert j.deps.select(["src", "dst"]).equals(data.select(["src", "dst"]))  # the JSON carries no ctrl deps


def test_small_json_with_ctrl_deps(shared_fixture: Callable[[str], Path]) -> None:
    t = read_chakra_json(shared_fixture("chakra/json_trace.small_chakra.0.json"))
    assert t.num_ops == 7
    assert pc.sum(pc.equal(t.ops["type"], "COMM_COLL_NODE")).as_py() == 3
    # every ctrlDep points at nodes outside this excerpt (3, 429, 434): all 7 are missing
    assert t.num_missing == 7 and set(t.missing["src"].to_pylist()) == {3, 429, 434}
    assert set(t.missing["kind"].to_pylist()) == {"ctrl"} and t.num_deps == 6


def test_json_export_round_trips_everything(feeder: Path, tmp_path: Path) -> None:
    e = read_et(feeder)
    (path,) = write_chakra_json(e, tmp_path / "f")
    back = read_trace(path)
    assert back.ops.equals(e.ops) and back.deps.equals(e.deps) and back.missing.equals(e.missing)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON"),
        ('{"nodes": []}', "workload_graph"),
        ('{"workload_graph": [{"Name": "x"}]}', "'Id'"),
    ],
)
def test_bad_json(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.0.json"
    path.write_text(text)
    with pytest.raises(TraceFormatError, match=message):
        read_trace(path)
