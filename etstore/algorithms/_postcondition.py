"""What a collective promises, in buffer slots: its pre- and postcondition for the checker.

Every chunk of every rank's input is a distinct symbol (bit ``q·C + j`` of a Python
int for chunk j of rank q); :func:`spec` lists the symbols each input slot starts
with and each output slot must end with, :func:`alias` maps logical slots to the
physical ones of an in-place layout, and :func:`describe` prints a symbol set.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from etstore.ir import BUF_CODE

__all__ = ["Spec", "alias", "describe", "spec"]

_I, _O = BUF_CODE["i"], BUF_CODE["o"]


def _ranges(values: Iterable[int]) -> str:
    vals = sorted(set(values))
    out: list[str] = []
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        out.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    return ",".join(out)


def _bits(v: int, limit: int = 1 << 30) -> list[int]:
    out: list[int] = []
    while v and len(out) < limit:
        low = v & -v
        out.append(low.bit_length() - 1)
        v ^= low
    return out


def describe(v: int | None, C: int) -> str:
    if v is None:
        return "no data"
    if v == 0:
        return "nothing"
    pairs = [(b // C, b % C) for b in _bits(v)]
    by_chunk: dict[int, list[int]] = {}
    for q, j in pairs:
        by_chunk.setdefault(j, []).append(q)
    parts = [
        f"chunk {j} of rank{'s' if len(qs) > 1 else ''} {_ranges(qs)}"
        for j, qs in sorted(by_chunk.items())[:4]
    ]
    if len(by_chunk) > 4:
        parts.append(f"{len(by_chunk) - 4} more chunk(s)")
    return "; ".join(parts)


@dataclass(frozen=True)
class Spec:
    """Pre- and postcondition of a collective in logical buffer terms."""

    inputs: list[tuple[int, int, int, int]]  # rank, buffer, index, symbol set
    outputs: list[tuple[int, int, int, int, str]]  # rank, buffer, index, expected, what it is


def spec(coll: str, N: int, C: int, root: int) -> Spec:
    def bit(q: int, j: int) -> int:
        return 1 << (q * C + j)

    inputs: list[tuple[int, int, int, int]] = []
    outputs: list[tuple[int, int, int, int, str]] = []
    if coll in ("allreduce", "reduce"):
        total = [0] * C
        for q in range(N):
            for j in range(C):
                inputs.append((q, _I, j, bit(q, j)))
                total[j] |= bit(q, j)
        targets = range(N) if coll == "allreduce" else [root]
        for r in targets:
            for j in range(C):
                outputs.append((r, _O, j, total[j], f"the reduction of chunk {j} over all {N} ranks"))
    elif coll == "broadcast":
        for j in range(C):
            inputs.append((root, _I, j, bit(root, j)))
        for r in range(N):
            for j in range(C):
                outputs.append((r, _O, j, bit(root, j), f"chunk {j} of root rank {root}"))
    else:
        cf = C // N
        if coll == "allgather":
            for q in range(N):
                for j in range(cf):
                    inputs.append((q, _I, j, bit(q, q * cf + j)))
            for r in range(N):
                for q in range(N):
                    for j in range(cf):
                        outputs.append((r, _O, q * cf + j, bit(q, q * cf + j), f"chunk {j} of rank {q}"))
        elif coll == "reducescatter":
            for q in range(N):
                for j in range(C):
                    inputs.append((q, _I, j, bit(q, j)))
            for r in range(N):
                for j in range(cf):
                    c = r * cf + j
                    want = 0
                    for q in range(N):
                        want |= bit(q, c)
                    outputs.append((r, _O, j, want, f"the reduction of chunk {c} over all {N} ranks"))
        elif coll == "alltoall":
            for q in range(N):
                for j in range(C):
                    inputs.append((q, _I, j, bit(q, j)))
            for r in range(N):
                for q in range(N):
                    for j in range(cf):
                        outputs.append(
                            (r, _O, q * cf + j, bit(q, r * cf + j), f"chunk {r * cf + j} of rank {q}")
                        )
    return Spec(inputs, outputs)


def alias(coll: str, mode: str, rank: int, buf: int, idx: int, cf: int) -> tuple[int, int]:
    """Physical (buffer, index) of a logical slot; in-place layouts share input and output."""
    if mode != "in-place":  # out-of-place, or as written (a collective without postcondition)
        return buf, idx
    if coll == "allgather":
        return (_O, rank * cf + idx) if buf == _I else (buf, idx)
    if coll == "reducescatter":
        return (_I, rank * cf + idx) if buf == _O else (buf, idx)
    return (_I, idx) if buf == _O else (buf, idx)
