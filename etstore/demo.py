"""The end-to-end demo behind ``etstore demo``: ingest shipped examples, query, analyse, export."""

from __future__ import annotations

import tempfile
from pathlib import Path

from rich.console import Console

from etstore._render import render
from etstore.ingest import read_trace, write_et
from etstore.query import critical_path
from etstore.store import open_store
from etstore.workloads import transformer

__all__ = ["EXAMPLES", "run_demo"]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _workload_dir() -> Path:
    """The shipped example workload, or a freshly generated copy when not installed from the repo."""
    shipped = EXAMPLES / "transformer_8r"
    if shipped.is_dir():
        return shipped
    tmp = Path(tempfile.mkdtemp(prefix="etstore-examples-"))
    write_et(transformer(ranks=8, layers=4, tp=2), tmp / "transformer")
    return tmp


def run_demo(*, store_location: str | None, console: Console, out_dir: Path) -> None:
    """Ingest → query (Cypher, SQL) → critical path → export, printing each step."""
    store = open_store(store_location)
    with store:
        src = _workload_dir()
        console.rule("1. ingest the example workload (8 ranks, data x tensor parallel)")
        report = store.ingest(read_trace(src, name="transformer"))
        name = report.trace.name
        console.print(
            f"{src} → trace [bold]{name}[/]: {report.trace.ops} ops, {report.trace.deps} deps, "
            f"{report.trace.messages} cross-rank messages"
            + ("" if report.created else " (already stored: same content)")
        )

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

        console.rule("4. critical path across ranks")
        trace = store.load(name)
        cp = critical_path(trace)
        render(cp.path.select(["step", "rank", "name", "type", "duration_micros", "via"]), console=console)
        console.print(f"critical path: {cp.length_micros:,.0f} µs over {cp.path.num_rows} ops")

        console.rule("5. export back to .et (ASTRA-sim input) and re-read")
        paths = write_et(trace, out_dir / name)
        again = read_trace(out_dir / name)
        same = again.ops.equals(trace.ops) and again.deps.equals(trace.deps)
        console.print(f"wrote {len(paths)} files under {out_dir}/; round trip identical: {same}")
