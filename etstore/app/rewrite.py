"""Apply opportunities to a stored trace: load it, rewrite it, store the rewrite with its lineage.

:func:`rewrite_stored` is what ``etstore rewrite`` runs: it reads what the finders recorded
(``opportunities``, :mod:`etstore.app.opportunities`) or runs them
(:mod:`etstore.app.overlap`), rewrites (:mod:`etstore.analysis.rewrite`, pure) and stores the
result as a child of the trace.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from etstore.analysis.rewrite import REWRITE_KINDS, REWRITE_OF, rewrite_recording, rewrite_with_lineage
from etstore.analysis.split import SplitCost
from etstore.app.overlap import expansions_of, find_opportunities
from etstore.errors import RewriteError
from etstore.model import Trace
from etstore.sim.config import SimConfig
from etstore.sim.engine import RECORDED
from etstore.store.base import IngestReport, Store
from etstore.topology import Topology

__all__ = ["rewrite_stored"]


def _numbered_rows(store: Store, trace: str, numbers: Sequence[int]) -> list[tuple[int, str, dict[str, Any]]]:
    """``(id, kind, detail)`` of the numbered opportunities of a trace, in the order
    asked; a number the last ``etstore overlap`` did not record is refused."""
    rows = store.sql(
        "SELECT id, kind, detail FROM opportunities WHERE trace = $t AND id IN (SELECT unnest($n))",
        {"t": trace, "n": [int(x) for x in numbers]},
    ).to_pylist()
    have = {int(r["id"]): (str(r["kind"]), json.loads(r["detail"])) for r in rows}
    lost = [int(x) for x in numbers if int(x) not in have]
    if lost:
        raise RewriteError(
            f"{trace!r} has no opportunity {lost[0]} recorded: run 'etstore overlap {trace}' first "
            "(it numbers them)"
        )
    return [(int(x), *have[int(x)]) for x in numbers]


def _numbered(store: Store, trace: str, numbers: Sequence[int]) -> tuple[str, dict[int, set[int]]]:
    """The rewrite kind and the ops per rank of the numbered (measured) opportunities of a trace."""
    rows = _numbered_rows(store, trace, numbers)
    kinds = {kind for _, kind, _ in rows}
    if len(kinds) > 1:
        raise RewriteError(
            f"opportunities {', '.join(map(str, numbers))} of {trace!r} are of several kinds; "
            "apply one kind at a time"
        )
    rewrite_kind, column = REWRITE_OF[kinds.pop()]
    only: dict[int, set[int]] = {}
    for number, _, detail in rows:
        if "applies" not in detail:
            raise RewriteError(
                f"opportunity {number} of {trace!r} was not measured: run 'etstore overlap {trace}' again"
            )
        for a in detail["applies"]:
            only.setdefault(int(a["rank"]), set()).add(int(a[column]))
    return rewrite_kind, only


REWRITE_FINDER = {rewrite: finder for finder, (rewrite, _) in REWRITE_OF.items()}
"""Rewrite → the finder kind whose opportunities it applies."""


def _recorded_details(
    store: Store, trace: Trace, numbers: Sequence[int] | None, topo: Topology | str | None, kind: str
) -> list[dict[str, Any]]:
    """The details of the numbered opportunities of a recording; without numbers, of every one
    of finder ``kind`` the last ``overlap`` of it recorded, else of every one found now on
    ``topo``."""
    if not numbers:
        recorded = store.sql(
            "SELECT id FROM opportunities WHERE trace = $t AND kind = $k AND id IS NOT NULL ORDER BY id",
            {"t": trace.name, "k": kind},
        ).to_arrow()
        if not recorded.num_rows or topo is not None:
            found = find_opportunities(store, trace.name, topo=topo, kinds=(kind,))
            return [
                {**json.loads(d), "opportunity": int(o)}
                for d, o in zip(found["detail"].to_pylist(), found["id"].to_pylist(), strict=True)
            ]
        numbers = recorded["id"].to_pylist()
    return [
        {**detail, "opportunity": number} for number, _, detail in _numbered_rows(store, trace.name, numbers)
    ]


def rewrite_stored(
    store: Store,
    trace: str,
    kind: str,
    *,
    name: str | None = None,
    topo: Topology | str | None = None,
    config: SimConfig | None = None,
    run_id: int | None = None,
    max_pieces: int = 8,
    opportunities: Sequence[int] | None = None,
    split: SplitCost | None = None,
) -> IngestReport:
    """Rewrite a stored trace and store the result with ``parent = trace``.

    A recording (PyTorch ET + Kineto) is rewritten only by ``overlap``: the opportunities
    numbered ``opportunities`` in the ``opportunities`` table (``etstore overlap`` finds and
    numbers them), else every one recorded there, else every one found now on ``topo``
    (:func:`~etstore.analysis.rewrite.rewrite_recording`).

    ``chunk-split`` reads the expansion lineage and orders each consumer's chunks by
    simulated arrival (:func:`~etstore.app.overlap.find_opportunities` with
    ``topo``/``config``/``run_id``). Every op of the result is linked to the op it
    comes from (``BECOMES`` edges; pieces to the op they split).

    Returns
    -------
    IngestReport
        Of the stored result (``report.trace.name``: ``name``, default
        ``<trace>-<kind>``, with parent ``trace``); ``created`` is false when that name
        already holds the same rewritten content; the same content under another name
        gets this name too (``report.same_as``).

    Raises
    ------
    UnknownTraceError
        No such trace.
    RewriteError
        As :func:`~etstore.analysis.rewrite.rewrite`, or ``chunk-split`` of a trace without expansion lineage.
    """
    if kind not in REWRITE_KINDS:
        raise RewriteError(f"unknown rewrite {kind!r}; expected one of {', '.join(REWRITE_KINDS)}")
    original = store.load(trace)
    if original.params.get("execution") == RECORDED:  # expanded too: its lanes stay chains
        if kind not in ("overlap", "chunk-split"):
            raise RewriteError(
                f"{trace!r} is a recording: its ops move only within their thread or stream, which "
                f"the overlap and chunk-split rewrites do; {kind} does not apply"
            )
        details = _recorded_details(store, original, opportunities, topo, REWRITE_FINDER[kind])
        out = rewrite_recording(original, details, name=name or f"{trace}-{kind}")
        pieces = out.params.get("split_pieces") or {"rank": [], "id": [], "op": []}
        of = {
            (int(r), int(i)): int(o)
            for r, i, o in zip(pieces["rank"], pieces["id"], pieces["op"], strict=True)
        }
        parent_id = [
            of.get((r, i), i)
            for r, i in zip(out.ops["rank"].to_pylist(), out.ops["id"].to_pylist(), strict=True)
        ]
        lineage = pa.table({"rank": out.ops["rank"], "id": out.ops["id"], "parent_id": parent_id})
        return store.ingest(out, name=name, parent=trace, lineage=lineage)
    only = None
    if opportunities:
        kind, only = _numbered(store, trace, opportunities)
    expansions = None
    order: dict[tuple[int, int], list[int]] = {}
    if kind == "chunk-split":
        expansions = expansions_of(store, trace)
        if expansions.num_rows == 0:
            raise RewriteError(
                f"chunk-split needs an expanded trace; {trace!r} has no ops expanded from a collective"
            )
        found = find_opportunities(
            store,
            trace,
            topo=topo,
            config=config,
            run_id=run_id,
            kinds=("chunk",),
            max_pieces=max_pieces,
            measure=False,  # every consumer's arrival order: the rewrite splits them all
            split=split,
        )
        for r, other, detail in zip(
            found["rank"].to_pylist(), found["other_id"].to_pylist(), found["detail"].to_pylist(), strict=True
        ):
            order[(int(r), int(other))] = [int(s) for s, _ in json.loads(detail)["chunks"]]
    out, lineage = rewrite_with_lineage(
        original,
        kind,
        expansions=expansions,
        chunk_order=order,
        max_pieces=max_pieces,
        name=name,
        only=only,
        split=split,
    )
    if only is not None:
        out = out.replace(params={**out.params, "opportunities": [int(x) for x in opportunities or ()]})
    if not out.params.get("changes"):
        raise RewriteError(f"{kind} finds nothing to change in {trace!r}; nothing was stored")
    return store.ingest(out, name=name, parent=trace, lineage=lineage)
