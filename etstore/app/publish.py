"""Publishing an embedded store to a Neo4j server: ``etstore publish neo4j://...``.

The embedded store (DuckDB) is the truth; the server is a target it publishes to, so that
Cypher users and dashboards elsewhere see its traces and runs, and anyone opening the
server's URL reads them as a store (:mod:`etstore.store.neo4j`). Publishing is the one way
data gets there. What lands there is the graph of the store's index (``Op`` with
``trace_id``, ``DEP``, ``MSG``, ``BECOMES``, one ``Trace`` node per name, ``TunerStep``),
each content's lossless payload (what a reader's ``load`` returns), plus the runs and their
summaries (:mod:`etstore.app._publish_records`); :mod:`etstore.store._neo4j_publish` writes
it. A server etstore's former Neo4j backend wrote is upgraded in place first.

Publishing is idempotent:

- a content is sent once per server, known by ``(content_hash, kind)``: the server gives it
  its own trace id (uids ``trace_id << 40 | row`` stay unique however many stores publish
  there), and a content another store published already is not sent again;
- names are this store's ``Trace`` nodes (``store`` = the store's id): new ones are added,
  changed ones updated, and with ``prune`` the ones the store no longer has are removed
  (with the contents no name points at any more); a name another store published is refused;
- runs are keyed by a hash of their identifying columns, so publishing again adds none.

A second publish of an unchanged store writes nothing. Publishers may race: a content is
claimed through a uniqueness constraint, and one that loses waits for the winner's copy and
uses it; runs are merged on their key (``docs/neo4j.md``, "Several publishers").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from etstore.app._publish_records import RECORD_KINDS, read_records
from etstore.errors import QueryError, StoreError, UnknownTraceError
from etstore.model import OPS_SCHEMA
from etstore.progress import ProgressFn
from etstore.store import EmbeddedStore, Store
from etstore.store._neo4j_load import Batch, edge_batches, node_batches, payload_batches, payload_chunks
from etstore.store._neo4j_publish import Loading, Server, ServerContent, Stages
from etstore.store._neo4j_runs import RecordSet, prune_records, record_keys, relink, write_records
from etstore.store.graph import GRAPH_OP_COLUMNS, TRACE_NODE_COLUMNS, uid_base
from etstore.store.schema import DEPS_COLUMNS, OPS_COLUMNS
from etstore.store.warehouse import Warehouse

__all__ = ["IDENTITY_DDL", "PublishReport", "publish", "store_identity"]

log = logging.getLogger(__name__)

T = TypeVar("T")

IDENTITY_DDL = "CREATE TABLE IF NOT EXISTS store_identity (store_id VARCHAR NOT NULL)"
"""The store's id on the servers it publishes to (a UUID, written by its first publish)."""

_PAGE = 1 << 18
"""Rows read from DuckDB at a time while sending a content (then cut into statements)."""
_OP_COLUMNS = ("uid", "trace_id", *(f.name for f in OPS_SCHEMA if f.name in GRAPH_OP_COLUMNS))
_NAMES = (
    "SELECT t.name, t.trace_id, t.kind, t.ranks, t.ops, t.parent, t.source, t.params, t.created, "
    "t.parent_trace_id FROM traces t "
    "JOIN contents c ON c.trace_id = t.trace_id AND c.status = 'ready' ORDER BY t.name"
)
_CONTENTS = (
    "SELECT trace_id, content_hash, kind, ranks, ops, deps, missing, messages FROM contents "
    "WHERE status = 'ready' ORDER BY trace_id"
)
_LINEAGE = "SELECT trace_id, parent_trace_id, count(*) AS n FROM trace_lineage GROUP BY ALL"


