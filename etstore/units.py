"""Sizes as people write them (``"1MiB"``, ``"64KB"``) turned into plain byte counts."""

from __future__ import annotations

import re
from fractions import Fraction

from etstore.errors import UnsatisfiableError

__all__ = ["parse_size"]

_UNITS = {"": 1, "b": 1}
for _i, _p in enumerate("kmgt", start=1):
    for _suffix in (_p, _p + "b", _p + "i", _p + "ib"):
        _UNITS[_suffix] = 1 << (10 * _i)


def parse_size(text: str | int) -> int:
    """Bytes in a size such as ``"1MiB"``, ``"4 KB"``, ``"1.5G"`` or ``"4096"``.

    K, M, G and T are binary multiples with or without ``B``/``iB`` (``1MB`` = ``1MiB`` =
    1,048,576 bytes), as in ASTRA-sim's workloads.

    Raises
    ------
    UnsatisfiableError
        The text is not a non-negative size in whole bytes.

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
        if m is None or unit not in _UNITS:
            raise UnsatisfiableError(
                f"not a size: {text!r} (expected e.g. 1MiB, 64KB, 1G or a number of bytes)"
            )
        exact = Fraction(m.group(1)) * _UNITS[unit]
        if exact.denominator != 1:
            raise UnsatisfiableError(f"size {text!r} is not a whole number of bytes")
        value = int(exact)
    if value < 0:
        raise UnsatisfiableError(f"size must not be negative, got {value}")
    return value
