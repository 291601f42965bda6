"""Communicator groups as ASTRA-sim reads them: integer ``pg_name``s and the comm-group JSON.

ASTRA-sim's workload layer parses a ``COMM_COLL_NODE``'s ``pg_name`` with ``stoi``:
``""`` and ``"0"`` are every NPU, any other name must be a positive integer that its
communicator-group file (``--comm-group-configuration``, ``{"<id>": [ranks...]}``)
defines. Traces from etstore's workload generator or from PyTorch name groups
``"tp0"``, ``"dp1"``...; :func:`astra_comm_groups` renames them to integers and
returns the matching file's content, and :func:`write_astra_et` writes both, so the
files run in ASTRA-sim unmodified.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.errors import OptionError
from etstore.ingest.et import write_et
from etstore.ingest.files import comm_groups_path
from etstore.model import Trace

__all__ = ["DEFAULT_GROUP_NAMES", "astra_comm_groups", "comm_groups_path", "write_astra_et"]

DEFAULT_GROUP_NAMES = frozenset({"", "0"})
"""``pg_name``s ASTRA-sim reads as "every NPU" (no communicator-group lookup)."""


def _natural(name: str) -> list[str | int]:
    """Sort key reading digit runs as numbers: ``dp2`` before ``dp10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _members(trace: Trace, name: str, rank: np.ndarray, pg: np.ndarray, is_coll: np.ndarray) -> list[int]:
    """Ranks of group ``name``: the trace's ``params["comm_groups"]`` entry, else its collectives' ranks."""
    declared = (trace.params or {}).get("comm_groups")
    if isinstance(declared, Mapping) and isinstance(declared.get(name), Sequence):
        return sorted(int(r) for r in declared[name])
    return sorted(int(r) for r in np.unique(rank[is_coll & (pg == name)]))


def astra_comm_groups(trace: Trace) -> tuple[Trace, dict[str, list[int]]]:
    """``trace`` with integer ``pg_name``s, and ASTRA-sim's comm-group mapping for them.

    Names ASTRA-sim already reads (``""``, ``"0"``, null, decimal integers) are kept;
    every other name gets the next free integer, names in natural order (``dp2``
    before ``dp10``), starting after the largest integer name in use (at least 1).

    Parameters
    ----------
    trace
        Any trace; only its ``COMM_COLL_NODE``s' ``pg_name`` changes (in ``ops``,
        and the keys of ``params["comm_groups"]`` when present).

    Returns
    -------
    (Trace, dict)
        The renamed trace and ``{"<id>": [ranks...]}`` for every non-default group a
        collective names (members from ``params["comm_groups"]``, else the ranks whose
        collectives carry the name), ids in ascending order.

    Raises
    ------
    OptionError
        A group name that is a negative integer (ASTRA-sim has no such group).

    Notes
    -----
    O(n) over the ops plus O(g log g) for g group names.
    """
    ops = trace.ops
    if "pg_name" not in ops.column_names:
        return trace, {}
    is_coll = pc.equal(ops["type"], "COMM_COLL_NODE").to_numpy(zero_copy_only=False)
    pg = np.asarray(pc.fill_null(ops["pg_name"], "").to_pylist(), dtype=object)
    rank = ops["rank"].to_numpy().astype(np.int64)
    names = sorted({str(x) for x in pg[is_coll]} - DEFAULT_GROUP_NAMES, key=_natural)
    numeric = [x for x in names if x.lstrip("-").isdigit()]
    bad = [x for x in numeric if int(x) < 0]
    if bad:
        raise OptionError(
            f"trace {trace.name!r}: communicator group {bad[0]} is negative; ASTRA-sim ids are >= 1"
        )
    nxt = max([int(x) for x in numeric], default=0) + 1
    rename: dict[str, str] = {}
    for x in names:
        if x in numeric:
            rename[x] = x
        else:
            rename[x] = str(nxt)
            nxt += 1
    groups = {rename[x]: _members(trace, x, rank, pg, is_coll) for x in names}
    groups = dict(sorted(groups.items(), key=lambda kv: int(kv[0])))
    if all(k == v for k, v in rename.items()):
        return trace, groups
    new_pg = [rename.get(str(p), p) if c else p for p, c in zip(pg.tolist(), is_coll.tolist(), strict=True)]
    valid = pc.is_valid(ops["pg_name"]).to_numpy(zero_copy_only=False)
    column = pa.array([v if ok else None for v, ok in zip(new_pg, valid.tolist(), strict=True)], pa.string())
    idx = ops.schema.get_field_index("pg_name")
    params = dict(trace.params or {})
    declared = params.get("comm_groups")
    if isinstance(declared, Mapping):
        params["comm_groups"] = {rename.get(str(k), str(k)): list(v) for k, v in declared.items()}
    return trace.replace(ops=ops.set_column(idx, ops.schema.field(idx), column), params=params), groups


def write_astra_et(trace: Trace, prefix: str | Path, *, gzip_output: bool = False) -> list[Path]:
    """Write ``<prefix>.<rank>.et`` with integer ``pg_name``s and, when the trace has
    collectives, ``<prefix>.comm_groups.json`` for ASTRA-sim's ``--comm-group-configuration``.

    Parameters
    ----------
    trace
        A workload (or any non-algorithm trace).
    prefix
        Output prefix; directories are created by the ``.et`` writer.
    gzip_output
        Gzip each ``.et`` file (ASTRA-sim reads plain files).

    Returns
    -------
    list of Path
        The ``.et`` files in rank order, then the comm-group file when written.

    Raises
    ------
    OptionError
        As :func:`astra_comm_groups`; the ``.et`` writer's errors pass through.

    Notes
    -----
    O(n) over the ops, plus the writer's cost.
    """
    renamed, groups = astra_comm_groups(trace)
    paths = list(write_et(renamed, prefix, gzip_output=gzip_output))
    has_coll = bool(pc.any(pc.equal(trace.ops["type"], "COMM_COLL_NODE")).as_py())
    if has_coll:
        path = comm_groups_path(prefix)
        path.write_text(json.dumps(groups, indent=1) + "\n")
        paths.append(path)
    return paths
