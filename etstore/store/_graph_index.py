"""The graph index: what DuckDB holds, as a Ladybug graph for Cypher; derived, never a commit point.

DuckDB is the store (:mod:`etstore.store.catalog`). The graph is built from it when a
Cypher query needs it, and a watermark in DuckDB says what the graph holds:
``graph_index`` (one row per content it holds, with its identity) and ``graph_state``
(a build under way, the graph schema it was built with, and stamps of the names, lineage
and tuner steps it reflects). :func:`plan` compares the watermark with the store;
:func:`build` brings the graph up to date: it marks the state dirty (committed) before it
touches the graph and clean, with the new watermark, in one transaction after the graph's
checkpoint. A build cut short leaves the state dirty, and the next build starts the graph
over: the index may be stale, never wrong.

Contents are added by bulk ``COPY`` from Parquet files DuckDB writes (memory bounded by
one table's load, :mod:`etstore.store._graph_load`); removed contents are deleted in place
when they are small beside what stays, else the graph is built over (costs in
:mod:`etstore.store._graph_purge`). ``Trace`` nodes (one per name), ``BECOMES`` edges and
``TunerStep`` nodes are small beside the ops and are rewritten whole when their stamp moves.
"""

from __future__ import annotations

import hashlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from etstore.errors import StoreError
from etstore.model import OPS_SCHEMA
from etstore.progress import ProgressFn
from etstore.store._graph_load import discard_spool, load_spool
from etstore.store._graph_purge import REBUILD_RATIO, delete_range, discard_graph
from etstore.store._ladybug import LadybugGraph, first_line
from etstore.store.graph import (
    GRAPH_OP_COLUMNS,
    TRACE_NODE_COLUMNS,
    TUNER_STEP_PROPERTIES,
    UID_SHIFT,
    graph_ddl,
    uid_base,
)
from etstore.store.warehouse import Warehouse

__all__ = ["IndexPlan", "build", "plan"]

log = logging.getLogger(__name__)

_OP_COLUMNS = ("uid", "trace_id", *(f.name for f in OPS_SCHEMA if f.name in GRAPH_OP_COLUMNS))
_SCHEMA = hashlib.sha256("\n".join(graph_ddl()).encode()).hexdigest()[:16]
"""Stamp of the graph schema: a graph built by another etstore version is built over."""

_READY = "SELECT trace_id FROM contents WHERE status = 'ready'"
_NAMES = (
    "SELECT md5(coalesce(string_agg(concat_ws('|', name, trace_id, kind, ranks, ops, parent, source), "
    "chr(10) ORDER BY name), '')) FROM traces"
)
_LINEAGE = (
    "SELECT md5(coalesce(string_agg(concat_ws('|', trace_id, parent_trace_id), ',' "
    "ORDER BY trace_id, parent_trace_id), '')) FROM (SELECT DISTINCT trace_id, parent_trace_id "
    f"FROM trace_lineage WHERE trace_id IN ({_READY}) AND parent_trace_id IN ({_READY}))"
)
_TUNER = (
    "SELECT md5(coalesce(string_agg(concat_ws('|', run_id, content_hash), ',' ORDER BY run_id), '')) "
    "FROM tuner_runs"
)


@dataclass
class IndexPlan:
    """What a build does: start over, or remove and add contents and rewrite the small tables."""

    rebuild: bool
    gone: dict[int, int] = field(default_factory=dict)  # trace id -> ops
    new: dict[int, str] = field(default_factory=dict)  # trace id -> identity
    kept_ops: int = 0
    new_ops: int = 0
    stamps: dict[str, str] = field(default_factory=dict)  # names, lineage, tuner: as they should be
    moved: set[str] = field(default_factory=set)  # which of the stamps the graph lacks

    def __bool__(self) -> bool:
        return self.rebuild or bool(self.gone or self.new or self.moved)


