"""The end-to-end demo behind ``etstore demo``.

Ingest a real recorded trace (``examples/dlrm_8r``: 8-rank DLRM, PyTorch execution traces
linked with their Kineto traces) and an MSCCL-IR algorithm → query (Cypher, SQL) → check
the algorithm → expand the trace's collectives into sends, receives and reductions →
simulate (the same algorithms as collective nodes and expanded, then ASTRA-sim's native
ring) → replay the recorded step as it ran → find the work each thread or stream could run
while it waited, each opportunity measured by replay → rewrite → compare (the win realised)
→ export (.et, MSCCL-IR) → one HTML report. Every step is a library call the CLI also makes; a
step that cannot apply to the trace says so in one line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from etstore.algorithms.check import check_algorithm
from etstore.algorithms.generators import GENERATORS, generate
from etstore.algorithms.specs import parse_generator
from etstore.analysis import critical_path
from etstore.app.compare import Comparison, compare
from etstore.app.expand import expand_stored
from etstore.app.opportunities import find_and_record
from etstore.app.rewrite import rewrite_stored
from etstore.cli._console import styled
from etstore.cli._render import recognised_line, render
from etstore.cli.analysis import hoist_table
from etstore.errors import ConfigError
from etstore.formats import read_trace
from etstore.formats.export import export_trace
from etstore.formats.msccl_writer import write_msccl_xml
from etstore.model import Trace
from etstore.report import write_report
from etstore.sim import SimConfig, SimResult, simulate
from etstore.sim.replay import replay
from etstore.store import open_store
from etstore.store.base import Store
from etstore.topology import parse_topology

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "ALLTOALL_GENERATOR",
    "DEMO_LIMIT",
    "EXAMPLES",
    "OWN_RECORDING",
    "RING_GENERATOR",
    "TOPOLOGY",
    "register",
    "run_demo",
]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TOPOLOGY = "switch:8,bw=50,lat=500"  # 8 NPUs on one switch, like the 8 GPUs of the recorded DLRM run
RING_GENERATOR = "ring:2"  # all-reduce when the shipped MSCCL-IR ring has another rank count
ALLTOALL_GENERATOR = "direct"  # all-to-all: every rank sends each peer its block directly
DEMO_LIMIT = 12  # opportunities measured (two replays of the DLRM each, ≈ 0.4 s)
OWN_RECORDING = EXAMPLES.parent / "tests" / "data" / "torch_fsdp2_2r"  # examples/pytorch/record.py's


def _workload_dir() -> Path:
    """The shipped recorded trace: 8-rank DLRM, PyTorch ET + Kineto per rank (gzip JSON)."""
    shipped = EXAMPLES / "dlrm_8r"
    if not shipped.is_dir():
        raise ConfigError(
            f"the demo trace {shipped} is missing; the demo runs from a source checkout of etstore"
        )
    return shipped


def _algorithm_xml() -> Path:
    """The shipped MSCCL-IR ring all-reduce (4 ranks, 2 channels), or a fresh copy."""
    shipped = EXAMPLES / "algorithms" / "ring_allreduce_4r.xml"
    if shipped.is_file():
        return shipped
    out = Path(tempfile.mkdtemp(prefix="etstore-examples-")) / "ring_allreduce_4r.xml"
    return write_msccl_xml(
        generate("ring", coll="allreduce", ranks=4, chunks=2), out, name="ring_allreduce_4r"
    )


def _ranks_of(algorithm: Trace) -> int:
    """Rank count of an ingested MSCCL-IR algorithm (its ``ngpus``, else its ranks)."""
    ngpus = algorithm.params.get("ngpus")
    return int(ngpus) if ngpus is not None else algorithm.num_ranks


def _us(ns: float) -> str:
    return f"{ns / 1e3:,.1f} µs"


def run_demo(*, store_location: str | None, console: Console, out_dir: Path) -> Path:
    """Run every stage on the shipped examples, printing each; returns the report's path.

    Parameters
    ----------
    store_location
        Store directory (``None``: ``$ETSTORE_STORE``, then ``./.etstore``); the demo writes,
        so a ``neo4j://`` URL is refused (publish the demo's store there instead).
    console
        Where each stage prints its heading, queries and tables.
    out_dir
        Directory for the exported ``.et`` files, the MSCCL-IR file and ``report.html``
        (created if absent).

    Returns
    -------
    Path
        The HTML report.

    Raises
    ------
    EtstoreError
        Whatever the stage that fails raises (a store that cannot be opened, most often).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    with open_store(store_location, write=True) as store:
        name, algo, ring_fits = _ingest_step(store, console)
        _query_steps(store, name, console)
        expanded = _expand_step(store, name, algo if ring_fits else None, console)

        base = _simulate_step(store, name, expanded, algo if ring_fits else None, console)

        runs, traces, totals = [base.run_a, base.run_b], [name, expanded], [base.total_a_ns, base.total_b_ns]
        _replay_step(store, name, console)
        for final in (_overlap_steps(store, name, console), _own_recording_step(store, console)):
            if final is not None:
                runs += [final.run_a, final.run_b]
                traces += [final.trace_a, final.trace_b]
                totals += [final.total_a_ns, final.total_b_ns]
        last = expanded

        console.rule("9. export: the expanded trace for ASTRA-sim, the algorithm for MSCCL/RCCL")
        paths = export_trace(store.load(last), out_dir / last)  # as ASTRA-sim runs them
        xml_out = write_msccl_xml(store.load(algo), out_dir / f"{algo}.xml")
        console.print(f"wrote {len(paths)} files ({last}) and {xml_out.name} under {out_dir}/")
        for line in paths.changes:
            console.print(f"changed for ASTRA-sim: {line}", soft_wrap=True)

        console.rule("10. report")
        html = write_report(store.warehouse, runs, out_dir / "report.html")
        render(
            pa.table({"run": runs, "trace": traces, "simulated": [_us(v) for v in totals]}),
            console=console,
        )
        console.print(styled("report: ", (str(html.resolve()), "bold")), soft_wrap=True)
    return html


