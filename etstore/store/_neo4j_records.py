"""The runs and metrics ``etstore publish`` sends, as the server holds them and a reader gets them back.

Each kind of record is a node label keyed by ``key`` and owned by the publishing store
(``store``), with child rows hanging off it by a relationship (``docs/neo4j.md``, "What
lands on the server"). :data:`SHAPES` names them and the warehouse tables they come from;
:mod:`etstore.app._publish_records` reads those tables to send them, and the read view's
client-side SQL copy (:mod:`etstore.store._mirror`) gets its ``runs``, ``rank_breakdown``,
``comparisons``, ``opportunities``, ``measured_runs``, ``measurements``, ``tuner_runs``,
``tuner_steps``, ``calibrations``, ``calibration_points`` and ``sweep_points`` rows back
from them (:func:`read_records`).

Ids are the publishing store's own: where two stores published records with one id (each
store numbers its runs from 1), the record ordered first by (id, store, key) keeps it and
the others get the next free ids, and a name two stores used gets ``-2``, ``-3``, ...;
references between records (a comparison's runs, a calibration's measured run) follow.
Summaries the server holds instead of rows (``CollectiveStat``: per collective type,
algorithm, group size and size; a run's ``links`` fields) have no table in the copy; a run's
``collectives``, ``link_util`` and ``op_timings`` rows are not published.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from etstore.store._neo4j_dialect import plain

__all__ = ["SHAPES", "Child", "RecordShape", "fingerprint", "read_records"]

Run = Callable[..., list[Any]]
"""``run(query, params)``: one statement on the server, its records."""


@dataclass(frozen=True)
class Child:
    """Child rows of a record: ``(record)-[:rel]->(:label)``."""

    rel: str
    label: str
    table: str | None
    """The warehouse table a child is a row of (None: a summary with no table)."""
    inherit: tuple[str, ...] = ()
    """Columns a child row takes from its record's row (after renumbering)."""


@dataclass(frozen=True)
class RecordShape:
    """One kind of published record (see the module docstring)."""

    label: str
    table: str | None
    """The warehouse table a record is a row of (None: only its children have rows)."""
    id_column: str | None = None
    name_column: str | None = None
    children: tuple[Child, ...] = ()
    refs: tuple[tuple[str, str, str | None], ...] = ()
    """``(column, label, key property)``: a column naming another record, by the key that
    this record's ``key property`` holds, or (None) by the id its store gave it."""


SHAPES: tuple[RecordShape, ...] = (
    RecordShape(
        "Run",
        "runs",
        "run_id",
        children=(
            Child("COLLECTIVE", "CollectiveStat", None),
            Child("RANK", "RankTime", "rank_breakdown", ("run_id", "trace")),
        ),
    ),
    RecordShape(
        "Comparison",
        "comparisons",
        "comparison_id",
        children=(
            Child(
                "RANK",
                "ComparisonRank",
                "comparisons",
                (
                    "comparison_id",
                    "trace_a",
                    "trace_b",
                    "run_a",
                    "run_b",
                    "topology",
                    "congestion",
                    "created_at",
                ),
            ),
        ),
        refs=(("run_a", "Run", "run_a_key"), ("run_b", "Run", "run_b_key")),
    ),
    RecordShape("Opportunity", "opportunities"),
    RecordShape(
        "MeasuredRun",
        "measured_runs",
        "run_id",
        "name",
        children=(Child("POINT", "Measurement", "measurements", ("run_id",)),),
    ),
    RecordShape(
        "TunerRun",
        "tuner_runs",
        "run_id",
        "name",
        children=(Child("STEP", "TunerStep", "tuner_steps", ("run_id",)),),
    ),
    RecordShape(
        "Calibration",
        "calibrations",
        "calibration_id",
        "name",
        children=(Child("POINT", "CalibrationPoint", "calibration_points", ("calibration_id",)),),
        refs=(("measured_run_id", "MeasuredRun", None),),
    ),
    RecordShape(
        "Sweep", None, "sweep_id", children=(Child("POINT", "SweepPoint", "sweep_points", ("sweep_id",)),)
    ),
)
"""Every kind of record publish sends, runs before what refers to them."""

