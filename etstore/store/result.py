"""One result type for Cypher and SQL: Arrow first, other forms on request."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from etstore.errors import DependencyError, QueryError

__all__ = ["Result"]


def _missing(package: str) -> DependencyError:
    return DependencyError(f"{package} is not installed; run: pip install {package}")


class Result:
    """A finished query: ``len()``, row iteration, and ``to_arrow()`` / ``to_pandas()`` /
    ``to_polars()`` / ``to_pylist()``. Optional libraries load only when asked for.
    """

    __slots__ = ("_table", "query")

    def __init__(self, table: pa.Table, query: str = "") -> None:
        self._table = table
        self.query = query

    def __len__(self) -> int:
        return self._table.num_rows

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        cols = [c.to_pylist() for c in self._table.columns]
        return iter(zip(*cols, strict=True)) if cols else iter(())

    def __repr__(self) -> str:
        return f"Result({self._table.num_rows} rows × {self._table.num_columns} columns: {self.columns})"

    @property
    def columns(self) -> list[str]:
        return list(self._table.column_names)

    def to_arrow(self) -> pa.Table:
        """The result as an Arrow table (the primary form)."""
        return self._table

    def to_pylist(self) -> list[dict[str, Any]]:
        """Rows as dicts."""
        return self._table.to_pylist()

    def scalar(self) -> Any:
        """The single value of a one-row, one-column result."""
        if self._table.num_rows != 1 or self._table.num_columns != 1:
            raise QueryError(f"expected one value, got {self._table.num_rows}×{self._table.num_columns}")
        return self._table.column(0)[0].as_py()

    def to_pandas(self) -> Any:
        """The result as a pandas DataFrame."""
        try:
            import pandas  # noqa: F401  # optional, and only wanted here: checked on demand
        except ImportError as exc:
            raise _missing("pandas") from exc
        return self._table.to_pandas()

    def to_polars(self) -> Any:
        """The result as a polars DataFrame."""
        try:
            import polars  # optional, and only wanted here: imported on demand
        except ImportError as exc:
            raise _missing("polars") from exc
        return polars.from_arrow(self._table)
