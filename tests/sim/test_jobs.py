"""Several jobs on one fabric: equal to their merged trace, placements, shared links, the CLI."""

from __future__ import annotations

import doctest
import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from etstore.algorithms import expand
from etstore.cli import main
from etstore.errors import ConfigError
from etstore.model import OPS_SCHEMA, Trace
from etstore.sim import SimConfig, SimResult, simulate
from etstore.sim import jobs as jobs_module
from etstore.sim.jobs import combine, read_placement, simulate_jobs
from etstore.store import open_store
from etstore.testing import p2p_trace
from etstore.topology import GIB, Topology
from etstore.workloads import transformer

DATA = Path(__file__).resolve().parents[1] / "data" / "jobs"
RING8 = "ring:8,bw=50,lat=500"
EVEN_ODD = [{r: 2 * r for r in range(4)}, {r: 2 * r + 1 for r in range(4)}]  # data/jobs/interleaved.json


def _light() -> Trace:
    return transformer(ranks=4, layers=2, tp=2, hidden=1024, seq_tokens=512, seed=1, name="light")


def _heavy() -> Trace:
    """A neighbour that moves 4x the bytes of :func:`_light` per collective and message."""
    return transformer(ranks=4, layers=2, tp=2, hidden=2048, seq_tokens=1024, seed=2, name="heavy")


def _merged(traces: list[Trace], npu: list[dict[int, int]]) -> Trace:
    """The jobs merged into one trace row by row, as a multi-tenant merge script writes it: ranks and
    peers through ``npu``; each job's groups renumbered after the previous job's (ASTRA-sim ids)."""
    rows: list[dict[str, Any]] = []
    deps: list[dict[str, Any]] = []
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(traces):
        where = npu[i]
        own = dict(t.params["comm_groups"])
        number = {name: str(len(groups) + k + 1) for k, name in enumerate(sorted(own))}
        groups.update({number[name]: [where[r] for r in own[name]] for name in own})
        for row in t.ops.to_pylist():
            row["rank"] = where[row["rank"]]
            for peer in ("comm_src", "comm_dst"):
                if row[peer] is not None:
                    row[peer] = where[row[peer]]
            if row["pg_name"] is not None:
                row["pg_name"] = number[row["pg_name"]]
            rows.append(row)
        deps += [{**d, "rank": where[d["rank"]]} for d in t.deps.to_pylist()]
    ops = pa.Table.from_pylist(rows, schema=OPS_SCHEMA)
    return Trace(
        ops,
        pa.Table.from_pylist(deps, schema=traces[0].deps.schema),
        name="merged",
        params={"comm_groups": groups},
    )


def _times(result: SimResult) -> list[tuple[Any, ...]]:
    """Every op's (rank, id, ready, start, end), in a fixed order."""
    cols = ("rank", "id", "ready_ns", "start_ns", "end_ns")
    return sorted(zip(*(result.ops[c].to_pylist() for c in cols), strict=True))


def _collectives(result: SimResult, drop: str = "pg_name") -> list[tuple[Any, ...]]:
    keep = [c for c in result.collectives.column_names if c != drop]
    return sorted(zip(*(result.collectives[c].to_pylist() for c in keep), strict=True))


def _same_job(a: SimResult, b: SimResult) -> None:
    """Two replays of one job agree to the ns: its ops, its ranks, its collectives."""
    assert _times(a) == _times(b)
    assert a.ranks.to_pylist() == b.ranks.to_pylist()
    assert _collectives(a, drop="") == _collectives(b, drop="")


def test_docstring_examples() -> None:
    failed, tried = doctest.testmod(jobs_module)
    assert tried > 0 and failed == 0