def _ingest_step(store: Store, console: Console) -> tuple[str, str, bool]:
    """Step 1: the recorded DLRM trace and the MSCCL-IR ring; returns their names and whether
    the ring's rank count fits the trace."""
    console.rule("1. ingest a recorded trace (8-rank DLRM, PyTorch ET + Kineto) and an MSCCL-IR algorithm")
    src = _workload_dir()
    trace = read_trace(src, name="dlrm_8r")
    report = store.ingest(trace)
    name = report.trace.name
    console.print(
        "recorded: DLRM training step on 8 GPUs with NCCL (facebookresearch/param test inputs; "
        "see examples/dlrm_8r/SOURCE.md)",
        style="dim",
    )
    console.print(recognised_line(name, trace.params) or name, highlight=False, soft_wrap=True)
    console.print(
        styled(
            f"{src} → trace ",
            (name, "bold"),
            f": {report.trace.ops:,} ops, {report.trace.deps:,} deps over {trace.num_ranks} ranks"
            + ("" if report.created else " (already stored: same content)"),
        )
    )
    xml = _algorithm_xml()
    algo = store.ingest(read_trace(xml)).trace.name
    algorithm = store.load(algo)
    check = check_algorithm(algorithm)
    console.print(styled(f"{xml.name} → algorithm ", (algo, "bold"), f"; check: {check.summary()}"))
    return name, algo, _ranks_of(algorithm) == trace.num_ranks


def _query_steps(store: Store, name: str, console: Console) -> None:
    """Steps 2 and 3: who waits on an all-to-all (Cypher); collectives per rank and type (SQL)."""
    console.rule("2. Cypher: who waits on an all-to-all, and through which dependency?")
    q = (
        "MATCH (t:Trace {name: $t}), (c:Op)-[d:DEP]->(w:Op) "
        "WHERE c.trace_id = t.trace_id AND c.comm_type = 'ALL_TO_ALL' "
        "RETURN w.type AS waiter, w.comm_type AS waiter_collective, d.kind AS dep, "
        "count(*) AS edges, count(DISTINCT c.rank) AS ranks ORDER BY waiter, waiter_collective, dep"
    )
    console.print(q, style="dim", markup=False)
    render(store.cypher(q, {"t": name}).to_arrow(), console=console)
    console.print(
        "the kernel is waited on through ctrl (the next collective on its stream, compute-stream kernels "
        "held by a recorded stream wait); the ops that read its buffers depend, by storage bytes, on the "
        "record_param_comms call that launched it",
        style="dim",
    )

    console.rule("3. SQL: collectives and bytes per rank and comm_type")
    q = (
        "SELECT rank, comm_type, count(*) AS ops, sum(comm_size) AS bytes, max(comm_size) AS largest "
        "FROM ops WHERE trace = $t AND type = 'COMM_COLL_NODE' GROUP BY ALL ORDER BY rank, comm_type"
    )
    console.print(q, style="dim", markup=False)
    render(store.sql(q, {"t": name}).to_arrow(), console=console)


