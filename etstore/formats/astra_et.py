"""A workload as ASTRA-sim's workload layer and Chakra feeder accept it, and what that changes.

``etstore export`` (``.et``) writes what ASTRA-sim runs; a trace that is already so is
written unchanged. The rules come from the sources of ASTRA-sim 518bd51 and the Chakra
feeder it builds (``extern/graph_frontend/chakra/src/feeder_v3``), and each was confirmed by
running the analytical backend built from them (``bench/README.md``):

- ``METADATA_NODE`` (PyTorch's process and thread nodes): ``Workload::issue`` records every
  node it issues, and ``Statistics::OperatorStatistics::get_operator_type``
  (``astra-sim/workload/Statistics.cc``) has no case for it: ``assert(false)`` aborts the
  run. Dropped; a dependency through one becomes a dependency on what it waited for.
- a dependency on a node absent from the rank's file: ``ETFeeder::graph_sanity_check``
  (``feeder_v3/et_feeder.cpp``) throws ``Node N in data_dep graph, but not found in
  index``. Dropped (etstore's replay ignores them too).
- a communication node marked ``is_cpu_op`` (a gloo collective, recorded on a CPU
  thread): ``Workload::issue_comm`` throws ``Comm node should not be on CPU``. Written with
  ``is_cpu_op`` false; ASTRA-sim, as etstore, runs every communication node on the NPU's
  communication slot.
- a send or receive without ``comm_tag``: the feeder's ``comm_tag()`` getter
  (``REGISTER_ATTR``, ``et_feeder_node_attr.h``) throws. Written with tag 0, the tag
  etstore matches it with.
- a collective ``Workload::issue_coll_comm`` does not run (reduce, gather, scatter,
  barrier, reduce-scatter-block): it throws ``Unsupported collective comm type``. Written
  as a ``BROADCAST``, which ASTRA-sim replays for the node's duration, as etstore replays
  those collectives.

CPU compute nodes keep ``is_cpu_op``: ASTRA-sim runs them on its CPU slot beside the GPU's
(``HardwareResource``), as etstore does, and the run completes; ASTRA-sim 518bd51's
statistics step then logs ``Only GPU and COMM types are supported for overlap extraction``
once per rank (``Statistics::extract_comp_comm_overlap``), after the rank's finish line.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.model import DEPS_SCHEMA, Trace

__all__ = ["ASTRA_COLLECTIVES", "ExportedFiles", "for_astra_sim"]

ASTRA_COLLECTIVES = frozenset({"ALL_REDUCE", "ALL_TO_ALL", "ALL_GATHER", "REDUCE_SCATTER", "BROADCAST"})
"""Collective types ASTRA-sim's ``Workload::issue_coll_comm`` runs (broadcast: for its duration)."""

_COMM = ("COMM_COLL_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE")


class ExportedFiles(list[Path]):
    """The files an export wrote, in order, and ``changes``: one line per thing it changed so
    that the consumer runs them (empty when the trace was written as it is)."""

    def __init__(self, paths: Iterable[Path], changes: Iterable[str] = ()) -> None:
        super().__init__(paths)
        self.changes: tuple[str, ...] = tuple(changes)


def for_astra_sim(trace: Trace) -> tuple[Trace, tuple[str, ...]]:
    """``trace`` as ASTRA-sim's workload layer accepts it, and one line per kind of change.

    Parameters
    ----------
    trace
        A workload (or any trace that is not an algorithm).

    Returns
    -------
    (Trace, tuple of str)
        The trace to write, and what was changed (the module docstring says why each);
        ``trace`` itself and no lines when nothing needs to change.

    Notes
    -----
    O(V + E) vectorised, plus O(E_m) Python work over the E_m dependencies that touch a
    dropped ``METADATA_NODE`` (a few per rank in recorded traces).

    Examples
    --------
    >>> from etstore.model import deps_table, ops_table
    >>> ops = ops_table({"rank": [0, 0, 0], "id": [1, 2, 3],
    ...                  "type": ["COMP_NODE", "METADATA_NODE", "COMP_NODE"]})
    >>> fixed, notes = for_astra_sim(Trace(ops, deps_table([0, 0], [1, 2], [2, 3])))
    >>> fixed.ops["id"].to_pylist(), fixed.deps["src"].to_pylist(), fixed.deps["dst"].to_pylist()
    ([1, 3], [1], [3])
    """
    notes: list[str] = []
    ops, deps, missing = trace.ops, trace.deps, trace.missing
    if missing.num_rows:
        notes.append(
            f"dropped {missing.num_rows:,} dependencies on nodes absent from their rank's file "
            "(ASTRA-sim's feeder refuses the file)"
        )
        missing = DEPS_SCHEMA.empty_table()
    meta = pc.fill_null(pc.equal(ops["type"], "METADATA_NODE"), False)
    dropped = int(pc.sum(meta).as_py() or 0)
    if dropped:
        deps, bridged = _drop_nodes(ops, deps, meta.to_numpy(zero_copy_only=False))
        ops = ops.filter(pc.invert(meta))
        notes.append(
            f"dropped {dropped:,} METADATA_NODEs (ASTRA-sim aborts on them)"
            + (
                f"; {bridged:,} dependencies through them now wait for what they waited for"
                if bridged
                else ""
            )
        )
    ops = _comm_fixes(ops, notes)
    if not notes:
        return trace, ()
    return trace.replace(ops=ops, deps=deps, missing=missing), tuple(notes)