@dataclass
class PublishReport:
    """What a publish did; every count zero but ``contents_present`` means nothing changed."""

    location: str
    """The server, without credentials."""
    store_id: str
    """This store's id on the server (``Trace.store``, ``Run.store``, ...)."""
    names: int = 0
    """Names published (all of the store's, or those asked for)."""
    contents_sent: int = 0
    contents_present: int = 0
    """Contents the server held already (published before, by this store or another)."""
    ops_sent: int = 0
    names_added: int = 0
    names_updated: int = 0
    names_removed: int = 0
    contents_removed: int = 0
    """Contents no name points at any more, removed from the server."""
    lineage_added: int = 0
    """Pairs of published contents whose ``BECOMES`` edges were added after both were there."""
    lineage_removed: int = 0
    """Pairs whose ``BECOMES`` edges were removed (``prune``): the store holds both contents and
    no lineage between them any more."""
    payloads_sent: int = 0
    """Contents the server held without their lossless form (published by an older etstore)
    whose payload was sent now."""
    swept: int = 0
    """Contents an interrupted publish had left loading, removed."""
    legacy_upgraded: int = 0
    """Contents etstore's former Neo4j backend had written there, upgraded to this form."""
    records_added: dict[str, int] = field(default_factory=dict)
    records_removed: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def changed(self) -> bool:
        """Whether the server was changed."""
        counts = (
            self.contents_sent,
            self.names_added,
            self.names_updated,
            self.names_removed,
            self.contents_removed,
            self.lineage_added,
            self.lineage_removed,
            self.payloads_sent,
            self.swept,
            self.legacy_upgraded,
        )
        return any(counts) or any(self.records_added.values()) or any(self.records_removed.values())

    def as_row(self) -> dict[str, Any]:
        """Plain fields for a table or JSON."""
        row = dict(vars(self))
        row["records_added"] = dict(self.records_added)
        row["records_removed"] = dict(self.records_removed)
        return row


def store_identity(store: EmbeddedStore, *, create: bool = True) -> str | None:
    """The store's publishing id: read from ``store_identity``, else (``create`` and the store
    writable) a new UUID written there; None when it has none and cannot get one now."""
    wh = store.warehouse
    try:
        got = wh.query("SELECT min(store_id) FROM store_identity").scalar()
    except QueryError:  # no such table: never published
        got = None
    if got or not create or wh.read_only:
        return str(got) if got else None
    with wh.transaction():
        wh.execute(IDENTITY_DDL)
        wh.execute(
            "INSERT INTO store_identity SELECT uuid()::VARCHAR "
            "WHERE NOT EXISTS (SELECT 1 FROM store_identity)"
        )
    return str(wh.query("SELECT min(store_id) FROM store_identity").scalar())