def _expand_step(store: Store, name: str, ring: str | None, console: Console) -> str:
    """Step 4: expand every collective; all-reduce with the MSCCL-IR ring when it fits."""
    allreduce = ring or RING_GENERATOR
    console.rule(
        f"4. expand every collective: all-reduce with {allreduce}, all-to-all with {ALLTOALL_GENERATOR}"
    )
    if ring is None:
        console.print(
            f"the shipped MSCCL-IR ring does not have the trace's 8 ranks: all-reduce uses the built-in "
            f"{RING_GENERATOR} generator ({GENERATORS['ring'].description})",
            style="yellow",
            soft_wrap=True,
        )
    # reductions keep the algorithm's zero duration: the simulator charges them by local-memory
    # passes, as it charges the same reductions inside a collective node (docs/simulator.md)
    done = expand_stored(store, name, {"allreduce": allreduce, "alltoall": ALLTOALL_GENERATOR})
    expanded = done.report.trace.name
    console.print(
        styled(
            (expanded, "bold"),
            f": {done.report.trace.ops:,} ops ({done.expansion.lineage.num_rows:,} new, "
            f"replacing {done.expansion.collectives.num_rows} collective instances)",
        )
    )
    q = (
        "MATCH (t:Trace {name: $t}), (c:Op)-[:BECOMES]->(x:Op) WHERE c.trace_id = t.trace_id AND c.rank = 0 "
        "RETURN c.id AS collective, c.comm_type AS type, c.comm_size AS bytes, count(x) AS ops, "
        "sum(CASE WHEN x.type = 'COMM_SEND_NODE' THEN x.comm_size ELSE 0 END) AS bytes_sent "
        "ORDER BY collective LIMIT 8"
    )
    console.print(q, style="dim", markup=False)
    render(store.cypher(q, {"t": name}).to_arrow(), console=console)
    return expanded


def _simulate_step(store: Store, name: str, expanded: str, ring: str | None, console: Console) -> Comparison:
    """Step 5: the recorded trace with the expansion's algorithms vs the expanded trace, then the
    recorded trace with ASTRA-sim's native collectives, and what differs between them."""
    gen, chunks = parse_generator(RING_GENERATOR)
    allreduce: Any = store.load(ring) if ring else gen
    algorithms = {"ALL_REDUCE": allreduce, "ALL_TO_ALL": ALLTOALL_GENERATOR}
    config = SimConfig(algorithm_chunks=chunks or 1)
    label = ring or RING_GENERATOR
    console.rule(f"5. simulate: the recorded trace running {label} / {ALLTOALL_GENERATOR} vs its expansion")
    base = compare(store, name, expanded, TOPOLOGY, config=config, algorithms=algorithms)
    change = base.diff_ns / base.total_a_ns * 100 if base.total_a_ns else 0.0
    console.print(
        f"{name} (collective nodes run {label} all-reduce, {ALLTOALL_GENERATOR} all-to-all): "
        f"{_us(base.total_a_ns)} (run {base.run_a});  {expanded}: {_us(base.total_b_ns)} "
        f"(run {base.run_b}): {change:+.3f}%",
        soft_wrap=True,
    )
    console.print(
        "same algorithms, same cost model (a reduction costs its local-memory passes on both paths): "
        "expanding changes no time by itself; what it gives is per-chunk ops to analyse and rewrite",
        style="dim",
        soft_wrap=True,
    )
    _comm_end_line(store, base, console)
    native = simulate(store.load(name), parse_topology(TOPOLOGY), config=config)
    console.print(
        f"with ASTRA-sim's native ring collectives instead (4 chunks, an endpoint delay per step): "
        f"{_us(native.total_ns)}, last communication ending at "
        f"{_us(_last_comm_ns(native))}: a different algorithm, not the expansion",
        soft_wrap=True,
    )
    return base


def _last_comm_ns(result: SimResult) -> float:
    """When the last send, receive or collective of a replay ends (ns)."""
    ops = result.ops
    comm = ops.filter(pc.starts_with(ops["type"], "COMM"))
    return float(pc.max(comm["end_ns"]).as_py() or 0.0) if comm.num_rows else 0.0


def _comm_end_line(store: Store, base: Comparison, console: Console) -> None:
    """When the last communication ends in each run: the part of step 5 the expansion can move."""
    q = (
        "SELECT t.run_id AS run, max(t.end_ns) AS last_ns FROM op_timings t JOIN ops o "
        "ON o.trace = t.trace AND o.rank = t.rank AND o.id = t.id "
        "WHERE t.run_id IN ($a, $b) AND o.type LIKE 'COMM%' GROUP BY ALL"
    )
    ends = {
        r["run"]: r["last_ns"]
        for r in store.sql(q, {"a": base.run_a, "b": base.run_b}).to_arrow().to_pylist()
    }
    if base.run_a in ends and base.run_b in ends:
        console.print(
            f"last communication ends at {_us(ends[base.run_a])} (collective nodes) and "
            f"{_us(ends[base.run_b])} (expanded); what follows it on each rank is recorded compute",
            soft_wrap=True,
        )


