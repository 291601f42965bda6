"""The report's opportunities section on the finders' real output: sentences, largest gain first, capped."""

from __future__ import annotations

import json
import re
from pathlib import Path

from etstore.report import opportunities
from etstore.report.opportunity_table import describe_opportunity, opportunities_html
from etstore.store import EmbeddedStore


def _rows(section: str) -> list[list[str]]:
    body = re.findall(r"<tbody>(.*?)</tbody>", section)
    return [re.findall(r"<td[^>]*>(.*?)</td>", row) for b in body for row in re.findall(r"<tr>(.*?)</tr>", b)]


def test_rows_read_as_sentences_largest_gain_first(hand_runs: tuple[Path, list[int]]) -> None:
    path, _ = hand_runs
    with EmbeddedStore(path, read_only=True) as store:
        section = opportunities_html(store.warehouse, ["hand", "expanded", "hand"])
        raw = store.sql("SELECT detail FROM opportunities").to_arrow()["detail"].to_pylist()
    assert all(json.loads(d) for d in raw)  # the finders store JSON ...
    assert (
        "{" not in section and "[" not in section and "&quot;" not in section
    )  # ... the report does not show it
    assert section.count("<table>") == 2  # one table per trace, a trace named twice listed once
    assert (
        "Trace <b>hand</b>: 4 opportunities (reorder: 2 worth 110.00 µs, overlap: 2 worth 40.00 µs)"
        in section
    )
    assert "Trace <b>expanded</b>: 2 opportunities (chunk: 2 worth 6.00 µs), all listed below." in section
    rows = _rows(section)
    # tests/app/test_overlap.py's hand-worked values: reorder 55 µs (issue at 65.1 µs, not 120.1),
    # overlap 20 µs (indep, 20 µs, behind a 55.1 µs all-reduce), chunk 3 µs (two pieces)
    assert [r[:4] + r[5:] for r in rows] == [
        ["reorder", "0", "5 send_act", "4 stats", "55.00 µs (estimate)"],
        ["reorder", "1", "5 send_act", "4 stats", "55.00 µs (estimate)"],
        ["overlap", "0", "1 grad_allreduce", "2 indep", "20.00 µs (estimate)"],
        ["overlap", "1", "1 grad_allreduce", "2 indep", "20.00 µs (estimate)"],
        ["chunk", "0", "1", "3 apply", "3.00 µs (estimate)"],
        ["chunk", "1", "1", "3 apply", "3.00 µs (estimate)"],
    ]
    assert rows[0][4] == (
        "could be issued at 65.10 µs instead of 120.10 µs: 3 compute ops ahead of it do not feed it"
    )
    assert rows[2][4] == (
        "1 compute op (20.00 µs) waits for the collective (55.10 µs) without using its data: "
        "it could run under it"
    )
    assert rows[4][4] == (
        "split into 2 pieces as its 2 chunks arrive: starts 10.27 µs earlier and ends at 35.53 µs "
        "instead of 38.53 µs"
    )


def test_long_lists_are_capped_with_a_count_of_the_rest(hand_runs: tuple[Path, list[int]]) -> None:
    path, _ = hand_runs
    with EmbeddedStore(path, read_only=True) as store:
        section = opportunities_html(store.warehouse, ["hand"], limit=3)
        found = opportunities(store.warehouse, "hand", limit=3)
        none = opportunities_html(store.warehouse, ["nothing-recorded"])
    assert found is not None and found[0].num_rows == 3
    assert "the 3 largest gains below" in section
    assert [r[0] for r in _rows(section)] == ["reorder", "reorder", "overlap"]
    assert (
        "… and 1 more: <code>SELECT * FROM opportunities WHERE trace = 'hand' ORDER BY gain_ns DESC</code>"
        in section
    )
    assert "No overlap, chunk or reorder opportunities are recorded for trace nothing-recorded" in none


def test_a_recordings_hoist_reads_as_a_sentence() -> None:
    detail = {
        "held": "cudaStreamSynchronize",
        "moves": [
            {"rank": 0, "before": 5, "moved": [6, 7], "gap_ns": 9.0},
            {"rank": 1, "before": 5, "moved": [6]},
        ],
        "alone_gain_ns": 1500.0,
        "measured": True,
    }
    assert describe_opportunity("overlap", json.dumps(detail)) == (
        "3 ops on 2 ranks moved in front of cudaStreamSynchronize, where their thread or stream waited "
        "(alone: 1.50 µs)"
    )


def test_details_that_are_not_a_finders_json() -> None:
    assert describe_opportunity("reorder", "swap") == "swap"  # free text passes through
    assert describe_opportunity("overlap", None) == ""
    assert describe_opportunity("overlap", "x" * 300) == "x" * 159 + "…"
    assert describe_opportunity("overlap", "[1, 2, 3]") == "3 items"
    # a finder's kind with fields it does not write, and a kind of its own: the fields, listed
    assert describe_opportunity("chunk", '{"pieces": [[0], [1]]}') == "pieces: 2 items"
    assert describe_opportunity("custom", '{"gap_ns": 2500.0, "why": "idle link", "ids": [1, 2]}') == (
        "gap: 2.50 µs, why: idle link, ids: 2 items"
    )
