"""The catalog of an embedded store, kept in its DuckDB warehouse beside the data it describes.

Content is stored once; names are handles. A *content* row (``contents``) is one trace's
data, keyed by its *trace id* (``trace_ops`` ... rows and graph uids derive from it) and
identified by its digest (:func:`~etstore.store._identity.identity`). A *name* is a row of
``traces``: a name the user chose, the content it points at, and what belongs to the name
(parent, source, parameters, creation time). Two names may share one content; the content
goes when its last name does.

Because the catalog lives in the same database as the rows, an ingest (content, rows and
first name), a naming and a removal each commit in one DuckDB transaction: there is no
other commit point to keep in step. A streamed ingest commits its parts one by one under a
``loading`` content row (invisible: no name points at it) and flips it to ``ready`` with its
first name in the last transaction; loading contents and contents without a name are swept
by the next writable open. ``store_format`` holds the store format (:data:`FORMAT_VERSION`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from etstore.errors import StoreError
from etstore.store import _trace_rows as rows
from etstore.store.info import FORMAT_VERSION, TraceInfo
from etstore.store.warehouse import Warehouse

__all__ = ["FORMAT_VERSION", "Catalog", "ContentRecord", "NameRecord"]


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


@dataclass
class ContentRecord:
    """One stored content: the rows held under trace id ``trace_id``."""

    content_hash: str
    kind: str
    ranks: int = 0
    ops: int = 0
    deps: int = 0
    missing: int = 0
    messages: int = 0
    status: str = "loading"
    created: datetime = field(default_factory=_now)
    trace_id: int | None = None

    def counts(self) -> dict[str, int]:
        """The content's row counts, as the ``traces`` row of each of its names repeats them."""
        return {k: getattr(self, k) for k in ("ranks", "ops", "deps", "missing", "messages")}


@dataclass
class NameRecord:
    """One name: a handle on a content, with its own parent, source and parameters."""

    name: str
    trace_id: int
    source: str = ""
    parent: str | None = None
    parent_trace_id: int | None = None  # the parent's content when this name was made
    params: str = "{}"
    created: datetime = field(default_factory=_now)

    @classmethod
    def new(
        cls,
        name: str,
        source: str,
        params: Mapping[str, Any],
        parent: str | None,
        parent_trace_id: int | None,
    ) -> NameRecord:
        """A name about to be stored (its content's id is set once the content is claimed)."""
        text = json.dumps(dict(params), sort_keys=True, default=str)
        return cls(name, 0, source, parent, parent_trace_id, text)

    def info(self, content: ContentRecord) -> TraceInfo:
        """The name as the store interface shows it."""
        return TraceInfo(
            name=self.name,
            kind=content.kind,
            source=self.source,
            content_hash=content.content_hash,
            parent=self.parent,
            params=json.loads(self.params),
            created=self.created.replace(tzinfo=timezone.utc),
            trace_id=self.trace_id,
            **content.counts(),
        )


_CONTENT_COLS = (
    "content_hash",
    "kind",
    "ranks",
    "ops",
    "deps",
    "missing",
    "messages",
    "status",
    "created",
    "trace_id",
)
_NAME_COLS = ("name", "trace_id", "source", "parent", "parent_trace_id", "params", "created")
_PAIRS = (
    f"SELECT {', '.join('n.' + c for c in _NAME_COLS)}, {', '.join('c.' + c for c in _CONTENT_COLS)} "
    "FROM traces n JOIN contents c ON c.trace_id = n.trace_id AND c.status = 'ready'"
)


def _pair(row: tuple[Any, ...]) -> tuple[NameRecord, ContentRecord]:
    k = len(_NAME_COLS)
    name = NameRecord(*row[:k])
    if name.created is None:  # a name upgraded from a store that kept no time for it
        name.created = _now()
    return name, ContentRecord(*row[k:])


