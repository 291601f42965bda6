"""Two traces side by side: what ran, how often, how long and how many bytes, largest changes first.

Ops are grouped by what they are, not by id (two recordings of one program share no ids; a
rewrite renumbers): a group is an op ``kind`` and a ``key`` — ``op`` by name for host ops,
``kernel`` by name for device activities, ``collective`` by type and size, ``rank`` by rank (all
its ops). Each side gives the group's count, summed duration (µs) and bytes (communication); the
rows come with the differences (B − A), the largest time difference first. A group only one side
has is a row with zeros on the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.model import Trace

__all__ = ["KINDS", "diff_traces"]

KINDS = ("op", "kernel", "collective", "rank")


def _groups(trace: Trace, kinds: Iterable[str]) -> dict[tuple[str, str], list[float]]:
    """``(kind, key) → [count, time µs, bytes]`` of ``trace``."""
    ops = trace.ops
    keep = pc.invert(pc.equal(ops["type"], "METADATA_NODE")).to_numpy(zero_copy_only=False)
    names = np.asarray(ops["name"].to_pylist(), dtype=object)[keep]
    types = np.asarray(ops["type"].to_pylist(), dtype=object)[keep]
    cpu = np.asarray([c is not False for c in ops["is_cpu_op"].to_pylist()], dtype=bool)[keep]
    rank = ops["rank"].to_numpy()[keep]
    dur = ops["duration_micros"].to_numpy(zero_copy_only=False).astype(np.float64)[keep]
    size = np.nan_to_num(ops["comm_size"].to_numpy(zero_copy_only=False).astype(np.float64))[keep]
    ctype = np.asarray(ops["comm_type"].to_pylist(), dtype=object)[keep]
    comm = np.asarray([t != "COMP_NODE" for t in types.tolist()], dtype=bool)
    out: dict[tuple[str, str], list[float]] = {}

    def add(kind: str, keys: Iterable[str], sel: np.ndarray) -> None:
        for k, d, b in zip(keys, dur[sel].tolist(), size[sel].tolist(), strict=True):
            g = out.setdefault((kind, k), [0.0, 0.0, 0.0])
            g[0] += 1
            g[1] += d
            g[2] += b

    wanted = set(kinds)
    if "op" in wanted:
        sel = cpu & ~comm
        add("op", names[sel].tolist(), sel)
    if "kernel" in wanted:
        sel = ~cpu & ~comm
        add("kernel", names[sel].tolist(), sel)
    if "collective" in wanted:
        sel = comm
        keys = [
            f"{t or n} {int(s):,} B" if t else f"{n} {int(s):,} B"
            for t, n, s in zip(ctype[sel].tolist(), types[sel].tolist(), size[sel].tolist(), strict=True)
        ]
        add("collective", keys, sel)
    if "rank" in wanted:
        sel = np.ones(len(rank), dtype=bool)
        add("rank", [str(r) for r in rank.tolist()], sel)
    return out


def diff_traces(a: Trace, b: Trace, *, kinds: Iterable[str] = KINDS) -> pa.Table:
    """Groups of ``a`` and ``b`` side by side (see the module's note), largest time change first.

    Columns: ``kind``, ``key``, ``count_a``, ``count_b``, ``time_us_a``, ``time_us_b``,
    ``time_us_diff``, ``bytes_a``, ``bytes_b``, ``bytes_diff``.

    >>> from etstore.model import ops_table
    >>> ops = ops_table({"rank": [0], "id": [1], "name": ["mm"], "type": ["COMP_NODE"],
    ...                  "duration_micros": [100], "is_cpu_op": [True]})
    >>> t = Trace(ops=ops, name="a")
    >>> slower = t.replace(ops=ops.set_column(4, "duration_micros", pa.array([150], pa.uint64())))
    >>> diff_traces(t, slower, kinds=["op"]).to_pylist()[0]["time_us_diff"]
    50.0
    """
    ga, gb = _groups(a, kinds), _groups(b, kinds)
    rows: dict[str, list[Any]] = {
        k: []
        for k in (
            "kind",
            "key",
            "count_a",
            "count_b",
            "time_us_a",
            "time_us_b",
            "time_us_diff",
            "bytes_a",
            "bytes_b",
            "bytes_diff",
        )
    }
    zero = [0.0, 0.0, 0.0]
    for kind, key in sorted(set(ga) | set(gb)):
        x, y = ga.get((kind, key), zero), gb.get((kind, key), zero)
        for col, v in (
            ("kind", kind),
            ("key", key),
            ("count_a", int(x[0])),
            ("count_b", int(y[0])),
            ("time_us_a", x[1]),
            ("time_us_b", y[1]),
            ("time_us_diff", y[1] - x[1]),
            ("bytes_a", int(x[2])),
            ("bytes_b", int(y[2])),
            ("bytes_diff", int(y[2] - x[2])),
        ):
            rows[col].append(v)
    table = pa.table(rows)
    if not table.num_rows:
        return table
    order = np.lexsort((np.asarray(rows["key"], dtype=object), -np.abs(np.asarray(rows["time_us_diff"]))))
    return table.take(pa.array(order))