def publish(
    store: Store,
    url: str,
    *,
    names: Sequence[str] | None = None,
    prune: bool = False,
    progress: ProgressFn | None = None,
    batch_rows: int = 20_000,
    single_tx_rows: int = 200_000,
    stale_after_s: float = 120.0,
    wait_s: float = 600.0,
) -> PublishReport:
    """Publish ``store``'s traces, runs and metrics to the Neo4j server at ``url``.

    Parameters
    ----------
    store
        An embedded store (read-only is enough once it has published before: see
        :func:`store_identity`).
    url
        ``neo4j://[user:pass@]host[:port][/database]`` (``docs/neo4j.md``).
    names
        Publish only these names, and the runs, comparisons and opportunities about them
        (default: every name and every run).
    prune
        Also remove from the server the names and runs this store published that it no
        longer holds, and the ``BECOMES`` edges between two published contents it holds
        both of and no longer has lineage between.
    progress
        ``progress(phase, done, total)``: ``contents`` (rows sent), ``lineage``, ``names``,
        then one phase per kind of run.
    batch_rows, single_tx_rows, stale_after_s
        Rows per statement; contents of up to this many nodes and edges go in one
        transaction; a content left loading this long without a heartbeat is removed.
    wait_s
        How long to wait for another publisher that is sending a content this store holds
        too (its copy is then used) before giving up.

    Returns
    -------
    PublishReport

    Raises
    ------
    StoreError
        A bad URL, an unreachable server, refused credentials, a name another store
        published, a server as the source, a read-only store that never published, another
        publisher still sending a content this store holds after ``wait_s``, or a server of
        etstore's former Neo4j backend whose upgrade in place fails.
    UnknownTraceError
        A name in ``names`` that the store does not hold.
    """
    started = time.perf_counter()
    if not isinstance(store, EmbeddedStore):
        raise StoreError(f"{store.location}: publish reads an embedded store (a directory), not a server")
    store_id = store_identity(store)
    if store_id is None:
        raise StoreError(
            f"{store.location} has not published before and is open read-only: open it writable once "
            "(etstore publish does)"
        )
    wh = store.warehouse
    local = {r["name"]: r for r in wh.query(_NAMES).to_pylist()}
    chosen = _chosen(local, names, store.location)
    contents = {int(r["trace_id"]): r for r in wh.query(_CONTENTS).to_pylist()}
    needed = sorted({int(local[n]["trace_id"]) for n in chosen})
    with Server(
        url, batch_rows=batch_rows, single_tx_rows=single_tx_rows, stale_after_s=stale_after_s, wait_s=wait_s
    ) as server:
        report = PublishReport(server.location, store_id, names=len(chosen))
        server.prepare(store_id, str(store.path.resolve()), [k.label for k in RECORD_KINDS])
        report.swept = server.sweep()
        report.legacy_upgraded = server.upgrade_legacy()
        on_server = server.traces()
        taken = sorted(n for n in chosen if n in on_server and on_server[n].get("store") != store_id)
        if taken:
            raise StoreError(
                f"{server.location} has {', '.join(map(repr, taken[:5]))}"
                f"{' and more' if len(taken) > 5 else ''} from another store; publish other names "
                "(--trace), or remove those there"
            )
        held = server.contents((c["content_hash"], c["kind"]) for c in contents.values())
        ids: dict[int, int] = {}
        lineage_from: dict[int, tuple[int, ...]] = {}
        known: dict[int, int] = {}  # local trace id -> the server's, for every ready content there
        for t in sorted(contents):  # one another client is loading waits for its claim (below)
            got = held.get((contents[t]["content_hash"], contents[t]["kind"]))
            if got is not None and got.status == "ready":
                known[t] = got.trace_id
                if t in needed:
                    _present(wh, server, report, t, contents[t], got, ids, lineage_from)
        every_pair = {
            (int(r["trace_id"]), int(r["parent_trace_id"])): int(r["n"])
            for r in wh.query(_LINEAGE).to_pylist()
        }
        pairs = {(c, p): n for (c, p), n in every_pair.items() if c in needed and p in needed}
        todo = [t for t in needed if t not in ids]
        total = max(1, sum(_rows(contents[t], pairs, t) for t in todo))
        sent = [0]

        def step(stage: str, done: int, rows: int) -> None:
            if progress is not None:
                progress("contents", min(sent[0] + done, total), total)

        written: dict[str, dict[str, Any]] = {}
        for t in todo:
            counts = {k: int(contents[t][k]) for k in ("ranks", "ops", "deps", "missing", "messages")}
            sid = server.claim(contents[t]["content_hash"], contents[t]["kind"], counts)
            if isinstance(sid, ServerContent):  # another publisher's, sent meanwhile
                known[t] = sid.trace_id
                _present(wh, server, report, t, contents[t], sid, ids, lineage_from)
                continue
            job, children = _loading(wh, t, sid, contents[t], ids, lineage_from, pairs, store_id, batch_rows)
            known[t] = job.trace_id
            job.names = [_trace_props(local[n], known, store_id) for n in chosen if local[n]["trace_id"] == t]
            server.load(job, step)
            written.update((props["name"], props) for props in job.names)
            sent[0] += job.rows
            ids[t] = job.trace_id
            lineage_from[t] = tuple(job.lineage_from)
            for c in children:
                lineage_from[c] = (*lineage_from[c], job.trace_id)
            report.contents_sent += 1
            report.ops_sent += int(contents[t]["ops"])
            for props in job.names:
                if props["name"] in on_server:
                    report.names_updated += 1
                else:
                    report.names_added += 1
        for (c, p), n in sorted(pairs.items()):
            if ids[p] not in lineage_from[c]:
                batches = _bound(_lineage_batches, wh, c, p, dict(ids), n, batch_rows)
                report.lineage_added += server.add_lineage(ids[c], ids[p], batches, n, progress)
                lineage_from[c] = (*lineage_from[c], ids[p])
        if prune:
            report.lineage_removed = _drop_lineage(server, ids, known, lineage_from, every_pair)
        _sync_names(server, report, local, chosen, known, {**on_server, **written}, store_id, prune, progress)
        report.contents_removed = server.collect_garbage()
        _publish_records(
            server, wh, report, store_id, set(chosen) if names is not None else None, prune, progress
        )
    report.seconds = time.perf_counter() - started
    log.info(  # the server's location, never the URL: it may hold the password
        "published %d names of %s to %s in %.2f s",
        len(chosen),
        store.location,
        report.location,
        report.seconds,
    )
    return report


