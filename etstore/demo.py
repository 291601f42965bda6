"""The end-to-end demo behind ``etstore demo``.

Ingest the shipped workload and algorithm → query (Cypher, SQL) → check the
algorithm → expand the workload's collectives into sends, receives and reductions →
simulate before and after → find chunk-level overlap → rewrite → compare → export
(.et, MSCCL-IR) → one HTML report. Every step is a library call the CLI also makes.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow as pa
from rich.console import Console

from etstore._render import render
from etstore.collectives.check import check_algorithm
from etstore.collectives.expand import expand_stored
from etstore.collectives.msccl_writer import write_msccl_xml
from etstore.ingest import read_trace, write_et
from etstore.query import critical_path
from etstore.query.overlap import find_opportunities
from etstore.query.rewrite import rewrite_stored
from etstore.report import write_report
from etstore.sim.compare import compare
from etstore.store import open_store
from etstore.workloads import transformer

__all__ = ["EXAMPLES", "TOPOLOGY", "run_demo"]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TOPOLOGY = "mesh2d:4x2,bw=50,lat=500"  # 8 NPUs: the example's 4 data-parallel x 2 tensor-parallel ranks


def _workload_dir() -> Path:
    """The shipped example workload, or a freshly generated copy when not installed from the repo."""
    shipped = EXAMPLES / "transformer_8r"
    if shipped.is_dir():
        return shipped
    tmp = Path(tempfile.mkdtemp(prefix="etstore-examples-"))
    write_et(transformer(ranks=8, layers=4, tp=2), tmp / "transformer")
    return tmp


def _algorithm_xml() -> Path:
    """The shipped MSCCL-IR ring all-reduce (4 ranks, 2 channels), or a fresh copy."""
    shipped = EXAMPLES / "algorithms" / "ring_allreduce_4r.xml"
    if shipped.is_file():
        return shipped
    from etstore.collectives.generators import generate

    out = Path(tempfile.mkdtemp(prefix="etstore-examples-")) / "ring_allreduce_4r.xml"
    return write_msccl_xml(
        generate("ring", coll="allreduce", ranks=4, chunks=2), out, name="ring_allreduce_4r"
    )


def _us(ns: float) -> str:
    return f"{ns / 1e3:,.1f} µs"


def run_demo(*, store_location: str | None, console: Console, out_dir: Path) -> Path:
    """Run every stage on the shipped examples, printing each; returns the report's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open_store(store_location) as store:
        console.rule(
            "1. ingest the example workload (8 ranks, data x tensor parallel) and an MSCCL-IR algorithm"
        )
        src = _workload_dir()
        report = store.ingest(read_trace(src, name="transformer"))
        name = report.trace.name
        console.print(
            f"{src} → trace [bold]{name}[/]: {report.trace.ops} ops, {report.trace.deps} deps, "
            f"{report.trace.messages} cross-rank messages"
            + ("" if report.created else " (already stored: same content)")
        )
        xml = _algorithm_xml()
        algo = store.ingest(read_trace(xml)).trace.name
        check = check_algorithm(store.load(algo))
        console.print(f"{xml.name} → algorithm [bold]{algo}[/]; check: {check.summary()}")

        console.rule("2. Cypher: who waits on a message from another rank?")
        q = (
            "MATCH (s:Op)-[:MSG]->(r:Op)-[:DEP]->(c:Op) WHERE s.trace = $t "
            "RETURN s.rank AS from_rank, r.rank AS to_rank, s.name AS send, c.name AS waits "
            "ORDER BY from_rank"
        )
        console.print(q, style="dim")
        render(store.cypher(q, {"t": name}).to_arrow(), console=console)

        console.rule("3. SQL: collective bytes per communicator group")
        q = (
            "SELECT pg_name, comm_type, count(*) AS ops, sum(comm_size) AS bytes FROM ops "
            "WHERE trace = $t AND type = 'COMM_COLL_NODE' GROUP BY ALL ORDER BY pg_name, comm_type"
        )
        console.print(q, style="dim")
        render(store.sql(q, {"t": name}).to_arrow(), console=console)

        console.rule("4. expand every collective: all-reduce with the MSCCL-IR ring, the rest with ring:2")
        done = expand_stored(
            store,
            name,
            {"allreduce": algo, "allgather": "ring:2", "reducescatter": "ring:2"},
            reduce_duration_micros=1,
        )
        expanded = done.report.trace.name
        console.print(
            f"[bold]{expanded}[/]: {done.report.trace.ops:,} ops ({done.expansion.lineage.num_rows:,} new, "
            f"replacing {done.expansion.collectives.num_rows} collective instances)"
        )
        q = (
            "MATCH (c:Op)-[:BECOMES]->(x:Op) WHERE c.trace = $t AND c.rank = 0 "
            "RETURN c.name AS collective, c.comm_type AS type, count(x) AS ops, "
            "sum(CASE WHEN x.type = 'COMM_SEND_NODE' THEN x.comm_size ELSE 0 END) AS bytes_sent "
            "ORDER BY collective LIMIT 6"
        )
        console.print(q, style="dim")
        render(store.cypher(q, {"t": name}).to_arrow(), console=console)

        console.rule(f"5. simulate workload (native collectives) vs expanded on {TOPOLOGY}")
        base = compare(store, name, expanded, TOPOLOGY)
        console.print(
            f"{name}: {_us(base.total_a_ns)} (run {base.run_a});  {expanded}: {_us(base.total_b_ns)} "
            f"(run {base.run_b})"
        )

        console.rule("6. chunk-level overlap: consumers that could start as each chunk arrives")
        found = find_opportunities(store, expanded, run_id=base.run_b)
        if found.num_rows:
            top = found.sort_by([("gain_ns", "descending")]).slice(0, 5)
            cols = [c for c in ("kind", "rank", "op_id", "other_id", "gain_ns") if c in top.column_names]
            render(top.select(cols), console=console)
        console.print(f"{found.num_rows} opportunities recorded in the opportunities table")

        console.rule("7. rewrite: split those consumers per chunk, then compare")
        rewritten = rewrite_stored(store, expanded, "chunk-split", run_id=base.run_b).trace.name
        after = compare(store, expanded, rewritten, TOPOLOGY)
        console.print(
            f"{expanded}: {_us(after.total_a_ns)} → {rewritten}: {_us(after.total_b_ns)} "
            f"({after.diff_ns / after.total_a_ns * 100:+.1f}%)"
        )
        keep = [
            c
            for c in ("rank", "total_a_ns", "total_b_ns", "diff_ns", "speedup")
            if c in after.table.column_names
        ]
        render(after.table.select(keep), title="per rank (ns; the last row is the total)", console=console)

        console.rule("8. critical path of the workload across ranks")
        cp = critical_path(store.load(name))
        console.print(f"{cp.length_micros:,.0f} µs over {cp.path.num_rows} ops; the first few:")
        render(
            cp.path.select(["step", "rank", "name", "type", "duration_micros", "via"]).slice(0, 6),
            console=console,
        )

        console.rule("9. export: the rewritten trace for ASTRA-sim, the algorithm for MSCCL/RCCL")
        paths = write_et(store.load(rewritten), out_dir / rewritten)
        xml_out = write_msccl_xml(store.load(algo), out_dir / f"{algo}.xml")
        console.print(f"wrote {len(paths)} .et files and {xml_out.name} under {out_dir}/")

        console.rule("10. report")
        html = write_report(store.duck, [base.run_a, after.run_a, after.run_b], out_dir / "report.html")
        summary = pa.table(
            {
                "run": [base.run_a, after.run_a, after.run_b],
                "trace": [name, expanded, rewritten],
                "simulated": [_us(base.total_a_ns), _us(after.total_a_ns), _us(after.total_b_ns)],
            }
        )
        render(summary, console=console)
        console.print(f"report: [bold]{html.resolve()}[/]", soft_wrap=True)
    return html