def _replay_step(store: Store, name: str, console: Console) -> None:
    """Step 6: the recorded step replayed as it ran, and its critical path."""
    console.rule("6. the recorded step replayed as it ran, and its critical path")
    recorded = store.load(name)
    rep = replay(recorded)
    render(rep.steps, console=console)
    fit = replay(recorded, fit=True)
    worst, worst_fit = (max(abs(e) for e in r.steps["error_pct"].to_pylist()) for r in (rep, fit))
    console.print(
        f"every rank's simulated step within {worst:.1f}% of its measured one, each collective "
        f"lasting as it ran after its last peer arrived; within {worst_fit:.1f}% on "
        f"{fit.topology.name}, the network fitted to its collectives that what-ifs change "
        "(etstore replay [--topo fitted|SPEC])",
        soft_wrap=True,
    )
    cp = critical_path(recorded)
    console.print(
        f"{cp.length_micros:,.0f} µs over {cp.path.num_rows} ops (CPU ops, their kernel launches and "
        "the NCCL kernels, as timed by Kineto)",
        soft_wrap=True,
    )
    render(
        cp.path.select(["step", "rank", "name", "type", "duration_micros", "via"]).slice(0, 6),
        console=console,
    )


def _overlap_steps(store: Store, name: str, console: Console) -> Comparison | None:
    """Steps 7 and 8: the recording's overlap opportunities, each measured by replaying it with
    the opportunity applied; then all of them applied and compared: the win realised."""
    console.rule(
        "7. opportunities: work a thread or stream could run while it waits, each measured by replay"
    )
    found = find_and_record(store, name, kinds=("overlap",), limit=DEMO_LIMIT)
    details = [json.loads(d) for d in found["detail"].to_pylist()]
    if not found.num_rows:
        console.print("no lane of the recording waits with independent work behind it", style="yellow")
        return None
    render(hoist_table(found), console=console)
    estimated = sum(found["gain_ns"].to_pylist())
    console.print(
        f"{found.num_rows} opportunities; each gain is what it takes off the replayed step on top of "
        f"the ones above it: together {_us(estimated)}",
        soft_wrap=True,
    )
    console.rule("8. rewrite: apply them, then compare the two recordings replayed as they ran")
    rewritten = rewrite_stored(store, name, "overlap").trace.name
    after = compare(store, name, rewritten)
    moved = sum(len(m["moved"]) for d in details for m in d["moves"])
    held = sorted({d["held"] for d in details})
    console.print(
        f"{name}: {_us(after.total_a_ns)} → {rewritten}: {_us(after.total_b_ns)} "
        f"({after.diff_ns / after.total_a_ns * 100:+.1f}%): estimated {_us(estimated)}, realised "
        f"{_us(-after.diff_ns)}. What changed: {moved:,} ops moved earlier on their own thread or "
        f"stream, in front of {', '.join(held)}, where the recording had them wait; every data, "
        "overwrite, launch, wait and process-group dependency kept",
        soft_wrap=True,
    )
    t = after.table
    per_rank = pa.table(
        {
            "rank": t["rank"],
            "before": [_us(v) for v in t["total_a_ns"].to_pylist()],
            "after": [_us(v) for v in t["total_b_ns"].to_pylist()],
            "speedup": [f"{v:.3f}" for v in t["speedup"].to_pylist()],
        }
    )
    render(per_rank, title="per rank (the last row, without a rank, is the makespan)", console=console)
    return after


def _own_recording_step(store: Store, console: Console) -> Comparison | None:
    """The same, in one line, on a recording made with ``examples/pytorch/record.py``: FSDP2 on
    two CPU ranks with gloo."""
    if not OWN_RECORDING.is_dir():
        console.print(f"{OWN_RECORDING} is missing: skipping the FSDP2 recording", style="yellow")
        return None
    name = store.ingest(read_trace(OWN_RECORDING), name="fsdp2_2r").trace.name
    found = find_and_record(store, name, kinds=("overlap",), limit=DEMO_LIMIT)
    if not found.num_rows:
        return None
    after = compare(store, name, rewrite_stored(store, name, "overlap").trace.name)
    console.print(
        f"the same on {name} (FSDP2, 2 CPU ranks, gloo; recorded by examples/pytorch/record.py): "
        f"{found.num_rows} opportunities, estimated {_us(sum(found['gain_ns'].to_pylist()))}, realised "
        f"{_us(-after.diff_ns)} ({after.diff_ns / after.total_a_ns * 100:+.1f}% of "
        f"{_us(after.total_a_ns)})",
        soft_wrap=True,
    )
    return after


def _demo(args: argparse.Namespace, console: Console) -> int:
    run_demo(store_location=args.store, console=console, out_dir=Path(args.out))
    return 0


def register(sub: Any) -> None:
    """Add ``demo`` to the subparsers ``sub``."""
    sp = sub.add_parser("demo", help="run the end-to-end demo on shipped examples")
    sp.add_argument(
        "--out", default="etstore-demo", help="directory for exported files (default: etstore-demo)"
    )
    sp.set_defaults(handler=_demo)