def _chosen(local: dict[str, dict[str, Any]], names: Sequence[str] | None, where: str) -> list[str]:
    if names is None:
        return sorted(local)
    missing = [n for n in names if n not in local]
    if missing:
        known = ", ".join(sorted(local)[:10]) or "none"
        raise UnknownTraceError(f"no trace named {missing[0]!r} in {where}; stored traces: {known}")
    return sorted(set(names))


def _present(
    wh: Warehouse,
    server: Server,
    report: PublishReport,
    t: int,
    content: dict[str, Any],
    got: ServerContent,
    ids: dict[int, int],
    lineage_from: dict[int, tuple[int, ...]],
) -> None:
    """Use ready content ``got`` on the server for local content ``t``: its id and lineage, and
    its payload sent when an older etstore published it without."""
    ids[t], lineage_from[t] = got.trace_id, got.lineage_from
    report.contents_present += 1
    if not got.payload:
        chunks = _bound(_payload_chunks, wh, t, content)
        batches = lambda: payload_batches(got.trace_id, chunks())  # noqa: E731
        report.payloads_sent += server.add_payload(got.trace_id, batches, int(content["missing"]))


def _bound(fn: Callable[..., Iterator[T]], *args: Any) -> Callable[[], Iterator[T]]:
    """``fn(*args)`` to be read afresh each time (a transaction the server rolled back reruns)."""
    return lambda: fn(*args)


def _trace_props(row: dict[str, Any], known: dict[int, int], store_id: str) -> dict[str, Any]:
    """A name's ``Trace`` node on the server: the index's columns, the server's trace ids (its
    content's, and its parent's content's when that is there), the store, and what the read
    view's catalog needs besides (``params``, ``created``)."""
    props = {c: row[c] for c in TRACE_NODE_COLUMNS}
    props["trace_id"] = known[int(row["trace_id"])]
    parent = row["parent_trace_id"]
    props["parent_trace_id"] = known.get(int(parent)) if parent is not None else None
    props["params"] = row["params"] or "{}"
    props["created"] = row["created"]
    props["store"] = store_id
    return props


def _rows(content: dict[str, Any], pairs: dict[tuple[int, int], int], t: int) -> int:
    lineage = sum(n for (c, p), n in pairs.items() if t in (c, p))
    return int(content["ops"]) + int(content["deps"]) + int(content["messages"]) + lineage


