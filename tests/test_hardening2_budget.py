"""The memory budget covers what grows with a user-given size (issue 35, round 2, item 3).

Topologies a simulation routes over, synthesis chunks, every text reader (MSCCL-IR XML,
nccl-tests and tuner logs, communicator groups, Kineto and PyTorch JSON, topology files) and
gzip streams of ``.et`` frames: each is estimated before it is allocated and refused in the
budget's one line. The real counts stay under the estimates (``tests/test_limits.py`` holds
the older limits).
"""

from __future__ import annotations

import gzip
import json
import resource
import shutil
import subprocess
import sys
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest

from etstore.algorithms import _synth_budget
from etstore.algorithms.synth import synthesize
from etstore.errors import ConfigError, TopologyError, TraceFormatError, UnsatisfiableError
from etstore.formats import _frames, read_et, read_trace
from etstore.formats.files import read_comm_groups
from etstore.formats.nccl_tests import read_nccl_tests
from etstore.formats.tuner import read_tuner_log
from etstore.testing import ring_allreduce_xml
from etstore.topology import Topology, parse_topology

ROOT = Path(__file__).resolve().parents[1]
KNOB = r"set the environment variable ETSTORE_MEMORY_BUDGET"


@pytest.fixture
def budget(monkeypatch: pytest.MonkeyPatch) -> object:
    def set_budget(size: str) -> None:
        monkeypatch.setenv("ETSTORE_MEMORY_BUDGET", size)

    return set_budget


# ---------------------------------------------------------------- topologies a simulation routes over


def _capped(limit: int) -> None:
    """In the child: an address space of ``limit`` bytes, so a bomb fails fast instead of swapping."""
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def test_sim_refuses_a_topology_bomb_in_one_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.0.json"
    trace.write_text(
        json.dumps({"workload_graph": [{"Id": 1, "Name": "a", "NodeType": 4, "runtime": 5, "ctrlDeps": []}]})
    )
    etstore = shutil.which("etstore", path=str(Path(sys.executable).parent)) or "etstore"
    store = ["--store", str(tmp_path / "s")]
    assert (
        subprocess.run([etstore, *store, "ingest", str(trace), "--name", "t"], capture_output=True).returncode
        == 0
    )

    def sim(*more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [etstore, *store, "sim", "t", "--topo", "hypercube:65536", "--no-record", *more],
            capture_output=True,
            text=True,
            env={"ETSTORE_MEMORY_BUDGET": "2GiB", "PATH": "/usr/bin:/bin"},
            preexec_fn=lambda: _capped(6 << 30),  # the N x N table was 16 GiB before the check
            timeout=120,
        )

    # unaware, an intact built-in shape is routed by its rule: no table, it runs within the cap
    assert sim().returncode == 0
    run = sim("--congestion", "aware")  # the aware model's hop table is N x N: refused first
    assert run.returncode == 1 and run.stderr.count("\n") == 1, run.stderr[-2000:]
    assert run.stderr.startswith(
        "etstore: error: topology hypercube:65536,bw=50,lat=500: the 65,536 x 65,536 routing table "
        "needs about 48 GiB, more than the memory budget of 2 GiB ("
    ), run.stderr


@pytest.mark.parametrize("spec", ["hypercube:65536", "mesh:" + "x".join(["2"] * 16)])
def test_routes_are_checked_before_any_table(budget: object, spec: str) -> None:
    budget("2GiB")  # type: ignore[operator]
    topo = Topology.from_spec(spec)  # building it and describing it need no N x N table
    assert topo.describe()["npus"] == 65536
    with pytest.raises(TopologyError, match=rf"65,536 x 65,536 routing table needs about 48 GiB, .*\({KNOB}"):
        topo.require_routes()
    Topology.from_spec("ring:64").require_routes()  # a small one passes


# ---------------------------------------------------------------- synthesis


