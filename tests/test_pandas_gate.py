"""pandas hidden from the command's process: imports fail as for a missing module, Arrow
still converts, and inside arrow_scan() find_spec calls it absent, so Ladybug scans Arrow
tables without loading it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def _in_fresh_process(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_hidden_pandas_fails_to_import_and_arrow_converts_without_it() -> None:
    pytest.importorskip("pandas")  # where it is not installed, nothing is hidden
    out = _in_fresh_process(
        """
        import sys
        import numpy as np
        import pyarrow as pa
        from etstore.pandas_gate import hide_pandas
        hide_pandas()
        hide_pandas()  # once is enough: the second call adds no second finder
        a = pa.array(np.arange(5, dtype=np.int64))
        s = pa.array(["x", None]).to_numpy(zero_copy_only=False)
        t = pa.table({"a": a}).column("a").to_numpy()
        assert a.to_numpy().tolist() == t.tolist() == [0, 1, 2, 3, 4] and s.tolist() == ["x", None]
        assert "pandas" not in sys.modules
        try:
            import pandas
        except ModuleNotFoundError as exc:
            print("hidden:", exc.name)
        """
    )
    assert out == "hidden: pandas"


def test_a_ladybug_scan_inside_arrow_scan_loads_no_pandas(tmp_path: Path) -> None:
    pytest.importorskip("pandas")
    out = _in_fresh_process(
        f"""
        import importlib.util, sys
        import pyarrow as pa
        import ladybug
        from etstore.pandas_gate import arrow_scan, hide_pandas
        hide_pandas()
        conn = ladybug.Connection(ladybug.Database({str(tmp_path / "g")!r}))
        conn.execute("CREATE NODE TABLE N(id INT64, PRIMARY KEY(id))")
        rows = pa.table({{"id": pa.array(range(7), pa.int64())}})
        with arrow_scan():
            print("inside:", importlib.util.find_spec("pandas"))
            conn.execute("COPY N FROM rows")
        try:
            import pandas
        except ModuleNotFoundError as exc:
            print("after:", sys.modules.get("pandas", "unset"), exc.name)
        print("nodes:", conn.execute("MATCH (n:N) RETURN count(*)").get_as_arrow().column(0).to_pylist())
        """
    )
    # after the block the mark is gone and the finder hides pandas again
    assert out.splitlines() == ["inside: None", "after: unset pandas", "nodes: [7]"]


def test_an_imported_pandas_is_left_alone() -> None:
    pytest.importorskip("pandas")
    out = _in_fresh_process(
        """
        import sys, pandas
        from etstore.pandas_gate import hide_pandas
        hide_pandas()
        import pandas as again
        print(again is pandas, any(type(f).__name__ == "_HiddenPandas" for f in sys.meta_path))
        """
    )
    assert out == "True False"
