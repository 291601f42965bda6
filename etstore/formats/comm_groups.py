"""Communicator groups as ASTRA-sim reads them: ``pg_name``s it can read and the comm-group JSON.

ASTRA-sim's workload layer (``Workload::extract_comm_group``) reads an absent ``pg_name``,
``""`` and ``"0"`` as every NPU and any other name with ``stoi`` (``"0.0"`` is 0,
``"1.5"`` is 1, ``"dp0"`` throws); the number must be a group of its communicator-group
file (``--comm-group-configuration``, ``{"<id>": [ranks...]}``, keys read with ``stoi``
too), whose ids must be positive (``CommunicatorGroup::set_id`` asserts it). A group's
ring follows the order the file lists its members in. :func:`astra_group_plan` keeps
every name ASTRA-sim reads as its group and renames the others (``"tp0"``, ``"dp1"`` of
the workload generator) to free integers, saying why; :func:`write_astra_et` writes the
trace (as :func:`~etstore.formats.astra_et.for_astra_sim` makes it) and the group file, so
the files run in ASTRA-sim unmodified.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.formats.astra_et import ExportedFiles, for_astra_sim
from etstore.formats.et import write_et
from etstore.formats.files import comm_groups_path, stoi
from etstore.model import Trace

__all__ = [
    "DEFAULT_GROUP_NAMES",
    "GroupPlan",
    "astra_comm_groups",
    "astra_group_plan",
    "comm_groups_path",
    "find_group",
    "write_astra_et",
]

DEFAULT_GROUP_NAMES = frozenset({"", "0"})
"""``pg_name``s ASTRA-sim reads as "every NPU" (no communicator-group lookup). etstore
reads ``"0"`` so only where no group ``0`` is defined (a comm-group file's or the trace's)."""


def find_group(name: str, groups: Mapping[str, object]) -> str | None:
    """The key of ``groups`` that ``pg_name`` ``name`` names: itself, else the group number
    ASTRA-sim reads it as (``stoi``: ``"0.0"`` and ``"00"`` name group ``"0"``); None if neither.

    Examples
    --------
    >>> find_group("0.0", {"0": [0, 1]}), find_group("tp0", {"tp0": [0]}), find_group("x", {})
    ('0', 'tp0', None)
    """
    if name in groups:
        return name
    number = stoi(name)
    return str(number) if number is not None and str(number) in groups else None


def _natural(name: str) -> list[str | int]:
    """Sort key reading digit runs as numbers: ``dp2`` before ``dp10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _members(trace: Trace, name: str, rank: np.ndarray, pg: np.ndarray, is_coll: np.ndarray) -> list[int]:
    """Ranks of group ``name`` in their order: the trace's ``params["comm_groups"]`` entry (found as
    written or as ASTRA-sim reads it), else its collectives' ranks ascending."""
    declared = (trace.params or {}).get("comm_groups")
    if isinstance(declared, Mapping):
        key = find_group(name, {str(k): v for k, v in declared.items()})
        if key is not None:
            found = {str(k): v for k, v in declared.items()}[key]
            if isinstance(found, Sequence):
                return [int(r) for r in found]
    return sorted(int(r) for r in np.unique(rank[is_coll & (pg == name)]))


def _preference(name: str) -> tuple[bool, bool, list[str | int], str]:
    """Order in which names claim their group number: numbers first, a number's own decimal
    spelling before others (``"1"`` keeps 1, ``"01"`` is renamed), then natural order."""
    number = stoi(name)
    return number is None, str(number) != name, _natural(name), name


@dataclass(frozen=True)
class GroupPlan:
    """How an export names a trace's communicator groups for ASTRA-sim."""

    rename: dict[str, str]
    """``pg_name`` → the name written, for the names that change (most keep theirs)."""
    groups: dict[str, list[int]]
    """The comm-group file's content: written name → members in order."""
    notes: tuple[str, ...]
    """One line per reason a name changed, for the export's output."""