def plan(wh: Warehouse, graph: Path) -> IndexPlan:
    """Compare the watermark with the store: what the graph index lacks (falsy: nothing).

    Notes
    -----
    Five small queries on the catalog tables, O(contents + names): cheap enough to run
    before every Cypher query.
    """
    wanted = {
        int(t): (str(h), int(n))
        for t, h, n in wh.query("SELECT trace_id, content_hash, ops FROM contents WHERE status = 'ready'")
    }
    rows = list(wh.query("SELECT trace_id, content_hash, ops FROM graph_index"))
    held = {int(t): str(h) for t, h, _ in rows}
    held_ops = {int(t): int(n) for t, _, n in rows}
    state = wh.query("SELECT dirty, graph_schema, names, lineage, tuner FROM graph_state").to_pylist()
    stamps = {
        k: str(wh.query(q).scalar()) for k, q in (("names", _NAMES), ("lineage", _LINEAGE), ("tuner", _TUNER))
    }
    rebuild = len(state) != 1 or bool(state[0]["dirty"]) or state[0]["graph_schema"] != _SCHEMA
    rebuild = rebuild or (bool(held) and not graph.exists())  # the graph was removed by hand
    if rebuild:
        if not wanted and not graph.exists() and not wh.query("SELECT count(*) FROM tuner_runs").scalar():
            return IndexPlan(rebuild=False, stamps=stamps)  # nothing to index: the empty graph will do
        held = {}
    out = IndexPlan(rebuild=rebuild, stamps=stamps)
    for t, h in held.items():
        if wanted.get(t, ("", 0))[0] != h:
            out.gone[t] = held_ops[t]
    out.new = {t: h for t, (h, _) in wanted.items() if held.get(t) != h}
    out.new_ops = sum(wanted[t][1] for t in out.new)
    out.kept_ops = sum(n for t, (_, n) in wanted.items() if t in held and t not in out.gone)
    out.moved = set(stamps) if rebuild else {k for k in stamps if state[0][k] != stamps[k]}
    if out.gone and out.kept_ops < REBUILD_RATIO * sum(out.gone.values()):
        out.rebuild, out.gone, out.moved = True, {}, set(stamps)  # cheaper to start over
        out.new = {t: h for t, (h, _) in wanted.items()}
        out.new_ops = sum(n for _, n in wanted.values())
    if out.gone or out.new:
        out.moved |= {"names", "lineage"}  # both follow the contents the graph holds
    return out


def build(
    wh: Warehouse, graph: LadybugGraph, todo: IndexPlan, spool: Path, progress: ProgressFn | None = None
) -> None:
    """Bring the graph up to date as ``todo`` says (``wh`` and ``graph`` writable, the store locked).

    Raises
    ------
    StoreError
        DuckDB or Ladybug refuses (a full disk, say), in one line. Either the state could not
        even be marked dirty (nothing was touched), or the build failed after: the graph
        files are then removed (they hold nothing to keep, and their space is given back) and
        the state stays dirty, so the next build starts over. The warehouse is unchanged.
    """
    where = graph.path.parent
    try:
        _set_state(wh, dirty=True, stamps=None)
    except StoreError as exc:
        raise StoreError(f"{where}: the graph index cannot be built (nothing was changed): {exc}") from exc
    try:
        _build(wh, graph, todo, spool, progress)
    except (RuntimeError, OSError, StoreError) as exc:
        with suppress(Exception):  # a database that refused a checkpoint may refuse to close, too
            graph.release()
        with suppress(OSError):
            discard_graph(graph.path)
        discard_spool(spool)
        raise StoreError(
            f"{where}: building the graph index failed, so it stays marked to be built over by the "
            f"next Cypher query (the store itself is unchanged): {first_line(exc)}"
        ) from exc


def _build(
    wh: Warehouse, graph: LadybugGraph, todo: IndexPlan, spool: Path, progress: ProgressFn | None
) -> None:
    """:func:`build` once the state is marked dirty."""
    started = time.perf_counter()
    total = max(1, todo.new_ops + sum(todo.gone.values()))
    done = [0]

    def step(stage: str, ops: int = 0) -> None:
        done[0] += ops
        if progress is not None:
            progress(f"graph index: {stage}", min(done[0], total), total)

    if todo.rebuild:
        graph.release()
        discard_graph(graph.path)
        with wh.transaction():
            wh.execute("DELETE FROM graph_index")
    conn = graph.open(incoming=todo.new_ops * 160)
    for t, ops in todo.gone.items():
        lo = uid_base(t)
        delete_range(conn, lo, lo + (1 << UID_SHIFT), lambda s: step(f"removing {s}"))
        step("removing", ops)
    discard_spool(spool)
    spool.mkdir(parents=True)
    try:
        step("exporting")
        # two lanes: DuckDB writes the edges and small tables (another connection, its own
        # thread) while Ladybug loads the nodes; both release the GIL in their bulk paths
        with ThreadPoolExecutor(max_workers=1) as pool:
            op_tables = _export_ops(wh, spool, todo)
            sibling = wh.sibling()
            rest = pool.submit(_export_rest, sibling, spool, todo)
            try:
                step("loading")
                load_spool(graph, spool, op_tables)
            finally:
                wait([rest])  # the other lane ends before its connection closes, whatever happened here
                sibling.close()
            tables = rest.result()
        for table in ("Trace", "BECOMES", "TunerStep"):
            if _rewrites(table, todo):
                _recreate(graph, table)
        load_spool(graph, spool, tables)
        step("loaded", todo.new_ops)
    finally:
        discard_spool(spool)
    graph.open().execute("CHECKPOINT")
    graph.release()
    with wh.transaction():
        for t in todo.gone:
            wh.execute("DELETE FROM graph_index WHERE trace_id = $t", {"t": t})
        for t, h in todo.new.items():
            wh.execute("DELETE FROM graph_index WHERE trace_id = $t", {"t": t})
            wh.execute(
                "INSERT INTO graph_index SELECT $t, $h, ops FROM contents WHERE trace_id = $t",
                {"t": t, "h": h},
            )
        _set_state(wh, dirty=False, stamps=todo.stamps, inside=True)
    log.info(
        "graph index: +%d -%d contents in %.2f s",
        len(todo.new),
        len(todo.gone),
        time.perf_counter() - started,
    )