@pytest.mark.parametrize("congestion", ["unaware", "aware"])
def test_two_jobs_together_equal_their_merged_trace(congestion: str) -> None:
    topo, config = Topology.from_spec(RING8), SimConfig(congestion=congestion)
    jobs = [_light(), _heavy()]
    together = simulate_jobs(jobs, topo, placement=EVEN_ODD, config=config)
    merged = simulate(_merged(jobs, EVEN_ODD), topo, config=config)
    assert together.joint.total_ns == merged.total_ns
    assert _times(together.joint) == _times(merged)
    assert together.joint.ranks.to_pylist() == merged.ranks.to_pylist()
    assert _collectives(together.joint) == _collectives(merged)
    # each job's part is the merged replay's rows of its NPUs, under the job's own ranks and groups
    for job, part in zip(together.combined.jobs, together.jobs, strict=True):
        back = {n: r for r, n in job.npu.items()}
        mine = [(back[r], *rest) for r, *rest in _times(merged) if r in back]
        assert _times(part) == sorted(mine)
        finish = dict(
            zip(merged.ranks["rank"].to_pylist(), merged.ranks["total_ns"].to_pylist(), strict=True)
        )
        assert part.total_ns == max(finish[n] for n in back)
        assert set(part.collectives["pg_name"].to_pylist()) == {"tp0", "tp1", "dp0", "dp1"}
    # the jobs' links are shared: queueing slows the light job, the unaware model shares for free
    alone = simulate_jobs([_light()], topo, placement=EVEN_ODD[:1], config=config).jobs[0]
    if congestion == "aware":
        assert together.jobs[0].total_ns > alone.total_ns
    else:
        _same_job(together.jobs[0], alone)


def test_jobs_take_consecutive_npus_by_default() -> None:
    light, heavy = _light(), _heavy()
    combined = combine([light, heavy], num_npus=8)
    assert [j.npu for j in combined.jobs] == [{r: r for r in range(4)}, {r: r + 4 for r in range(4)}]
    assert combined.placement() == {f"J{j}-{r}": 4 * j + r for j in range(2) for r in range(4)}
    assert combined.trace.ranks == list(range(8)) and combined.trace.name == "light+heavy"
    groups = combined.trace.params["comm_groups"]
    named = {(job.label, own): groups[new] for job in combined.jobs for new, own in job.groups.items()}
    assert named[("J0", "dp1")] == [1, 3] and named[("J1", "tp0")] == [4, 5] and len(groups) == 8
    # the first job, alone on NPUs 0..3, is the plain replay of its trace
    topo = Topology.from_spec(RING8)
    _same_job(simulate_jobs([light], topo).jobs[0], simulate(light, topo))


def test_the_astra_sim_multi_tenant_placement_file() -> None:
    keys = read_placement(DATA / "interleaved.json")
    light, heavy = _light(), _heavy()
    from_file = combine([light, heavy], keys, num_npus=8)
    assert [j.npu for j in from_file.jobs] == EVEN_ODD and from_file.placement() == keys
    from_list = combine([light, heavy], EVEN_ODD, num_npus=8)
    assert from_file.trace.ops.equals(from_list.trace.ops)
    assert from_file.trace.params["comm_groups"] == from_list.trace.params["comm_groups"]
    # a group keeps its members' order, mapped: J1's tp0 = ranks [0, 1] runs on NPUs [1, 3]
    tp0 = next(new for new, own in from_file.jobs[1].groups.items() if own == "tp0")
    assert from_file.trace.params["comm_groups"][tp0] == [1, 3]


@pytest.mark.parametrize("congestion", ["unaware", "aware"])
def test_a_job_on_links_of_its_own_equals_its_own_simulation(congestion: str) -> None:
    # ring:8 cut in halves: every shortest route between NPUs 0..3 stays on 0..3 (at most 3 hops
    # one way, 5 the other), and the same for 4..7, so the halves share no link
    topo, config = Topology.from_spec(RING8), SimConfig(congestion=congestion)
    light, heavy = _light(), _heavy()
    together = simulate_jobs([light, heavy], topo, config=config)
    _same_job(together.jobs[0], simulate(light, topo, config=config))
    upper = {f"J0-{r}": r + 4 for r in range(4)}
    _same_job(together.jobs[1], simulate_jobs([heavy], topo, placement=upper, config=config).jobs[0])
    # an expanded job keeps its collective blocks (each holds the comm slot, as its node did)
    expanded = expand(light, "ring").trace
    _same_job(
        simulate_jobs([heavy, expanded], topo, config=config).jobs[1], simulate(expanded, topo, config=config)
    )


