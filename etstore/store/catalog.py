"""The catalog of an embedded store: stored contents, the names that point at them, the format.

Content is stored once; names are handles. A *content* row (``contents``) is one
trace's data as the engines hold it, keyed by its sequence number (the *trace id*:
graph uids and warehouse rows derive from it) and identified by its digest
(:func:`~etstore.store._identity.identity`). A *name* row (``names``) maps a name
the user chose to a content, with what belongs to the name: its parent, source,
parameters and creation time. Two names may share one content; removing one name
leaves the other, and the content goes when its last name does.

A content row is written with ``status='loading'`` before any data lands; the one
SQLite transaction that flips it to ``'ready'`` and inserts its first name is the
commit point of an ingest. Content rows that are not ready, or that no name points
at, are swept (with their data) on the next writable open.

``etstore_format`` holds the store format version (:data:`FORMAT_VERSION`). A store
written before names existed (format 1: one ``traces`` table, no version record) is
upgraded in place by :meth:`Catalog.upgrade`, in one transaction.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import event, inspect, or_, text
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, SQLModel, col, create_engine, select

from etstore.errors import StoreError
from etstore.store._identity import upgraded_identity
from etstore.store.base import TraceInfo

__all__ = ["FORMAT_VERSION", "Catalog", "ContentRecord", "LegacyTrace", "NameRecord"]

FORMAT_VERSION = 2
"""Version of the store layout this etstore writes (1: before names; 2: names and contents)."""


def _now() -> datetime:
    return datetime.now(timezone.utc)


class ContentRecord(SQLModel, table=True):
    """One stored content: what the engines hold under trace id ``seq``."""

    __tablename__ = "contents"
    __table_args__ = {"sqlite_autoincrement": True}  # never reuse a seq: uids derive from it
    seq: int | None = Field(default=None, primary_key=True)
    content_hash: str = Field(index=True)
    kind: str
    ranks: int = 0
    ops: int = 0
    deps: int = 0
    missing: int = 0
    messages: int = 0
    graph_name: str = ""  # the name the graph's Op nodes carry in ``trace`` (one of its names)
    status: str = "loading"
    created: datetime = Field(default_factory=_now)


class NameRecord(SQLModel, table=True):
    """One name: a handle on a content, with its own parent, source and parameters."""

    __tablename__ = "names"
    __table_args__ = {"sqlite_autoincrement": True}
    id: int | None = Field(default=None, primary_key=True)  # creation order
    name: str = Field(index=True, unique=True)
    trace_id: int = Field(index=True)  # ContentRecord.seq
    source: str = ""
    parent: str | None = None
    parent_trace_id: int | None = None  # the parent's content when this name was made
    params: str = "{}"
    created: datetime = Field(default_factory=_now)

    def info(self, content: ContentRecord) -> TraceInfo:
        """The name as the store interface shows it."""
        return TraceInfo(
            name=self.name,
            kind=content.kind,
            source=self.source,
            content_hash=content.content_hash,
            ranks=content.ranks,
            ops=content.ops,
            deps=content.deps,
            missing=content.missing,
            messages=content.messages,
            parent=self.parent,
            params=json.loads(self.params),
            created=self.created,
            trace_id=self.trace_id,
        )


class LegacyTrace(SQLModel):
    """A row of a format-1 catalog's ``traces`` table (read by :meth:`Catalog.legacy_traces`)."""

    seq: int
    name: str
    kind: str
    content_hash: str
    status: str
    parent: str | None = None
    params: str = "{}"


_TABLES = ("contents", "names", "etstore_format")