def _loading(
    wh: Warehouse,
    t: int,
    sid: int,
    content: dict[str, Any],
    ids: dict[int, int],
    lineage_from: dict[int, tuple[int, ...]],
    pairs: dict[tuple[int, int], int],
    store_id: str,
    batch_rows: int,
) -> tuple[Loading, list[int]]:
    """The load of content ``t``, claimed on the server as ``sid``: ops, edges, and the
    ``BECOMES`` edges to and from contents already there (those children's local ids come second)."""
    ids_now = {**ids, t: sid}
    lb, sb = uid_base(t), uid_base(sid)
    ops = int(content["ops"])
    name = f"#{t}"
    parents = [p for (c, p) in pairs if c == t and p in ids]
    children = [c for (c, p) in pairs if p == t and c in ids and sid not in lineage_from[c]]

    def stages() -> Stages:
        out: Stages = [
            ("ops", _op_batches(wh, t, sid, ops, name, batch_rows)),
            ("deps", _dep_batches(wh, t, lb, sb, int(content["deps"]), batch_rows)),
            ("messages", _msg_batches(wh, t, lb, sb, ops, batch_rows)),
            ("payload", payload_batches(sid, _payload_chunks(wh, t, content))),
        ]
        out += [("lineage", _lineage_batches(wh, t, p, ids_now, pairs[(t, p)], batch_rows)) for p in parents]
        out += [("lineage", _lineage_batches(wh, c, t, ids_now, pairs[(c, t)], batch_rows)) for c in children]
        return out

    rows = ops + int(content["deps"]) + int(content["messages"])
    rows += sum(pairs[(t, p)] for p in parents) + sum(pairs[(c, t)] for c in children)
    job = Loading(sid, store_id, stages, rows, [], [ids[p] for p in parents], [ids[c] for c in children])
    return job, children


def _pages(total: int) -> range:
    return range(0, max(total, 0), _PAGE)


def _op_batches(wh: Warehouse, t: int, sid: int, ops: int, name: str, batch_rows: int) -> Iterator[Batch]:
    lb, sb = uid_base(t), uid_base(sid)
    cols = ", ".join(f'"{c}"' for c in _OP_COLUMNS[2:])
    for lo in _pages(ops):
        page = wh.query(
            f"SELECT uid - {lb} + {sb} AS uid, {sid}::BIGINT AS trace_id, {cols} FROM trace_ops "
            f"WHERE trace_id = {t} AND uid >= {lb + lo} AND uid < {lb + lo + _PAGE} ORDER BY uid"
        ).to_arrow()
        yield from node_batches(page, name, batch_rows)


def _dep_batches(wh: Warehouse, t: int, lb: int, sb: int, deps: int, batch_rows: int) -> Iterator[Batch]:
    for lo in _pages(deps):
        page = wh.query(
            f'SELECT src_uid - {lb} + {sb} AS "from", dst_uid - {lb} + {sb} AS "to", kind FROM trace_deps '
            f"WHERE trace_id = {t} AND edge >= {lo} AND edge < {lo + _PAGE} ORDER BY edge"
        ).to_arrow()
        yield from edge_batches(page, "DEP", batch_rows)


def _msg_batches(wh: Warehouse, t: int, lb: int, sb: int, ops: int, batch_rows: int) -> Iterator[Batch]:
    for lo in _pages(ops):  # by the send's uid: pages of at most _PAGE messages
        page = wh.query(
            f'SELECT send_uid - {lb} + {sb} AS "from", recv_uid - {lb} + {sb} AS "to", tag, comm_size '
            f"FROM trace_messages WHERE trace_id = {t} AND send_uid >= {lb + lo} "
            f"AND send_uid < {lb + lo + _PAGE} ORDER BY send_uid"
        ).to_arrow()
        yield from edge_batches(page, "MSG", batch_rows)


def _payload_chunks(wh: Warehouse, t: int, content: dict[str, Any]) -> Iterator[tuple[str, int, bytes]]:
    """Content ``t``'s lossless form (what ``load`` returns: every op column, deps, missing deps,
    metadata) as payload chunks, read from DuckDB a page at a time."""
    lb = uid_base(t)

    def ops() -> Iterator[Any]:
        for lo in _pages(int(content["ops"])):
            yield wh.query(
                f"SELECT {OPS_COLUMNS} FROM trace_ops WHERE trace_id = {t} "
                f"AND uid >= {lb + lo} AND uid < {lb + lo + _PAGE} ORDER BY uid"
            ).to_arrow()

    def edges(table: str, total: int) -> Iterator[Any]:
        for lo in _pages(total):
            yield wh.query(
                f"SELECT {DEPS_COLUMNS} FROM {table} WHERE trace_id = {t} "
                f"AND edge >= {lo} AND edge < {lo + _PAGE} ORDER BY edge"
            ).to_arrow()

    yield from payload_chunks("ops", ops())
    yield from payload_chunks("deps", edges("trace_deps", int(content["deps"])))
    yield from payload_chunks("missing", edges("trace_missing_deps", int(content["missing"])))
    meta = wh.query(f"SELECT rank, metadata FROM trace_meta WHERE trace_id = {t} ORDER BY rank").to_arrow()
    yield from payload_chunks("meta", [meta])