def test_a_message_queues_behind_a_heavy_neighbour_on_a_shared_link() -> None:
    # uniring:4: J0 sends S from NPU 0 to 2 over links 0→1, 1→2; J1 sends 4S from NPU 1 to 3 over
    # 1→2, 2→3, starting at once. Store-and-forward (ASTRA-sim's aware links): a hop of b bytes holds
    # its link floor(b / bw) and lands floor(lat + b / bw) after it starts.
    size, lat = 1 << 20, 500
    bw = 50 * GIB / 1e9  # bytes per ns of a 50 GB/s link (GB = 2^30)
    hop = math.floor(lat + size / bw)  # 20031
    held = math.floor(4 * size / bw)  # 78125: J1's 4S holds 1→2 from t = 0
    topo = Topology.from_spec(f"uniring:4,bw=50,lat={lat}")
    place = {"J0-0": 0, "J0-1": 2, "J1-0": 1, "J1-1": 3}
    jobs = [p2p_trace(size), p2p_trace(4 * size)]
    aware = SimConfig(congestion="aware")
    alone = simulate_jobs(jobs[:1], topo, placement={"J0-0": 0, "J0-1": 2}, config=aware).jobs[0]
    together = simulate_jobs(jobs, topo, placement=place, config=aware).jobs[0]
    assert alone.total_ns == 2 * hop == 40062
    # J0 reaches NPU 1 at `hop`, waits for 1→2 until `held`, then one more hop: slower, and by
    # no more than the neighbour's time on the shared link
    assert together.total_ns == held + hop == 98156
    assert alone.total_ns < together.total_ns <= alone.total_ns + held
    # the congestion-unaware model lets both messages cross 1→2 at full speed: no change
    unaware = [
        simulate_jobs(j, topo, placement=p, config=SimConfig()).jobs[0].total_ns
        for j, p in ((jobs[:1], {"J0-0": 0, "J0-1": 2}), (jobs, place))
    ]
    assert unaware == [2 * lat + math.floor(size / bw)] * 2


@pytest.mark.parametrize(
    ("placement", "message"),
    [
        (
            {"J0-0": 0, "J0-1": 9, "J1-0": 2, "J1-1": 3},
            "placement: J0-1 is on NPU 9, outside the topology's NPUs 0..3",
        ),
        ({"J0-0": 0, "J0-1": 1, "J1-0": 1, "J1-1": 3}, "placement: J0-1 and J1-0 are both on NPU 1"),
        ({"J0-0": 0, "J0-1": 1, "J1-0": 2}, "placement: J1-1 (rank 1 of J1 ('p2p')) is not placed"),
        ({"J0-0": 0, "J0-1": 1, "J2-0": 2}, "placement: J2-0 names job J2, but 2 jobs were given (J0, J1)"),
        ({"J0-0": 0, "J0-5": 1}, "placement: J0-5 names rank 5 of J0 ('p2p'), which has ranks 0..1"),
        ({"job0-0": 0}, "placement: key 'job0-0' is not J<job>-<rank> (e.g. J0-0)"),
        ({"J0-0": "1"}, "placement: J0-0 is '1', not an NPU number"),
        ({"J0-0": 0, "J00-0": 1}, "placement: J0-0 is given twice"),
        ([{0: 0, 1: 1}, {0: 2, 1: -1}], "placement: J1-1 is on NPU -1, outside the topology's NPUs 0..3"),
    ],
)
def test_bad_placements_are_one_line_errors(placement: Any, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        combine([p2p_trace(64), p2p_trace(64)], placement, num_npus=4)
    assert str(err.value) == message


def test_other_refusals_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"^placement: the jobs need 6 NPUs \(J0: 2, J1: 4\) but the topology has 4$"
    ):
        combine([p2p_trace(64), _light()], num_npus=4)
    with pytest.raises(
        ConfigError, match=r"^J0 \('p2p'\): rank 0 node 1 names peer 3 \(comm_dst\), which is not a rank"
    ):
        combine([_only_rank_0(p2p_trace(64, dst=3))], {"J0-0": 0}, num_npus=4)
    (tmp_path / "twice.json").write_text('{"J0-0": 0, "J0-0": 1}')
    with pytest.raises(ConfigError, match=r"twice.json: placement key 'J0-0' is given twice$"):
        read_placement(tmp_path / "twice.json")
    (tmp_path / "list.json").write_text("[0, 1]")
    with pytest.raises(ConfigError, match=r"list.json: expected an object"):
        read_placement(tmp_path / "list.json")