_ID_COLUMN: dict[str, str] = {s.label: s.id_column for s in SHAPES if s.id_column is not None}

TABLES: tuple[str, ...] = tuple(
    dict.fromkeys(t for s in SHAPES for t in (s.table, *(c.table for c in s.children)) if t is not None)
)
"""The warehouse tables a reader's copy fills from the published records."""


def fingerprint(run: Run) -> str:
    """A digest of which records the server holds (their labels, keys and stores): records are
    never changed once published, so while it stays the same so do the rows they give."""
    digest = hashlib.sha256()
    for shape in SHAPES:
        rows = run(f"MATCH (n:{shape.label}) RETURN n.key AS k, n.store AS s ORDER BY k, s")
        digest.update(shape.label.encode())
        for r in rows:
            digest.update(f"\0{r['k']}\0{r['s']}".encode())
    return digest.hexdigest()


def read_records(run: Run) -> dict[str, list[dict[str, Any]]]:
    """Every published record and child row, as rows of their warehouse tables (by table name;
    properties no column holds stay in the rows, for the caller to drop). O(records + rows)."""
    tables: dict[str, list[dict[str, Any]]] = {t: [] for t in TABLES}
    by_key: dict[tuple[str, str], dict[str, Any]] = {}  # (label, key) -> the record's row
    ids: dict[tuple[str, Any, Any], Any] = {}  # (label, store, the store's id) -> the id here
    for shape in SHAPES:
        rows = [plain(r["n"]) for r in run(f"MATCH (n:{shape.label}) RETURN properties(n) AS n")]
        if shape.id_column is not None:
            for (store, old), new in _renumber(rows, shape.id_column).items():
                ids[(shape.label, store, old)] = new
            rows.sort(key=lambda r: r[shape.id_column])
        if shape.name_column is not None:
            _rename(rows, shape.name_column)
        for row in rows:
            for column, label, key in shape.refs:
                if key is None:
                    row[column] = ids.get((label, row.get("store"), row.get(column)))
                else:
                    target = by_key.get((label, str(row.get(key))))
                    row[column] = target.get(_ID_COLUMN[label]) if target is not None else None
            by_key[(shape.label, str(row.get("key")))] = row
        if shape.table is not None:
            tables[shape.table] += rows
        for child in shape.children:
            if child.table is None:
                continue
            got = run(
                f"MATCH (n:{shape.label})-[:{child.rel}]->(c:{child.label}) "
                "RETURN n.key AS k, properties(c) AS c"
            )
            for r in got:
                parent = by_key[(shape.label, str(r["k"]))]
                tables[child.table].append({**plain(r["c"]), **{c: parent.get(c) for c in child.inherit}})
    return tables


def _renumber(rows: Iterable[dict[str, Any]], column: str) -> dict[tuple[Any, Any], Any]:
    """Give each record in ``rows`` an id no other holds (see the module docstring), in place;
    returns (store, the store's id) -> the id here."""
    ordered = sorted(
        rows, key=lambda r: (r.get(column) is None, r.get(column) or 0, r.get("store") or "", r["key"])
    )
    top = max((r[column] for r in ordered if r.get(column) is not None), default=0)
    taken: set[Any] = set()
    mapping: dict[tuple[Any, Any], Any] = {}
    for row in ordered:
        old = row.get(column)
        new = old
        if old is None or old in taken:
            top += 1
            new = top
        taken.add(new)
        mapping[(row.get("store"), old)] = new
        row[column] = new
    return mapping


def _rename(rows: list[dict[str, Any]], column: str) -> None:
    """Suffix ``-2``, ``-3``, ... to a name an earlier record (by id) holds, in place."""
    taken: set[str] = set()
    for row in rows:
        name = str(row.get(column))
        wanted, n = name, 1
        while name in taken:
            n += 1
            name = f"{wanted}-{n}"
        taken.add(name)
        row[column] = name