def _comm_fixes(ops: pa.Table, notes: list[str]) -> pa.Table:
    """Communication nodes off the CPU, tags on sends and receives, collective types ASTRA-sim runs."""
    comm = pc.is_in(ops["type"], pa.array(_COMM)).to_numpy(zero_copy_only=False)
    on_cpu = comm & pc.fill_null(ops["is_cpu_op"], False).to_numpy(zero_copy_only=False)
    if on_cpu.any():
        ops = _set(ops, "is_cpu_op", on_cpu, False)
        notes.append(
            f"{int(on_cpu.sum()):,} communication nodes recorded on a CPU thread written with is_cpu_op "
            "false (ASTRA-sim runs communication on the NPU's communication slot only)"
        )
    p2p = pc.is_in(ops["type"], pa.array(_COMM[1:])).to_numpy(zero_copy_only=False)
    untagged = p2p & ~pc.is_valid(ops["comm_tag"]).to_numpy(zero_copy_only=False)
    if untagged.any():
        ops = _set(ops, "comm_tag", untagged, 0)
        notes.append(f"{int(untagged.sum()):,} sends and receives without comm_tag written with tag 0")
    coll = pc.equal(ops["type"], "COMM_COLL_NODE").to_numpy(zero_copy_only=False)
    ctype = np.asarray(pc.fill_null(ops["comm_type"], "").to_pylist(), dtype=object)
    other = coll & ~np.isin(ctype, list(ASTRA_COLLECTIVES)) & (ctype != "")
    if other.any():
        kinds = ", ".join(sorted({str(c) for c in ctype[other]}))
        ops = _set(ops, "comm_type", other, "BROADCAST")
        notes.append(
            f"{int(other.sum()):,} collectives ASTRA-sim does not run ({kinds}) written as BROADCAST, which "
            "it replays for the node's duration (as etstore replays them)"
        )
    return ops


def _set(ops: pa.Table, column: str, rows: np.ndarray, value: object) -> pa.Table:
    """``ops`` with ``column`` set to ``value`` on ``rows`` (a boolean mask)."""
    i = ops.schema.get_field_index(column)
    field = ops.schema.field(i)
    new = pc.if_else(pa.array(rows), pa.scalar(value, field.type), ops[column])
    return ops.set_column(i, field, new)


def _drop_nodes(ops: pa.Table, deps: pa.Table, drop: np.ndarray) -> tuple[pa.Table, int]:
    """``deps`` without the dropped nodes' edges; an edge out of a dropped node is replaced by edges
    from the kept nodes it waited for (through chains of dropped nodes). Returns (deps, edges added)."""
    key = (ops["rank"].to_numpy().astype(np.uint64) << np.uint64(40)) | ops["id"].to_numpy().astype(np.uint64)
    gone = np.sort(key[drop])
    rank = deps["rank"].to_numpy().astype(np.int64)
    src, dst = deps["src"].to_numpy().astype(np.uint64), deps["dst"].to_numpy().astype(np.uint64)
    ks = (rank.astype(np.uint64) << np.uint64(40)) | src
    kd = (rank.astype(np.uint64) << np.uint64(40)) | dst
    from_gone = np.isin(ks, gone)
    into_gone = np.isin(kd, gone)
    waited: dict[int, list[int]] = {}  # dropped node -> the nodes it waited for (keys)
    for a, b in zip(ks[into_gone].tolist(), kd[into_gone].tolist(), strict=True):
        waited.setdefault(b, []).append(a)
    gone_set = set(gone.tolist())

    def kept_ancestors(k: int, seen: set[int]) -> list[int]:
        out: list[int] = []
        for a in waited.get(k, []):
            if a in seen:
                continue
            seen.add(a)
            out.extend(kept_ancestors(a, seen) if a in gone_set else [a])
        return out

    keep = ~(from_gone | into_gone)
    kind_all = deps["kind"].to_numpy(zero_copy_only=False)
    existing = set(zip(ks[keep].tolist(), kd[keep].tolist(), kind_all[keep].tolist(), strict=True))
    last = deps.group_by(["rank", "dst", "kind"]).aggregate([("pos", "max")])
    next_pos = {
        ((int(r) << 40) | int(d), str(k)): int(p) + 1
        for r, d, k, p in zip(*(last[c].to_pylist() for c in ("rank", "dst", "kind", "pos_max")), strict=True)
    }
    added: dict[str, list[int]] = {"rank": [], "src": [], "dst": [], "pos": []}
    kinds: list[str] = []
    mask40 = (1 << 40) - 1
    for i in np.flatnonzero(from_gone & ~into_gone).tolist():
        d, kind = int(kd[i]), str(kind_all[i])
        for a in kept_ancestors(int(ks[i]), set()):
            if (a, d, kind) in existing:
                continue
            existing.add((a, d, kind))
            added["rank"].append(d >> 40)
            added["src"].append(a & mask40)
            added["dst"].append(d & mask40)
            added["pos"].append(next_pos[(d, kind)])
            kinds.append(kind)
            next_pos[(d, kind)] += 1
    out = deps.filter(pa.array(keep))
    if kinds:
        extra = pa.table({**added, "kind": kinds}).select(DEPS_SCHEMA.names).cast(DEPS_SCHEMA)
        out = pa.concat_tables([out, extra])
    return out, len(kinds)
