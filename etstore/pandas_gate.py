"""pandas, hidden from the ``etstore`` command's process: :func:`hide_pandas`.

Why: pyarrow imports pandas, when it is installed, the first time it converts to or
from numpy (to check whether it was handed a pandas object, and to prepare its own
pandas conversions) — ≈ 0.2 s of every command that touches Arrow, while no etstore
command uses pandas. A process that only runs the command hides it; pyarrow then works
as it does where pandas is not installed.

Ladybug asks ``importlib.util.find_spec("pandas")`` before it scans an Arrow table
(``COPY ... FROM table``) and imports pandas when that finds it; a finder can only fail
the import, not answer "absent" to that question (it raises the import error instead;
in the command's process only Ladybug asks), so those scans run inside :func:`arrow_scan`.
The library itself never hides anything: a Python user's pandas is theirs.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

__all__ = ["arrow_scan", "hide_pandas"]


class _HiddenPandas:
    """Import finder that fails every import of pandas (as a missing module does)."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"{name} is not used by the etstore command", name=name)


def _gate() -> _HiddenPandas | None:
    return next((f for f in sys.meta_path if isinstance(f, _HiddenPandas)), None)


def hide_pandas() -> None:
    """Make pandas unimportable in this process (nothing changes if it is already imported)."""
    if "pandas" not in sys.modules and _gate() is None:
        sys.meta_path.insert(0, _HiddenPandas())


@contextlib.contextmanager
def arrow_scan() -> Iterator[None]:
    """A Ladybug scan of an Arrow table: where pandas is hidden, ``find_spec`` answers that it
    is absent inside the block.

    ``None`` in ``sys.modules`` is the import system's own mark of a blocked module:
    ``find_spec`` returns None for it and ``import`` fails. pyarrow's check for pandas is
    made before the mark goes in (its Cython import would take the None for a module).
    """
    if _gate() is None or "pandas" in sys.modules:
        yield
        return
    import pyarrow  # lazy: the gate is loaded by the CLI at start-up; any scan has pyarrow loaded

    pyarrow.array([0])  # pyarrow settles "no pandas" now, through the finder
    sys.modules["pandas"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if sys.modules.get("pandas", 0) is None:
            del sys.modules["pandas"]