def _only_rank_0(trace: Trace) -> Trace:
    return trace.replace(ops=trace.ops.filter(pc.equal(trace.ops["rank"], 0)))


def _cli(capsys: pytest.CaptureFixture[str], store: Path, *args: str) -> tuple[int, str, str]:
    code = main(["--store", str(store), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_runs_jobs_together_and_records_a_run_per_job(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    s = tmp_path / "s"
    with open_store(s, write=True) as store:
        store.ingest(_light(), name="light")
        store.ingest(_heavy(), name="heavy")
    placement = str(DATA / "interleaved.json")
    args = ["sim", "light", "heavy", "--topo", RING8, "--congestion", "aware", "--placement", placement]
    code, out, _ = _cli(capsys, s, *args, "--format", "json")
    assert code == 0
    rows = json.loads(out)
    assert [(r["job"], r["run_id"], r["trace"]) for r in rows] == [
        ("all", 1, "light+heavy"),
        ("J0", 2, "light"),
        ("J1", 3, "heavy"),
    ]
    expected = simulate_jobs(
        [_light(), _heavy()],
        Topology.from_spec(RING8),
        placement=EVEN_ODD,
        config=SimConfig(congestion="aware"),
    )
    assert [r["total_ns"] for r in rows] == [expected.joint.total_ns, *(j.total_ns for j in expected.jobs)]
    with open_store(s, read_only=True) as store:
        runs = store.sql("SELECT run_id, trace, total_ns, params FROM runs ORDER BY run_id").to_pylist()
        joined = store.sql(
            "SELECT t.run_id, count(*) AS n FROM op_timings t JOIN ops o "
            "ON o.trace = t.trace AND o.rank = t.rank AND o.id = t.id GROUP BY t.run_id ORDER BY t.run_id"
        ).to_pylist()
        links = store.sql("SELECT run_id, count(*) AS n FROM link_util GROUP BY run_id").to_pylist()
    assert json.loads(runs[0]["params"])["user"]["jobs"]["placement"] == read_placement(placement)
    job = json.loads(runs[1]["params"])["user"]["job"]
    assert job == {"job": "J0", "joint_run": 1, "placement": {f"J0-{r}": 2 * r for r in range(4)}}
    # each job's op timings join its own stored trace; the shared links stay with the joint run
    assert joined == [{"run_id": 2, "n": _light().num_ops}, {"run_id": 3, "n": _heavy().num_ops}]
    assert links == [{"run_id": 1, "n": Topology.from_spec(RING8).num_links}]
    code, out, _ = _cli(capsys, s, *args, "--table", "ranks", "--format", "csv", "--no-record")
    assert code == 0 and out.splitlines()[0].startswith("job,rank,npu,total_ns") and "J1,3,7," in out
    code, out, err = _cli(capsys, s, "sim", "light", "--topo", RING8, "--placement", placement, "--no-record")
    assert code == 1 and err == "etstore: error: placement: J1-0 names job J1, but 1 job was given (J0)\n"
    code, out, _ = _cli(capsys, s, "sim", "light", "light", "--topo", RING8)
    assert (
        code == 0
        and "run 4: 2 jobs (light, light)" in out
        and "SELECT * FROM runs WHERE run_id IN (4, 5, 6)" in out
    )


def test_cli_refusals_record_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    s = tmp_path / "s"
    with open_store(s, write=True) as store:
        store.ingest(_light(), name="light")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"J0-0": 0, "J0-1": 1, "J0-2": 2, "J0-3": 3, "J1-0": 3}))
    for extra, message in (
        (["--placement", str(bad)], "placement: J0-3 and J1-0 are both on NPU 3"),
        (["--comm-groups", str(bad)], "sim: --comm-groups replaces one trace's groups"),
        (["--slow", "0=2"], "sim: --slow, --scale and --jitter take one trace"),
    ):
        code, out, err = _cli(capsys, s, "sim", "light", "light", "--topo", "ring:8", *extra)
        assert (
            code == 1 and out == "" and err.startswith(f"etstore: error: {message}") and err.count("\n") == 1
        )
    with open_store(s, read_only=True) as store:
        assert store.sql("SELECT count(*) AS n FROM runs").to_pylist() == [{"n": 0}]
