"""Chakra's JSON trace form against its .et twin, and our lossless JSON export."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow.compute as pc
import pytest

from etstore.errors import TraceFormatError
from etstore.formats import read_chakra_json, read_et, read_trace, write_chakra_json


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
        ('{"graph": []}', "workload_graph"),  # ({"nodes": [...]} is a PyTorch execution trace)
        ('{"workload_graph": [{"Name": "x"}]}', "'Id'"),
    ],
)
def test_bad_json(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.0.json"
    path.write_text(text)
    with pytest.raises(TraceFormatError, match=message):
        read_trace(path)


# ---------------------------------------------------------------- malformed input: one line, no traceback


def _node(**fields: object) -> str:
    """A one-node Chakra JSON document; ``fields`` are spliced in verbatim (already JSON text)."""
    body = {"Id": "1", "Name": '"a"', "NodeType": "4", **{k: str(v) for k, v in fields.items()}}
    return '{"workload_graph": [{' + ", ".join(f'"{k}": {v}' for k, v in body.items()) + "}]}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (_node(runtime="NaN"), r"not valid JSON: NaN is not a valid JSON value"),
        (_node(runtime="Infinity"), r"not valid JSON: Infinity is not a valid JSON value"),
        (
            _node(runtime="1e400"),
            r"node 0 \(Id 1\): 'runtime' must be a whole number in 0\.\.2\^64-1, got inf",
        ),
        (_node(runtime="-5"), r"'runtime' must be a whole number in 0\.\.2\^64-1, got -5"),
        (_node(runtime="1.5"), r"'runtime' must be a whole number .* got 1\.5"),
        (
            _node(ctrlDeps='[{"a": 1}]'),
            r"node 0 \(Id 1\): 'ctrlDeps' must be a whole number .* got \{'a': 1\}",
        ),
        (_node(ctrlDeps='"12"'), r"'ctrlDeps' must be a list of node ids, got '12'"),
        (_node(data_deps="[true]"), r"'data_deps' must be a whole number .* got True"),
        (_node(Id="18446744073709551616"), r"node 0: 'Id' must be a whole number in 0\.\.2\^64-1"),
        (_node(Id='"x"'), r"node 0: 'Id' must be a whole number .* got 'x'"),
        (_node(NodeType='"BOGUS"'), r"NodeType must be a Chakra node type .* got 'BOGUS'"),
        (_node(NodeType="-1"), r"NodeType must be a Chakra node type .* got -1"),
        (_node(comm_type="99"), r"comm_type 99 is not a Chakra collective"),
        (_node(inputs="[1]"), r"'inputs' must be an object, got \[1\]"),
        (_node(attrs="5"), r"'attrs' must be a list of attributes, got 5"),
        (_node(attrs='[{"name": "x", "int64_val": 1e300}]'), r"malformed attribute"),
        ('{"workload_graph": [5]}', r"node 0: expected an object with 'Id', got 5"),
        ('{"workload_graph": [{"Name": "a"}]}', r"node 0: missing 'Id'"),
        ("[" * 100_000, r"nested too deeply to read"),
        ('{"workload_graph": 7}', r"expected a 'workload_graph' list"),
        ('{"workload_graph": [', r"not valid JSON: Expecting value"),
    ],
)
def test_malformed_json_is_one_line_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(TraceFormatError, match=message) as info:
        read_chakra_json(path)
    assert "\n" not in str(info.value) and str(info.value).startswith(str(path))


def test_integral_floats_are_whole_numbers(tmp_path: Path) -> None:
    # json.dump of a float64 column writes 12.0: the same value as 12, not an error
    path = tmp_path / "f.json"
    path.write_text(_node(runtime="12.0", ctrlDeps="[7.0]", NodeType='"COMP"'))
    t = read_chakra_json(path)
    assert t.ops["duration_micros"].to_pylist() == [12] and t.ops["type"].to_pylist() == ["COMP_NODE"]
    assert t.missing["src"].to_pylist() == [7]


def test_json_over_a_tenth_of_the_budget_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "big.0.json"
    path.write_text(_node(Name='"' + "x" * (2 << 20) + '"'))  # a 2 MiB name
    monkeypatch.setenv("ETSTORE_MEMORY_BUDGET", "10MiB")  # a tenth: 1 MiB
    with pytest.raises(
        TraceFormatError, match=r"big\.0\.json: holds 2\.0 MiB, more than 1 MiB, .*ETSTORE_MEMORY_BUDGET"
    ):
        read_chakra_json(path)
    monkeypatch.setenv("ETSTORE_MEMORY_BUDGET", "30MiB")
    assert len(read_chakra_json(path).ops["name"][0].as_py()) == 2 << 20
