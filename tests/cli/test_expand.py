"""``etstore expand`` end to end: real store, the ASTRA-sim regression workload, errors change nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from etstore.cli import main


def run(capsys: pytest.CaptureFixture[str], store: Path, *args: str) -> tuple[int, str, str]:
    code = main(["--store", str(store), *args])
    out, err = capsys.readouterr()
    return code, out, err


def listing(capsys: pytest.CaptureFixture[str], store: Path) -> list[dict]:
    code, out, _ = run(capsys, store, "ls", "--format", "json")
    assert code == 0
    return sorted(json.loads(out), key=lambda r: r["name"])


def test_expand_stores_an_expanded_trace_with_lineage(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, rt_template: Path
) -> None:
    s = tmp_path / "s"
    assert run(capsys, s, "ingest", str(rt_template / "chakra_trace"), "--name", "rt")[0] == 0
    code, out, err = run(capsys, s, "expand", "rt", "--algo", "ring", "--format", "json")
    assert code == 0, err
    rows = json.loads(out)
    assert [(r["trace"], r["comm_type"], r["group_size"], r["algorithm"], r["ops"]) for r in rows] == [
        ("rt-expanded", "ALL_REDUCE", 8, "ring-allreduce-8r-1c", 280)
    ]
    assert rows[0]["bytes_sent"] == 8 * 2 * 7 * (1 << 20) // 8  # 2(N-1) chunks of S/N per rank
    traces = {r["name"]: r for r in listing(capsys, s)}
    assert traces["rt-expanded"]["kind"] == "expanded" and traces["rt-expanded"]["parent"] == "rt"
    assert traces["ring-allreduce-8r-1c"]["kind"] == "algorithm"  # the generated ring is stored too
    params = json.loads(traces["rt-expanded"]["params"])
    assert params["algorithms"] == {"ALL_REDUCE": "ring-allreduce-8r-1c"} and params["workload"] == "rt"
    code, out, _ = run(
        capsys,
        s,
        "cypher",
        "MATCH (c:Op)-[:BECOMES]->(x:Op) WHERE c.rank = 3 RETURN c.type AS coll, x.type AS op, count(*) AS n "
        "ORDER BY op",
        "--format",
        "json",
    )
    assert json.loads(out) == [
        {"coll": "COMM_COLL_NODE", "op": "COMM_RECV_NODE", "n": 14},
        {"coll": "COMM_COLL_NODE", "op": "COMM_SEND_NODE", "n": 14},
        {"coll": "COMM_COLL_NODE", "op": "COMP_NODE", "n": 7},
    ]
    # a stored algorithm by name, through --by-type, under a chosen name; table output names the trace
    code, out, err = run(
        capsys, s, "expand", "rt", "--by-type", "allreduce=ring-allreduce-8r-1c", "--name", "rt2",
        "--reduce-duration-micros", "3",
    )  # fmt: skip
    assert code == 0, err
    text = " ".join(out.split())
    assert (
        text.startswith("rt2 (expanded, new) from rt: 8 ranks, 280 ops")
        and "expanded 1 collective into 280 ops" in text
    )
    assert {r["name"] for r in listing(capsys, s)} == {"rt", "rt-expanded", "rt2", "ring-allreduce-8r-1c"}


def test_expand_errors_are_one_line_and_store_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, rt_template: Path
) -> None:
    s = tmp_path / "s"
    run(capsys, s, "ingest", str(rt_template / "chakra_trace"), "--name", "rt")
    run(capsys, s, "algo", "gen", "ring", "--coll", "allreduce", "--ranks", "4", "--name", "ring4")
    before = listing(capsys, s)
    for args, message in [
        (("--algo", "ring4"), "has 8 member ranks but algorithm 'ring4' has 4 ranks"),
        (("--algo", "spiral"), "neither a stored algorithm nor a generator"),
        (("--algo", "ring", "--where", "comm_size <"), "where predicate 'comm_size <'"),
        (("--algo", "ring", "--where", "rank < 4"), "on ranks [0, 1, 2, 3] but not on [4, 5, 6, 7]"),
        (("--by-type", "allsum=ring"), "unknown collective 'allsum'"),
        ((), "give --algo"),
    ]:
        code, out, err = run(capsys, s, "expand", "rt", *args)
        assert code == 1 and out == "", args
        assert err.count("\n") == 1 and message in err, err
    assert run(capsys, s, "expand", "nope", "--algo", "ring")[0] == 1
    assert listing(capsys, s) == before