def astra_group_plan(trace: Trace) -> GroupPlan:
    """Which ``pg_name``s ASTRA-sim reads as their group, which it cannot, and what those become.

    A name is kept when ASTRA-sim reads it as the same group: ``""`` (every NPU), ``"0"``
    when the group is every rank of the trace, and any name ``stoi`` reads as a positive
    number no other name shares (``"3"``, ``"1.5"``). Renamed, each with a note: a name
    ``stoi`` rejects (``"dp0"``: ``Workload::extract_comm_group`` would throw), one it reads
    as 0 or less (``"0.0"``, ``"-2"``: ``CommunicatorGroup::set_id`` asserts ``id > 0``),
    ``"0"`` for a group of fewer ranks (ASTRA-sim reads ``"0"`` as every NPU) and a second
    name for a number already taken (``"01"`` beside ``"1"``). New names are the next free
    integers after the largest kept one, in natural order of the old names.

    Notes
    -----
    O(n) over the ops plus O(g log g) for g group names.
    """
    ops = trace.ops
    if "pg_name" not in ops.column_names:
        return GroupPlan({}, {}, ())
    is_coll = pc.equal(ops["type"], "COMM_COLL_NODE").to_numpy(zero_copy_only=False)
    pg = np.asarray(pc.fill_null(ops["pg_name"], "").to_pylist(), dtype=object)
    rank = ops["rank"].to_numpy().astype(np.int64)
    everyone = sorted(int(r) for r in np.unique(rank))
    names = sorted({str(x) for x in pg[is_coll]} - {""}, key=_preference)
    members = {x: _members(trace, x, rank, pg, is_coll) for x in names}
    kept: dict[int, str] = {}
    why: dict[str, str] = {}
    for x in names:
        number = stoi(x)
        if x == "0":
            if sorted(members[x]) != everyone:
                why[x] = f"ASTRA-sim reads '0' as every NPU, but group 0 is ranks {members[x]}"
        elif number is None:
            why[x] = "ASTRA-sim reads pg_name with stoi, which needs a number"
        elif number <= 0:
            why[x] = f"ASTRA-sim reads it as group {number} and asserts group ids > 0"
        elif number in kept:
            why[x] = f"ASTRA-sim reads it as group {number}, the number of {kept[number]!r}"
        else:
            kept[number] = x
    nxt = max(kept, default=0) + 1
    rename: dict[str, str] = {}
    for x in sorted(why, key=_natural):
        rename[x] = str(nxt)
        nxt += 1
    groups = {rename.get(x, x): members[x] for x in names if not (x == "0" and x not in rename)}
    groups = dict(sorted(groups.items(), key=lambda kv: stoi(kv[0]) or 0))
    notes = tuple(f"pg_name {x!r} -> {rename[x]!r}: {why[x]}" for x in rename)
    return GroupPlan(rename, groups, notes)


def astra_comm_groups(trace: Trace) -> tuple[Trace, dict[str, list[int]]]:
    """``trace`` with ``pg_name``s ASTRA-sim reads, and ASTRA-sim's comm-group mapping for them.

    Names ASTRA-sim reads as their group are kept as written; the others get new integer
    names (:func:`astra_group_plan` says which and why).

    Parameters
    ----------
    trace
        Any trace; only its ``COMM_COLL_NODE``s' ``pg_name`` changes (in ``ops``,
        and the keys of ``params["comm_groups"]`` when present).

    Returns
    -------
    (Trace, dict)
        The renamed trace and ``{"<name>": [ranks...]}`` for every group a collective names
        other than the default (``""``, and ``"0"`` of every rank): members from
        ``params["comm_groups"]`` in their order, else the ranks whose collectives carry the
        name; keys in ascending group number.

    Notes
    -----
    O(n) over the ops plus O(g log g) for g group names.
    """
    plan = astra_group_plan(trace)
    return _renamed(trace, plan.rename), plan.groups


def _renamed(trace: Trace, rename: Mapping[str, str]) -> Trace:
    """``trace`` with the collectives' ``pg_name``s (and ``params["comm_groups"]`` keys) renamed."""
    if not rename:
        return trace
    ops = trace.ops
    is_coll = pc.equal(ops["type"], "COMM_COLL_NODE").to_numpy(zero_copy_only=False)
    pg = pc.fill_null(ops["pg_name"], "").to_pylist()
    new_pg = [rename.get(str(p), p) if c else p for p, c in zip(pg, is_coll.tolist(), strict=True)]
    valid = pc.is_valid(ops["pg_name"]).to_numpy(zero_copy_only=False)
    column = pa.array([v if ok else None for v, ok in zip(new_pg, valid.tolist(), strict=True)], pa.string())
    idx = ops.schema.get_field_index("pg_name")
    params = dict(trace.params or {})
    declared = params.get("comm_groups")
    if isinstance(declared, Mapping):
        params["comm_groups"] = {rename.get(str(k), str(k)): list(v) for k, v in declared.items()}
    return trace.replace(ops=ops.set_column(idx, ops.schema.field(idx), column), params=params)


def write_astra_et(trace: Trace, prefix: str | Path, *, gzip_output: bool = False) -> ExportedFiles:
    """Write ``<prefix>.<rank>.et`` as ASTRA-sim runs them and, when the trace has collectives,
    ``<prefix>.comm_groups.json`` for ASTRA-sim's ``--comm-group-configuration``.

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
    ExportedFiles
        The ``.et`` files in rank order, then the comm-group file when written; its
        ``changes`` says what was changed so that ASTRA-sim runs them
        (:func:`~etstore.formats.astra_et.for_astra_sim`, :func:`astra_group_plan`), one
        line each. A trace ASTRA-sim runs as it is is written unchanged.

    Notes
    -----
    O(n) over the ops, plus the writer's cost.
    """
    fixed, changes = for_astra_sim(trace)
    plan = astra_group_plan(fixed)
    paths = list(write_et(_renamed(fixed, plan.rename), prefix, gzip_output=gzip_output))
    has_coll = bool(pc.any(pc.equal(trace.ops["type"], "COMM_COLL_NODE")).as_py())
    if has_coll:
        path = comm_groups_path(prefix)
        path.write_text(json.dumps(plan.groups, indent=1) + "\n")
        paths.append(path)
    return ExportedFiles(paths, (*changes, *plan.notes))
