"""The catalog: which traces exist, and whether they are complete.

A trace row is written with ``status='loading'`` before any data lands and flipped
to ``'ready'`` last; that flip is the commit point of an ingest. Rows left in
``loading`` (a crash, a kill) are swept on the next open, together with their data.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlmodel import Field, Session, SQLModel, create_engine, select

from etstore.model import TraceKind
from etstore.store.base import TraceInfo

__all__ = ["Catalog", "TraceRecord"]


class TraceRecord(SQLModel, table=True):
    """One stored trace."""

    __tablename__ = "traces"
    __table_args__ = {"sqlite_autoincrement": True}  # never reuse a seq: uids derive from it
    seq: int | None = Field(default=None, primary_key=True)
    name: str = Field(index=True, unique=True)
    kind: str
    source: str = ""
    content_hash: str = Field(index=True)
    ranks: int = 0
    ops: int = 0
    deps: int = 0
    missing: int = 0
    messages: int = 0
    parent: str | None = None
    params: str = "{}"
    status: str = "loading"
    created: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))

    def info(self) -> TraceInfo:
        return TraceInfo(
            name=self.name,
            kind=self.kind,
            source=self.source,
            content_hash=self.content_hash,
            ranks=self.ranks,
            ops=self.ops,
            deps=self.deps,
            missing=self.missing,
            messages=self.messages,
            parent=self.parent,
            params=json.loads(self.params),
            created=self.created,
        )


class Catalog:
    """SQLite-backed catalog of one store directory."""

    def __init__(self, path: Path) -> None:
        self.engine = create_engine(f"sqlite:///{path}")

        @event.listens_for(self.engine, "connect")
        def _pragmas(dbapi_con: Any, _record: Any) -> None:
            dbapi_con.execute("PRAGMA journal_mode=WAL")
            dbapi_con.execute("PRAGMA synchronous=NORMAL")

        SQLModel.metadata.create_all(self.engine, tables=[SQLModel.metadata.tables["traces"]])

    def session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    def by_name(self, name: str, *, ready_only: bool = True) -> TraceRecord | None:
        with self.session() as s:
            q = select(TraceRecord).where(TraceRecord.name == name)
            if ready_only:
                q = q.where(TraceRecord.status == "ready")
            return s.exec(q).first()

    def by_hash(self, content_hash: str, kind: TraceKind) -> TraceRecord | None:
        with self.session() as s:
            q = select(TraceRecord).where(
                TraceRecord.content_hash == content_hash,
                TraceRecord.kind == kind.value,
                TraceRecord.status == "ready",
            )
            return s.exec(q).first()

    def names(self) -> set[str]:
        with self.session() as s:
            return set(s.exec(select(TraceRecord.name)).all())

    def ready(self) -> list[TraceRecord]:
        with self.session() as s:
            q = select(TraceRecord).where(TraceRecord.status == "ready").order_by(TraceRecord.seq)
            return list(s.exec(q).all())

    def stale(self) -> list[TraceRecord]:
        with self.session() as s:
            return list(s.exec(select(TraceRecord).where(TraceRecord.status != "ready")).all())

    def add(self, record: TraceRecord) -> TraceRecord:
        with self.session() as s:
            s.add(record)
            s.commit()
            s.refresh(record)
            return record

    def mark_ready(self, seq: int, **counts: Any) -> TraceRecord:
        with self.session() as s:
            rec = s.get(TraceRecord, seq)
            assert rec is not None
            for k, v in counts.items():
                setattr(rec, k, v)
            rec.status = "ready"
            s.add(rec)
            s.commit()
            s.refresh(rec)
            return rec

    def mark_deleting(self, seq: int) -> None:
        with self.session() as s:
            rec = s.get(TraceRecord, seq)
            if rec is not None:
                rec.status = "deleting"
                s.add(rec)
                s.commit()

    def delete(self, seq: int) -> None:
        with self.session() as s:
            rec = s.get(TraceRecord, seq)
            if rec is not None:
                s.delete(rec)
                s.commit()