class Catalog:
    """SQLite-backed catalog of one store directory (see the module docstring).

    Parameters
    ----------
    path
        The ``catalog.sqlite`` file.
    create
        Create the tables and the version record of a new catalog. Without it (a
        read-only open) nothing is written.
    """

    def __init__(self, path: Path, *, create: bool = True) -> None:
        self.path = path
        self.engine = create_engine(f"sqlite:///{path}")

        @event.listens_for(self.engine, "connect")
        def _pragmas(dbapi_con: Any, _record: Any) -> None:
            dbapi_con.execute("PRAGMA journal_mode=WAL")
            dbapi_con.execute("PRAGMA synchronous=NORMAL")

        tables = set(inspect(self.engine).get_table_names())
        if create and "traces" not in tables:  # a format-1 catalog stays as it is until upgrade()
            self._create()

    def _create(self) -> None:
        SQLModel.metadata.create_all(
            self.engine, tables=[SQLModel.metadata.tables[t] for t in ("contents", "names")]
        )
        with self.engine.begin() as con:
            con.execute(text("CREATE TABLE IF NOT EXISTS etstore_format (version INTEGER NOT NULL)"))
            if con.execute(text("SELECT count(*) FROM etstore_format")).scalar() == 0:
                con.execute(text("INSERT INTO etstore_format VALUES (:v)"), {"v": FORMAT_VERSION})

    # ------------------------------------------------------------ format

    def format_version(self) -> int | None:
        """The format this catalog is in: its version record, 1 for a catalog from before
        version records, None for an empty (new) catalog."""
        tables = set(inspect(self.engine).get_table_names())
        if "etstore_format" in tables:
            with self.engine.connect() as con:
                v = con.execute(text("SELECT max(version) FROM etstore_format")).scalar()
            return int(v) if v is not None else None
        return 1 if "traces" in tables else None

    def legacy_traces(self) -> list[LegacyTrace]:
        """Every row of a format-1 ``traces`` table, in sequence order."""
        with self.engine.connect() as con:
            rows = con.execute(
                text("SELECT seq, name, kind, content_hash, status, parent, params FROM traces ORDER BY seq")
            ).mappings()
            return [LegacyTrace(**dict(r)) for r in rows]

    def upgrade(self) -> None:
        """Turn a format-1 catalog into this format, in one SQLite transaction.

        Every ``traces`` row becomes a content with the same sequence number (so graph
        uids and warehouse rows keep their trace ids) and, if it was ready, a name.
        Algorithm digests gain their parameters (:func:`upgraded_identity`). Rows that
        were not ready stay as contents without names, which the next sweep removes.

        Raises
        ------
        StoreError
            The catalog is not in format 1.
        """
        if self.format_version() != 1:
            raise StoreError(f"{self.path}: not a format-1 catalog; nothing to upgrade")
        legacy = self.legacy_traces()
        seq_of = {r.name: r.seq for r in legacy if r.status == "ready"}
        SQLModel.metadata.create_all(
            self.engine, tables=[SQLModel.metadata.tables[t] for t in ("contents", "names")]
        )
        with self.engine.begin() as con:
            old = con.execute(text("SELECT * FROM traces ORDER BY seq")).mappings().all()
            for r in old:
                ready = r["status"] == "ready"
                con.execute(
                    text(
                        "INSERT INTO contents (seq, content_hash, kind, ranks, ops, deps, missing, "
                        "messages, graph_name, status, created) VALUES (:seq, :h, :kind, :ranks, :ops, "
                        ":deps, :missing, :messages, :name, :status, :created)"
                    ),
                    {
                        **{k: r[k] for k in ("seq", "kind", "ranks", "ops", "deps", "missing", "messages")},
                        "h": upgraded_identity(r["content_hash"], r["kind"], json.loads(r["params"] or "{}")),
                        "name": r["name"],
                        "status": "ready" if ready else "deleting",
                        "created": r["created"],
                    },
                )
                if ready:
                    con.execute(
                        text(
                            "INSERT INTO names (id, name, trace_id, source, parent, parent_trace_id, params, "
                            "created) VALUES (:seq, :name, :seq, :source, :parent, :pseq, :params, :created)"
                        ),
                        {
                            **{k: r[k] for k in ("seq", "name", "source", "parent", "params", "created")},
                            "pseq": seq_of.get(r["parent"]) if r["parent"] else None,
                        },
                    )
            con.execute(text("DROP TABLE traces"))
            con.execute(text("CREATE TABLE etstore_format (version INTEGER NOT NULL)"))
            con.execute(text("INSERT INTO etstore_format VALUES (:v)"), {"v": FORMAT_VERSION})

    # ------------------------------------------------------------ reads

    def session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    def name(self, name: str) -> tuple[NameRecord, ContentRecord] | None:
        """A name and its (ready) content, or None."""
        with self.session() as s:
            q = (
                select(NameRecord, ContentRecord)
                .where(NameRecord.name == name, ContentRecord.seq == NameRecord.trace_id)
                .where(ContentRecord.status == "ready")
            )
            row = s.exec(q).first()
            return (row[0], row[1]) if row is not None else None

    def names(self) -> list[tuple[NameRecord, ContentRecord]]:
        """Every name of a ready content, oldest first."""
        with self.session() as s:
            q = (
                select(NameRecord, ContentRecord)
                .where(ContentRecord.seq == NameRecord.trace_id, ContentRecord.status == "ready")
                .order_by(col(NameRecord.id))
            )
            return [(n, c) for n, c in s.exec(q).all()]

    def all_names(self) -> set[str]:
        """Every name, whatever state its content is in."""
        return set(self.name_ids())

    def name_ids(self) -> dict[str, int]:
        """Every name → its content's trace id, whatever state the content is in."""
        with self.session() as s:
            return {n: t for n, t in s.exec(select(NameRecord.name, NameRecord.trace_id)).all()}

    def content_count(self) -> int:
        """How many contents the catalog holds, in any state."""
        with self.session() as s:
            return len(s.exec(select(ContentRecord.seq)).all())

    def names_of(self, trace_id: int) -> list[NameRecord]:
        """The names of one content, oldest first."""
        with self.session() as s:
            q = select(NameRecord).where(NameRecord.trace_id == trace_id).order_by(col(NameRecord.id))
            return list(s.exec(q).all())

    def content(self, trace_id: int) -> ContentRecord | None:
        with self.session() as s:
            return s.get(ContentRecord, trace_id)

    def by_identity(self, digest: str, kind: str) -> ContentRecord | None:
        """The ready content with this digest and kind, if stored."""
        with self.session() as s:
            q = select(ContentRecord).where(
                ContentRecord.content_hash == digest,
                ContentRecord.kind == kind,
                ContentRecord.status == "ready",
            )
            return s.exec(q).first()

    def stale(self) -> list[ContentRecord]:
        """Contents to sweep: not ready, or ready with no name pointing at them."""
        with self.session() as s:
            named = select(NameRecord.trace_id)
            q = select(ContentRecord).where(
                or_(col(ContentRecord.status) != "ready", ~col(ContentRecord.seq).in_(named))
            )
            return list(s.exec(q).all())

    def misnamed_graphs(self) -> list[ContentRecord]:
        """Ready contents whose graph nodes carry a name that no longer points at them."""
        with self.session() as s:
            mine = select(NameRecord.name).where(NameRecord.trace_id == ContentRecord.seq)
            q = select(ContentRecord).where(
                ContentRecord.status == "ready", ~col(ContentRecord.graph_name).in_(mine)
            )
            return list(s.exec(q).all())

    # ------------------------------------------------------------ writes

    def add_content(self, record: ContentRecord) -> ContentRecord:
        """Claim a new content (``loading``); returns it with its sequence number."""
        with self.session() as s:
            s.add(record)
            s.commit()
            s.refresh(record)
            return record

    def commit_content(self, seq: int, first: NameRecord, **counts: Any) -> ContentRecord:
        """The commit point of an ingest: the content is ready and has its first name, at once.

        Raises
        ------
        StoreError
            The name was taken meanwhile (another process), or the content row vanished.
        """
        with self.session() as s:
            rec = s.get(ContentRecord, seq)
            if rec is None:
                raise StoreError(f"trace id {seq} vanished from the catalog while it was written")
            for k, v in counts.items():
                setattr(rec, k, v)
            rec.status = "ready"
            s.add(rec)
            s.add(first)
            _commit(s, first.name)
            s.refresh(rec)
            return rec

    def add_name(self, record: NameRecord) -> NameRecord:
        """Point one more name at a stored content (one transaction).

        Raises
        ------
        StoreError
            The name was taken meanwhile (another process).
        """
        with self.session() as s:
            s.add(record)
            _commit(s, record.name)
            s.refresh(record)
            return record

    def drop_name(self, name: str) -> tuple[NameRecord, list[NameRecord]] | None:
        """Remove a name; returns it and the names its content still has (the commit point of
        a removal). A content left without names is marked ``deleting`` in the same transaction."""
        with self.session() as s:
            rec = s.exec(select(NameRecord).where(NameRecord.name == name)).first()
            if rec is None:
                return None
            s.delete(rec)
            rest = list(
                s.exec(
                    select(NameRecord)
                    .where(NameRecord.trace_id == rec.trace_id, NameRecord.name != name)
                    .order_by(col(NameRecord.id))
                ).all()
            )
            if not rest:
                content = s.get(ContentRecord, rec.trace_id)
                if content is not None:
                    content.status = "deleting"
                    s.add(content)
            s.commit()
            return rec, rest

    def set_graph_name(self, seq: int, name: str) -> None:
        with self.session() as s:
            rec = s.get(ContentRecord, seq)
            if rec is not None:
                rec.graph_name = name
                s.add(rec)
                s.commit()

    def mark_deleting(self, seq: int) -> None:
        with self.session() as s:
            rec = s.get(ContentRecord, seq)
            if rec is not None:
                rec.status = "deleting"
                s.add(rec)
                s.commit()

    def delete_content(self, seq: int) -> None:
        """Forget a content and any name still pointing at it."""
        with self.session() as s:
            for n in s.exec(select(NameRecord).where(NameRecord.trace_id == seq)).all():
                s.delete(n)
            rec = s.get(ContentRecord, seq)
            if rec is not None:
                s.delete(rec)
            s.commit()

    def lineage_users(self, trace_id: int, parent_trace_id: int) -> int:
        """How many names of content ``trace_id`` derive from content ``parent_trace_id``."""
        with self.session() as s:
            q = select(NameRecord.id).where(
                NameRecord.trace_id == trace_id, NameRecord.parent_trace_id == parent_trace_id
            )
            return len(s.exec(q).all())


def _commit(session: Session, name: str) -> None:
    """Commit, turning a taken name into a StoreError."""
    try:
        session.commit()
    except IntegrityError as exc:
        session.rollback()
        raise StoreError(f"{name!r} was taken by another ingest meanwhile; nothing was stored") from exc
