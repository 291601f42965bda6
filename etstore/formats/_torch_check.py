"""What an ingest says about a recording whose ranks disagree: collectives that do not pair.

The k-th collective of a process group on every member rank is one instance (the simulator
pairs them so, as every runtime does). A recording in which the ranks' k-th collectives
differ in type or size, or in number, cannot replay as it ran; the ingest says so, one line
per rank and group, naming the first call that differs, instead of leaving it for a
simulation to refuse later.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["collective_mismatches", "partial_ranks"]


def collective_mismatches(ops: pa.Table) -> list[str]:
    """One line per (group, rank) whose collectives differ from the group's lowest rank's.

    >>> ops = pa.table({"rank": [0, 0, 1, 1], "id": [5, 9, 5, 9], "name": ["a", "b", "a", "b"],
    ...     "type": ["COMM_COLL_NODE"] * 4, "comm_type": ["ALL_REDUCE"] * 4,
    ...     "comm_size": [8, 8, 8, 16], "pg_name": ["0"] * 4})
    >>> for line in collective_mismatches(ops):
    ...     print(line.replace(", ", ",\\n"))
    group 0: rank 1's collective #1 (node 9 'b') is ALL_REDUCE of 16 B,
    rank 0's (node 9) ALL_REDUCE of 8 B
    """
    colls = ops.filter(pc.equal(ops["type"], "COMM_COLL_NODE"))  # only these become Python rows
    rows = colls.select(["rank", "id", "name", "comm_type", "comm_size", "pg_name"]).to_pylist()
    by: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for r in sorted(rows, key=lambda r: (r["rank"], r["id"])):
        by.setdefault(r["pg_name"] or "all", {}).setdefault(r["rank"], []).append(r)
    out: list[str] = []
    for pg, ranks in by.items():
        ref_rank = min(ranks)
        ref = ranks[ref_rank]
        for rank in sorted(ranks)[1:]:
            mine = ranks[rank]
            diff = next(
                (
                    k
                    for k, (a, b) in enumerate(zip(ref, mine, strict=False))
                    if (a["comm_type"], a["comm_size"]) != (b["comm_type"], b["comm_size"])
                ),
                None,
            )
            if diff is not None:
                a, b = ref[diff], mine[diff]
                out.append(
                    f"group {pg}: rank {rank}'s collective #{diff} (node {b['id']} {b['name']!r}) is "
                    f"{b['comm_type']} of {b['comm_size']} B, rank {ref_rank}'s (node {a['id']}) "
                    f"{a['comm_type']} of {a['comm_size']} B"
                )
            elif len(mine) != len(ref):
                out.append(
                    f"group {pg}: rank {rank} has {len(mine)} collectives, rank {ref_rank} has {len(ref)}"
                )
    return out


def _spans(ranks: list[int]) -> str:
    """``0-3, 6`` for [0, 1, 2, 3, 6]."""
    out: list[str] = []
    for r in ranks:
        if out and r == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        else:
            out.append(str(r))
    return ", ".join(out)


def partial_ranks(ranks: Sequence[int], world: int | None) -> str | None:
    """The line saying which ranks a recording of some of a job's ranks holds, or None.

    >>> print(partial_ranks([0, 1], 8).split(":")[0])
    ranks 0-1 of 8 recorded (none for ranks 2-7)
    >>> partial_ranks([0, 1, 2], 3) is None
    True
    """
    have = sorted(set(ranks))
    size = max([world or 0, have[-1] + 1 if have else 0])
    lacking = [r for r in range(size) if r not in have]
    if not lacking:
        return None
    return (
        f"ranks {_spans(have)} of {size} recorded (none for ranks {_spans(lacking)}): analyses use them "
        "as they are; a simulation needs every rank of each collective's group"
    )
