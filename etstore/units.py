"""Sizes as people write them (``"1MiB"``, ``"64KB"``) turned into plain byte counts, and the
memory budget every upfront size limit is measured against."""

from __future__ import annotations

import os
import re
from fractions import Fraction

from etstore.errors import UnsatisfiableError

__all__ = [
    "BUDGET_ENV_VAR",
    "DEFAULT_BUDGET_CAP",
    "MAX_SIZE",
    "budget_exceeded",
    "format_bytes",
    "memory_budget",
    "parse_size",
]

MAX_SIZE = (1 << 63) - 1
"""Largest size in bytes: sizes are stored in signed 64-bit columns."""

BUDGET_ENV_VAR = "ETSTORE_MEMORY_BUDGET"
"""Environment variable holding the memory budget (a size such as ``64GiB``)."""

DEFAULT_BUDGET_CAP = 8 << 30
"""Default budget: half the machine's memory, at most this many bytes (8 GiB)."""

_UNITS = {"": 1, "b": 1}
for _i, _p in enumerate("kmgtpe", start=1):
    for _suffix in (_p, _p + "b", _p + "i", _p + "ib"):
        _UNITS[_suffix] = 1 << (10 * _i)


def parse_size(text: str | int) -> int:
    """Bytes in a size such as ``"1MiB"``, ``"4 KB"``, ``"1.5G"`` or ``"4096"``.

    K, M, G, T, P and E are binary multiples with or without ``B``/``iB`` (``1MB`` =
    ``1MiB`` = 1,048,576 bytes), as in ASTRA-sim's workloads.

    Raises
    ------
    UnsatisfiableError
        The text is not a non-negative size in whole bytes, or the size is above
        :data:`MAX_SIZE` (2^63 - 1 bytes).

    Examples
    --------
    >>> parse_size("1MiB"), parse_size("1MB"), parse_size("2 kB"), parse_size(512)
    (1048576, 1048576, 2048, 512)
    """
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*", text)
        unit = m.group(2).lower() if m else ""
        if m is None or unit not in _UNITS or len(m.group(1)) > 40:
            raise UnsatisfiableError(
                f"not a size: {text[:60]!r} (expected e.g. 1MiB, 64KB, 1G or a number of bytes)"
            )
        exact = Fraction(m.group(1)) * _UNITS[unit]
        if exact.denominator != 1:
            raise UnsatisfiableError(f"size {text!r} is not a whole number of bytes")
        value = int(exact)
    if value < 0:
        raise UnsatisfiableError(f"size must not be negative, got {value}")
    if value > MAX_SIZE:
        shown = text if isinstance(text, str) else str(text)
        raise UnsatisfiableError(
            f"size {shown[:60]!r} is larger than the largest supported size, 2^63 - 1 bytes (8 EiB)"
        )
    return value


def format_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit that keeps it at least 1 (``"512 GiB"``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} EiB"  # pragma: no cover - the loop returns at PiB


def memory_budget() -> int:
    """Bytes a single request may plan to hold in memory before it is refused upfront.

    ``$ETSTORE_MEMORY_BUDGET`` (a size such as ``64GiB``) when set; otherwise half of
    the machine's physical memory, at most :data:`DEFAULT_BUDGET_CAP` (8 GiB).

    Raises
    ------
    UnsatisfiableError
        The environment variable is set but is not a size.
    """
    text = os.environ.get(BUDGET_ENV_VAR, "").strip()
    if text:
        try:
            return parse_size(text)
        except UnsatisfiableError as exc:
            raise UnsatisfiableError(f"{BUDGET_ENV_VAR}: {exc}") from exc
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no way to ask
        physical = 2 * DEFAULT_BUDGET_CAP
    return int(min(DEFAULT_BUDGET_CAP, max(physical // 2, 1 << 30)))


def budget_exceeded(need: float, what: str) -> str | None:
    """The refusal for ``what`` needing ``need`` bytes, or None when it fits the budget.

    The message names the estimate, the budget and how to raise it, in one line; the
    caller raises it as its own error class.

    Examples
    --------
    >>> budget_exceeded(1024, "a table") is None
    True
    """
    budget = memory_budget()
    if need <= budget:
        return None
    return (
        f"{what} needs about {format_bytes(need)}, more than the memory budget of "
        f"{format_bytes(budget)} (set the environment variable {BUDGET_ENV_VAR}, e.g. "
        f"{BUDGET_ENV_VAR}=64GiB, to raise it)"
    )