class Catalog:
    """The contents and names of one store, read and written through its warehouse.

    Writes are statements for the caller's transaction (:meth:`Warehouse.transaction`), so
    that a content's rows and its catalog rows commit together.
    """

    def __init__(self, warehouse: Warehouse) -> None:
        self.wh = warehouse

    # ------------------------------------------------------------ reads

    def _pairs(
        self, where: str = "", params: Mapping[str, Any] | None = None
    ) -> list[tuple[NameRecord, ContentRecord]]:
        sql = f"{_PAIRS} {where} ORDER BY n.created, n.name"
        return [_pair(r) for r in self.wh.query(sql, params)]

    def name(self, name: str) -> tuple[NameRecord, ContentRecord] | None:
        """A name and its (ready) content, or None."""
        got = self._pairs("WHERE n.name = $n", {"n": name})
        return got[0] if got else None

    def names(self) -> list[tuple[NameRecord, ContentRecord]]:
        """Every name of a ready content with that content, oldest first."""
        return self._pairs()

    def all_names(self) -> set[str]:
        """Every name stored."""
        return {str(r[0]) for r in self.wh.query("SELECT name FROM traces")}

    def name_ids(self) -> dict[str, int]:
        """Every name → the trace id it points at."""
        return {str(n): int(t) for n, t in self.wh.query("SELECT name, trace_id FROM traces")}

    def names_of(self, trace_id: int) -> list[NameRecord]:
        """The names pointing at content ``trace_id``, oldest first."""
        return [n for n, _ in self._pairs("WHERE n.trace_id = $t", {"t": trace_id})]

    def content(self, trace_id: int) -> ContentRecord | None:
        """Content ``trace_id`` in any state, or None."""
        got = list(
            self.wh.query(
                f"SELECT {', '.join(_CONTENT_COLS)} FROM contents WHERE trace_id = $t", {"t": trace_id}
            )
        )
        return ContentRecord(*got[0]) if got else None

    def contents(self) -> list[ContentRecord]:
        """Every ready content."""
        sql = f"SELECT {', '.join(_CONTENT_COLS)} FROM contents WHERE status = 'ready' ORDER BY trace_id"
        return [ContentRecord(*r) for r in self.wh.query(sql)]

    def by_identity(self, digest: str, kind: str) -> ContentRecord | None:
        """The ready content with this identity and kind, or None."""
        got = list(
            self.wh.query(
                f"SELECT {', '.join(_CONTENT_COLS)} FROM contents WHERE content_hash = $h AND kind = $k "
                "AND status = 'ready' ORDER BY trace_id LIMIT 1",
                {"h": digest, "k": kind},
            )
        )
        return ContentRecord(*got[0]) if got else None

    def stale(self) -> list[int]:
        """Contents an interrupted writer left: still loading, or without a name."""
        got = self.wh.query(
            "SELECT trace_id FROM contents c WHERE status <> 'ready' "
            "OR NOT EXISTS (SELECT 1 FROM traces t WHERE t.trace_id = c.trace_id) ORDER BY trace_id"
        )
        return [int(r[0]) for r in got]

    def lineage_users(self, trace_id: int, parent_trace_id: int) -> int:
        """How many names of content ``trace_id`` were derived from content ``parent_trace_id``."""
        return int(
            self.wh.query(
                "SELECT count(*) FROM traces WHERE trace_id = $t AND parent_trace_id = $p",
                {"t": trace_id, "p": parent_trace_id},
            ).scalar()
        )

    # ------------------------------------------------------------ writes (in the caller's transaction)

    def claim(self, record: ContentRecord) -> ContentRecord:
        """Insert ``record`` under a new trace id (never one a graph index may still hold)."""
        record.trace_id = int(
            self.wh.query(
                "SELECT greatest((SELECT coalesce(max(trace_id), 0) FROM contents), "
                "(SELECT coalesce(max(trace_id), 0) FROM graph_index), "
                "(SELECT coalesce(max(last_trace_id), 0) FROM store_format)) + 1"
            ).scalar()
        )
        values = ", ".join("$" + c for c in _CONTENT_COLS)
        self.wh.execute(
            f"INSERT INTO contents ({', '.join(_CONTENT_COLS)}) VALUES ({values})",
            {c: getattr(record, c) for c in _CONTENT_COLS},
        )
        self.wh.execute("UPDATE store_format SET last_trace_id = $t", {"t": record.trace_id})
        return record

    def ready(self, record: ContentRecord) -> None:
        """Mark a claimed content ready, with its final identity and counts."""
        assert record.trace_id is not None
        record.status = "ready"
        sets = ", ".join(f"{c} = ${c}" for c in _CONTENT_COLS if c != "trace_id")
        self.wh.execute(
            f"UPDATE contents SET {sets} WHERE trace_id = $trace_id",
            {c: getattr(record, c) for c in _CONTENT_COLS},
        )

    def add_name(self, name: NameRecord, content: ContentRecord, params: Any) -> None:
        """Insert the ``traces`` row of ``name`` (pointing at ``content``).

        Raises
        ------
        StoreError
            Another writer committed the name after this one chose it (the caller's
            transaction is rolled back: nothing of it is stored).
        """
        assert content.trace_id is not None
        row: dict[str, Any] = {**content.counts(), "kind": content.kind}
        row |= {"parent": name.parent, "source": name.source}
        row |= {"params": params, "content_hash": content.content_hash, "created": name.created}
        try:
            rows.insert_name(self.wh, name.name, content.trace_id, name.parent_trace_id, row)
        except StoreError as exc:
            if "Duplicate key" not in str(exc):
                raise
            raise StoreError(
                f"{name.name!r} was taken by another ingest meanwhile; nothing was stored"
            ) from exc

    def drop_name(self, name: str) -> None:
        """Delete the ``traces`` row of ``name`` (its content stays)."""
        rows.delete_name(self.wh, name)

    def delete_content(self, trace_id: int) -> None:
        """Delete content ``trace_id``: its rows, lineage, names and catalog row."""
        rows.delete_content(self.wh, trace_id)
        self.wh.execute("DELETE FROM contents WHERE trace_id = $t", {"t": trace_id})
