"""Every SQL example in docs/metrics.md runs against a real run's DuckDB file and returns rows."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest

from etstore.app.runs import RUN_TABLES
from etstore.testing import RecordedStore as Recorded

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
EXAMPLES = re.findall(r"```sql\n(.*?)```", DOC.read_text(), re.S)


def test_the_doc_has_examples_for_every_view() -> None:
    assert len(EXAMPLES) >= 10
    text = "\n".join(EXAMPLES)
    for view in RUN_TABLES.views:
        assert view in text, f"docs/metrics.md has no example using {view}"


@pytest.mark.parametrize("sql", EXAMPLES, ids=[e.split("\n")[0][:50] for e in EXAMPLES])
def test_example_runs_on_a_real_run(recorded: Recorded, sql: str) -> None:
    # a dashboard opens the store's file read-only, as the doc says
    con = duckdb.connect(str(recorded.path / "warehouse.duckdb"), read_only=True)
    try:
        rows = con.sql(sql).fetchall()
    finally:
        con.close()
    assert rows, f"example returned no rows:\n{sql}"