def _lineage_batches(
    wh: Warehouse, child: int, parent: int, ids: dict[int, int], rows: int, batch_rows: int
) -> Iterator[Batch]:
    """``BECOMES`` edges from ``parent``'s ops to ``child``'s, in server uids."""
    lc, sc, lp, sp = uid_base(child), uid_base(ids[child]), uid_base(parent), uid_base(ids[parent])
    top = wh.query(f"SELECT max(uid) - {lc} + 1 FROM trace_lineage WHERE trace_id = {child}").scalar() or 0
    for lo in _pages(int(top)):
        page = wh.query(
            f'SELECT parent_uid - {lp} + {sp} AS "from", uid - {lc} + {sc} AS "to" FROM trace_lineage '
            f"WHERE trace_id = {child} AND parent_trace_id = {parent} AND uid >= {lc + lo} "
            f"AND uid < {lc + lo + _PAGE} ORDER BY uid, parent_uid"
        ).to_arrow()
        yield from edge_batches(page, "BECOMES", batch_rows)


def _drop_lineage(
    server: Server,
    ids: dict[int, int],
    known: dict[int, int],
    lineage_from: dict[int, tuple[int, ...]],
    pairs: dict[tuple[int, int], int],
) -> int:
    """Remove the ``BECOMES`` edges between published contents that the store holds both of and
    has no lineage between any more; returns how many pairs."""
    local_of = {sid: t for t, sid in known.items()}
    dropped = 0
    for c, sid in sorted(ids.items()):
        for sp in lineage_from[c]:
            p = local_of.get(sp)
            if p is not None and (c, p) not in pairs:
                server.drop_lineage(sid, sp)
                dropped += 1
    return dropped


def _sync_names(
    server: Server,
    report: PublishReport,
    local: dict[str, dict[str, Any]],
    chosen: list[str],
    known: dict[int, int],
    current: dict[str, dict[str, Any]],
    store_id: str,
    prune: bool,
    progress: ProgressFn | None,
) -> None:
    """Bring this store's ``Trace`` nodes in step with its names, in one transaction (``current``:
    each name's node on the server now, those written with their contents included)."""
    upserts = []
    for n in chosen:
        want = _trace_props(local[n], known, store_id)
        have = current.get(n)
        if have is None:
            report.names_added += 1
        elif any(have.get(k) != v for k, v in want.items()):
            report.names_updated += 1
        else:
            continue
        upserts.append(want)
    removals = (
        sorted(n for n, p in current.items() if p.get("store") == store_id and n not in local)
        if prune
        else []
    )
    report.names_removed = len(removals)
    server.sync_names(store_id, upserts, removals)
    if progress is not None:
        progress("names", 1, 1)


def _publish_records(
    server: Server,
    wh: Warehouse,
    report: PublishReport,
    store_id: str,
    traces: Collection[str] | None,
    prune: bool,
    progress: ProgressFn | None,
) -> None:
    """Send the runs and metrics the server lacks; with ``prune``, remove the store's others."""
    for kind in RECORD_KINDS:
        records, every = read_records(wh, kind, traces)
        have = record_keys(server, kind.label, [r["key"] for r in records.rows]) if records.rows else set()
        new = RecordSet(
            kind.label, [r for r in records.rows if r["key"] not in have], records.children, kind.links
        )
        report.records_added[kind.label] = write_records(server, new, store_id, progress)
        relink(server, records, store_id)
        report.records_removed[kind.label] = prune_records(server, records, store_id, every) if prune else 0