@pytest.mark.parametrize(
    ("spec", "coll", "k"),
    [
        ("ring:4", "alltoall", 3),
        ("ring:7", "alltoall", 2),
        ("mesh2d:4x5", "alltoall", 1),
        ("torus2d:4x6", "alltoall", 1),
        ("uniring:5", "alltoall", 2),
        ("fc:4+ring:6", "alltoall", 1),
        ("switch:4+mesh:3", "alltoall", 1),
        ("ring:6", "allreduce", 2),
        ("mesh2d:3x3", "broadcast", 3),
        ("ring:5", "reduce", 2),
        ("ring:5", "reducescatter", 2),
        ("fc:5", "allgather", 2),
    ],
)
def test_transfer_estimate_is_the_schedule_length(spec: str, coll: str, k: int) -> None:
    topo = parse_topology(spec)
    result = synthesize(topo, coll=coll, chunks_per_npu=k, trials=2)
    assert _synth_budget.transfers(topo, coll, k) == len(result.schedule)


@pytest.mark.parametrize(("spec", "coll", "k"), [("ring:8", "allgather", 1000), ("ring:4", "alltoall", 3000)])
def test_synthesis_stays_under_its_estimate(spec: str, coll: str, k: int) -> None:
    topo = parse_topology(spec)
    tracemalloc.start()
    try:
        result = synthesize(topo, coll=coll, chunks_per_npu=k, trials=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    per = (
        _synth_budget.ROUTED_BYTES_PER_TRANSFER
        if coll == "alltoall"
        else _synth_budget.FLOOD_BYTES_PER_TRANSFER
    )
    assert peak <= len(result.schedule) * per


def test_synthesis_over_budget_is_refused_before_it_runs(budget: object) -> None:
    budget("64MiB")  # type: ignore[operator]
    start = time.perf_counter()
    with pytest.raises(
        UnsatisfiableError,
        match=rf"^synth: alltoall on ring:4,bw=50,lat=500 with 20,000 chunk\(s\) per NPU "
        rf"\(320,000 transfers\) needs about 78\.1 MiB, more than the memory budget of 64 MiB \({KNOB}",
    ):
        synthesize("ring:4", coll="alltoall", chunks_per_npu=20_000)
    small = synthesize("ring:4", coll="alltoall", chunks_per_npu=2_000)
    budget("2GiB")  # type: ignore[operator]
    with pytest.raises(UnsatisfiableError, match=r"8,589,803,520 transfers\) needs about 768\.0 GiB"):
        synthesize("hypercube:65536", coll="allreduce")
    assert time.perf_counter() - start < 10
    budget("1MiB")  # type: ignore[operator]
    with pytest.raises(
        UnsatisfiableError,
        match=r"^synth: building the trace 72,000 ops at a time \(32,000 transfers\) needs about 71\.1 MiB",
    ):
        next(small.trace_parts(1 << 19))


# ---------------------------------------------------------------- readers


def _nccl_log(rows: int) -> str:
    head = (ROOT / "tests/data/nccl_tests/superbench_nccl_allreduce.log").read_text().splitlines()
    at = max(i for i, line in enumerate(head) if line.startswith("#") and "size" in line and "count" in line)
    return (
        "\n".join([*head[: at + 2], *(f"{8 * i} {2 * i} float sum 1 1 1 0 1 1 1 0" for i in range(1, rows))])
        + "\n"
    )


def test_text_readers_are_checked_before_parsing(tmp_path: Path, budget: object) -> None:
    xml = tmp_path / "ring.xml"
    xml.write_text(ring_allreduce_xml(64))  # 1.6 MB: 32 MB to read
    log = tmp_path / "run.log"
    log.write_text(_nccl_log(20_000))
    tuner = tmp_path / "t.csv"
    tuner.write_text("collective,size,time_us,algo\n" + "allreduce,8,1,ring\n" * 40_000)
    groups = tmp_path / "g.comm_groups.json"
    groups.write_text(json.dumps({str(g): list(range(1000)) for g in range(800)}))
    budget("16MiB")  # type: ignore[operator]
    with pytest.raises(
        TraceFormatError,
        match=rf"ring\.xml: reading 1\.\d MiB of MSCCL-IR XML needs about 3\d\.\d MiB, .*\({KNOB}",
    ):
        read_trace(xml)
    with pytest.raises(
        TraceFormatError,
        match=rf"run\.log: reading .* of nccl-tests log in 20,0\d\d lines needs about .*\({KNOB}",
    ):
        read_nccl_tests(log)
    with pytest.raises(
        TraceFormatError, match=rf"t\.csv: reading .* of tuner log in 40,002 lines needs about .*\({KNOB}"
    ):
        read_tuner_log(tuner)
    with pytest.raises(
        ConfigError, match=rf"g\.comm_groups\.json: reading .* of communicator groups needs .*\({KNOB}"
    ):
        read_comm_groups(groups)
    budget("1GiB")  # type: ignore[operator]  # the same files read
    assert read_trace(xml).num_ranks == 64 and read_tuner_log(tuner).steps.num_rows == 40_000
    assert len(read_comm_groups(groups)) == 800 and read_nccl_tests(log) is not None


def test_json_traces_and_topology_files_are_checked_before_parsing(tmp_path: Path, budget: object) -> None:
    kineto = tmp_path / "rank0.pt.trace.json"
    events = [
        {"ph": "X", "name": f"op{i}", "cat": "cpu_op", "ts": i, "dur": 1, "pid": 1, "tid": 1}
        for i in range(20_000)
    ]
    kineto.write_text(json.dumps({"traceEvents": events}))  # 1.4 MB
    zipped = tmp_path / "rank1.pt.trace.json.gz"
    zipped.write_bytes(gzip.compress(kineto.read_bytes()))
    topo = tmp_path / "net.yaml"
    topo.write_text("npus: 64\nlinks:\n" + "".join(f"  - [{i}, {(i + 1) % 64}]\n" for i in range(64)) * 100)
    budget("8MiB")  # type: ignore[operator]  # Kineto: 699 KiB at 12 bytes a byte
    for path in (kineto, zipped):  # a gzip stream stops where the limit is passed
        with pytest.raises(
            TraceFormatError, match=rf"{path.name}: (holds|decompresses to) .*memory budget of 8 MiB"
        ):
            read_trace(path)
    with pytest.raises(
        TopologyError, match=rf"net\.yaml: parsing 79\.3 KiB of YAML needs about 15\.5 MiB, .*\({KNOB}"
    ):
        parse_topology(str(topo))
    budget("256MiB")  # type: ignore[operator]
    assert read_trace(kineto).num_ops == 20_000


# ---------------------------------------------------------------- gzip streams of .et frames


def _zeros_gz(path: Path, mib: int) -> Path:
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    path.write_bytes(b"".join(z.compress(bytes(1 << 20)) for _ in range(mib)) + z.flush())
    return path


def test_gzip_of_empty_frames_is_refused_without_inflating_it(tmp_path: Path, budget: object) -> None:
    bomb = _zeros_gz(tmp_path / "bomb.0.et.gz", 200)  # 209,715,200 empty frames, 200 KB
    budget("1GiB")  # type: ignore[operator]  # 3,355,443 nodes; 512 MiB of bytes
    tracemalloc.start()
    try:
        with pytest.raises(
            TraceFormatError, match=rf"bomb\.0\.et\.gz: at least 3,355,444 node frames, .*\({KNOB}"
        ):
            read_et(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20  # it was 400 MiB: the whole stream, then its copy


def test_running_out_of_memory_while_inflating_is_one_line(
    tmp_path: Path, budget: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Starved:
        eof = False
        unconsumed_tail = b""

        def decompress(self, data: bytes, size: int = 0) -> bytes:
            raise MemoryError

    path = tmp_path / "x.0.et.gz"
    path.write_bytes(gzip.compress(b"\x00" * 64))
    budget("8GiB")  # type: ignore[operator]
    monkeypatch.setattr(_frames.zlib, "decompressobj", lambda wbits: Starved())
    with pytest.raises(
        TraceFormatError,
        match=r"x\.0\.et\.gz: ran out of memory decompressing it, at 0 B: .*memory budget of 8 GiB",
    ):
        _frames.read_bytes(path)