def _rewrites(table: str, todo: IndexPlan) -> bool:
    """Whether ``table`` is written whole by this build."""
    key = {"Trace": "names", "BECOMES": "lineage", "TunerStep": "tuner"}[table]
    return key in todo.moved


def _set_state(wh: Warehouse, *, dirty: bool, stamps: dict[str, str] | None, inside: bool = False) -> None:
    """Write ``graph_state`` (stamps None: keep them; a dirty state is never trusted anyway)."""

    def write() -> None:
        old = wh.query("SELECT names, lineage, tuner FROM graph_state").to_pylist()
        keep = stamps or (old[0] if old else {"names": "", "lineage": "", "tuner": ""})
        wh.execute("DELETE FROM graph_state")
        wh.execute(
            "INSERT INTO graph_state VALUES ($d, $s, $n, $l, $t)",
            {"d": dirty, "s": _SCHEMA, "n": keep["names"], "l": keep["lineage"], "t": keep["tuner"]},
        )

    if inside:
        write()
    else:
        with wh.transaction():
            write()


def _recreate(graph: LadybugGraph, table: str) -> None:
    """Empty ``table`` by dropping and creating it again (instant, unlike deleting its rows)."""
    conn = graph.open()
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    for ddl in graph_ddl():
        conn.execute(ddl)


def _quote(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def _copy(wh: Warehouse, spool: Path, table: str, sql: str, key: int, out: list[str]) -> None:
    """Write the rows of ``sql`` as ``<table>-<key>.parquet`` in ``spool`` (none when empty)."""
    if wh.query(f"SELECT count(*) FROM ({sql})").scalar():
        wh.execute(f"COPY ({sql}) TO {_quote(spool / f'{table}-{key:09d}.parquet')} (FORMAT parquet)")
        if table not in out:
            out.append(table)


def _export_ops(wh: Warehouse, spool: Path, todo: IndexPlan) -> list[str]:
    """The new contents' ``Op`` rows as Parquet files; returns the tables written."""
    out: list[str] = []
    ops = ", ".join(f'"{c}"' for c in _OP_COLUMNS)
    for t in todo.new:
        _copy(wh, spool, "Op", f"SELECT {ops} FROM trace_ops WHERE trace_id = {t} ORDER BY uid", t, out)
    return out


def _export_rest(wh: Warehouse, spool: Path, todo: IndexPlan) -> list[str]:
    """Everything else the graph lacks as Parquet files; returns the tables, in load order."""
    out: list[str] = []
    held = f"SELECT trace_id FROM contents WHERE status = 'ready' AND trace_id NOT IN ({_ids(todo.gone)})"
    for t in todo.new:
        deps = 'SELECT src_uid AS "from", dst_uid AS "to", kind FROM trace_deps WHERE trace_id = '
        _copy(wh, spool, "DEP", f"{deps}{t} ORDER BY edge", t, out)
        msgs = 'SELECT send_uid AS "from", recv_uid AS "to", tag, comm_size FROM trace_messages '
        msgs += "WHERE trace_id = "
        _copy(wh, spool, "MSG", f"{msgs}{t}", t, out)
    if "names" in todo.moved:
        names = f"SELECT {', '.join(TRACE_NODE_COLUMNS)} FROM traces WHERE trace_id IN ({held}) ORDER BY name"
        _copy(wh, spool, "Trace", names, 0, out)
    if "lineage" in todo.moved:
        lineage = 'SELECT parent_uid AS "from", uid AS "to" FROM trace_lineage '
        _copy(
            wh,
            spool,
            "BECOMES",
            f"{lineage}WHERE trace_id IN ({held}) AND parent_trace_id IN ({held})",
            0,
            out,
        )
    if "tuner" in todo.moved or "names" in todo.moved:
        todo.moved.add("tuner")  # a step's trace id follows the names
        cols = [_TUNER_SELECT.get(c, f"s.{c}") for c in TUNER_STEP_PROPERTIES]
        steps = (
            f"SELECT {', '.join(cols)} FROM tuner_steps s JOIN tuner_runs r USING (run_id) "
            f"LEFT JOIN traces t ON t.name = s.trace AND t.trace_id IN ({held}) ORDER BY uid"
        )
        _copy(wh, spool, "TunerStep", steps, 0, out)
    return out


_TUNER_SELECT = {
    "uid": "(s.run_id * 4294967296 + s.step) AS uid",
    "run": "r.name AS run",
    "content_hash": "r.content_hash",
    "trace_id": "t.trace_id",
}
"""How a ``TunerStep`` property is read where it is not the step's own column."""


def _ids(ids: dict[int, int]) -> str:
    return ", ".join(str(int(t)) for t in ids) or "-1"  # (no trace id is negative)
