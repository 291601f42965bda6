"""Collective instances of a workload: which ``COMM_COLL_NODE`` rows form one, and which are chosen.

The k-th collective node of communicator group g on every member rank, counted in
ascending node id (the order ASTRA-sim's workload layer issues a rank's nodes in,
whatever the file's order), is one *instance*. Instances are numbered by first
appearance in that issue order (rank by rank, each rank's nodes by id); each has a
group, a type and a size that all its nodes must agree on. :func:`find_collectives`
is the one finder: ``expand`` and the simulator both build on it, each raising its
own error from the facts it returns. Selection (a where predicate over the nodes'
columns, and the algorithms given per type) chooses whole instances only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.errors import ExpansionError, OptionError, QueryError
from etstore.formats.comm_groups import DEFAULT_GROUP_NAMES, find_group
from etstore.model import Trace
from etstore.sandbox import read_only_config

__all__ = [
    "CARRIERS",
    "EVERY",
    "GIVEN",
    "Collectives",
    "check_chosen",
    "find_collectives",
    "given_groups",
    "select",
]

GIVEN, EVERY, CARRIERS = 0, 1, 2
"""How a group's members were found (:attr:`Collectives.rule`): in the groups given, every
rank (an absent name, or ``"0"`` that no group defines), or the ranks whose collectives
carry the name (a name no group defines)."""


@dataclass(frozen=True, eq=False)
class Collectives:
    """The workload's collective nodes (one row each, in row order) grouped into instances."""

    workload: str  # the workload's name, for messages
    rows: np.ndarray  # row of each node in the workload's ops
    rank: np.ndarray
    ids: np.ndarray  # the nodes' ids
    ctype: np.ndarray  # object: Chakra comm_type ("" when absent)
    size: np.ndarray  # comm_size in bytes (0 when absent)
    size_ok: np.ndarray  # comm_size present
    pg_names: list[str]
    pg_code: np.ndarray  # index into pg_names
    inst: np.ndarray  # instance of each node
    first_of: np.ndarray  # per instance: its first node in issue order (index into rows)
    inst_seq: np.ndarray  # per instance: k, for the k-th collective of its group
    members: list[tuple[int, ...]]  # per group: member ranks, in the order the group lists them
    rule: list[int]  # per group: how its members were found (GIVEN, EVERY, CARRIERS)
    gsize: np.ndarray  # per group: member count
    apos: np.ndarray  # per node: its rank's position in the group (-1: not a member)
    ranks: np.ndarray  # every rank of the workload, ascending

    @property
    def ninst(self) -> int:
        return len(self.first_of)

    @property
    def inst_pg(self) -> np.ndarray:
        return self.pg_code[self.first_of]

    @property
    def inst_type(self) -> np.ndarray:
        return self.ctype[self.first_of]

    def describe(self, i: int) -> str:
        """``collective #k (TYPE) of group 'g'`` for instance ``i``."""
        pg, seq, ctype = self.pg_names[self.inst_pg[i]], int(self.inst_seq[i]), str(self.inst_type[i])
        if pg:
            return f"collective #{seq} ({ctype or 'no comm_type'}) of group {pg!r}"
        return f"collective #{seq} ({ctype or 'no comm_type'}) of the all-ranks group"

    def issue_order(self) -> np.ndarray:
        """The nodes (indices into ``rows``) in issue order: by rank, then node id."""
        order: np.ndarray = np.lexsort((self.ids, self.rank))
        return order

    def by_instance(self) -> tuple[np.ndarray, np.ndarray]:
        """(nodes, starts): instance i's nodes are ``nodes[starts[i]:starts[i + 1]]``, ascending rank."""
        nodes = np.lexsort((self.rank, self.inst))
        starts = np.zeros(self.ninst + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.inst, minlength=self.ninst), out=starts[1:])
        return nodes, starts


def given_groups(
    trace: Trace, groups: Mapping[str, Sequence[int]] | None
) -> Mapping[str, Sequence[int]] | None:
    """The groups ``pg_name``s are looked up in: ``groups`` when given, else the trace's own
    ``params["comm_groups"]`` (what the workload generator and a comm-group sidecar record)."""
    if groups is not None:
        return groups
    found = (trace.params or {}).get("comm_groups")
    if not isinstance(found, Mapping):
        return None
    return {str(k): v for k, v in found.items() if isinstance(v, Sequence)}


def find_collectives(workload: Trace, groups: Mapping[str, Sequence[int]] | None) -> Collectives:
    """Every ``COMM_COLL_NODE`` of ``workload`` with its instance and group position.

    ``groups`` are looked up as they are (:func:`given_groups` picks them); nothing is
    checked beyond there being a collective: the callers judge the facts (type, size,
    membership, completeness) and raise their own errors.

    Raises
    ------
    ExpansionError
        The workload has no collective node.

    Notes
    -----
    O(V + C log C) for V ops and C collective nodes.
    """
    ops = workload.ops
    is_coll = pc.fill_null(pc.equal(ops["type"], "COMM_COLL_NODE"), False).to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(is_coll)
    if len(rows) == 0:
        raise ExpansionError(f"trace {workload.name!r} has no COMM_COLL_NODE to expand")
    rank_all = ops["rank"].to_numpy().astype(np.int64)
    crank = rank_all[rows]
    ids = ops["id"].to_numpy()[rows]
    take = pa.array(rows)
    ctype = np.asarray(pc.fill_null(ops["comm_type"].take(take), "").to_pylist(), dtype=object)
    sizes = ops["comm_size"].take(take)
    pg_enc = pc.dictionary_encode(pc.fill_null(ops["pg_name"].take(take), "")).combine_chunks()
    pg_names = [str(x) for x in pg_enc.dictionary.to_pylist()]
    pg_code = pg_enc.indices.to_numpy().astype(np.int64)
    span_r = int(rank_all.max()) + 1
    inst, first_of, seq = _number_instances(pg_code, crank, ids, span_r)
    all_ranks = np.unique(rank_all)
    members, rule = _members(pg_names, [crank[pg_code == g] for g in range(len(pg_names))], all_ranks, groups)
    top = max([span_r, *(max(m) + 1 for m in members if m)])
    pos_in = np.full((len(members), top), -1, dtype=np.int64)
    for g, m in enumerate(members):
        pos_in[g, list(m)] = np.arange(len(m))
    return Collectives(
        workload=workload.name,
        rows=rows,
        rank=crank,
        ids=ids,
        ctype=ctype,
        size=pc.fill_null(sizes, 0).to_numpy().astype(np.int64),
        size_ok=pc.is_valid(sizes).to_numpy(zero_copy_only=False),
        pg_names=pg_names,
        pg_code=pg_code,
        inst=inst,
        first_of=first_of,
        inst_seq=seq[first_of],
        members=members,
        rule=rule,
        gsize=np.array([len(m) for m in members], dtype=np.int64),
        apos=pos_in[pg_code, crank],
        ranks=all_ranks,
    )


def _number_instances(
    pg_code: np.ndarray, crank: np.ndarray, ids: np.ndarray, span_r: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(instance of each node, first node of each instance, k of each node).

    k counts a rank's nodes of a group in ascending id; instances are numbered by
    first appearance in issue order (rank, then id), as the simulator runs them.
    """
    key = pg_code * span_r + crank
    order = np.lexsort((ids, key))
    ks = key[order]
    new = np.r_[True, ks[1:] != ks[:-1]]
    seq = np.empty(len(crank), dtype=np.int64)
    seq[order] = np.arange(len(ks)) - np.maximum.accumulate(np.where(new, np.arange(len(ks)), 0))
    _, inst = np.unique(pg_code * (int(seq.max()) + 1) + seq, return_inverse=True)
    inst = inst.reshape(-1)
    issue = np.lexsort((ids, crank))
    _, first_pos = np.unique(inst[issue], return_index=True)  # per instance: first place in issue order
    by_first = np.argsort(first_pos, kind="stable")
    renum = np.empty_like(by_first)
    renum[by_first] = np.arange(len(by_first))
    return renum[inst], issue[first_pos[by_first]], seq


def _members(
    pg_names: list[str],
    used_rank: list[np.ndarray],
    all_ranks: np.ndarray,
    groups: Mapping[str, Sequence[int]] | None,
) -> tuple[list[tuple[int, ...]], list[int]]:
    """Member ranks of each communicator group and how they were found (``GIVEN``, ``EVERY``,
    ``CARRIERS``), as the simulator forms them: in the order the groups give them (algorithm
    rank i is member i); a name found as ASTRA-sim reads it (``stoi``); an absent name, or
    ``"0"`` that no group defines, is every rank; any other name the ranks that carry it."""
    given = {str(k): tuple(int(r) for r in v) for k, v in (groups or {}).items()}
    out: list[tuple[int, ...]] = []
    rule: list[int] = []
    for name, used in zip(pg_names, used_rank, strict=True):
        key = find_group(name, given) if name else None
        if key is not None:
            out.append(given[key])
            rule.append(GIVEN)
        elif name in DEFAULT_GROUP_NAMES:
            out.append(tuple(int(r) for r in all_ranks))
            rule.append(EVERY)
        else:
            out.append(tuple(int(r) for r in np.unique(used)))
            rule.append(CARRIERS)
    return out, rule


def _where_mask(ops: pa.Table, rows: np.ndarray, where: str) -> np.ndarray:
    """Which of ``rows`` satisfy the DuckDB boolean expression ``where`` (NULL counts as false).

    The user's text runs in an in-memory DuckDB that may touch no file (no ``read_csv``,
    ``COPY``, ``ATTACH``, ``INSTALL``, spilling) and cannot be reconfigured from the text:
    the settings of a read-only warehouse (:func:`etstore.sandbox.read_only_config`).
    """
    # duckdb is a heavy engine: imported only when a where predicate is given
    import duckdb

    cols = [c for c in ops.column_names if c not in ("attrs", "attr_order")]
    view = ops.select(cols).take(pa.array(rows)).append_column("_row", pa.array(np.arange(len(rows))))
    con = duckdb.connect(config=read_only_config())
    try:
        con.register("ops", view)
        got = con.sql(f"SELECT _row FROM ops WHERE ({where})").to_arrow_table()
    except duckdb.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise QueryError(
            f"the where predicate {where!r} is not a boolean SQL expression over op columns: {first}"
        ) from exc
    finally:
        con.close()
    mask = np.zeros(len(rows), dtype=bool)
    mask[got["_row"].to_numpy()] = True
    return mask


def select(colls: Collectives, ops: pa.Table, where: str | None, types: Sequence[str]) -> np.ndarray:
    """Per instance: chosen for expansion (``where`` holds on all its ranks; its type is in ``types``;
    its group has more than one rank).

    Raises
    ------
    QueryError
        ``where`` is not a boolean SQL expression over the op columns.
    OptionError
        ``where`` selects an instance on some of its ranks only.
    ExpansionError
        Nothing is chosen.
    """
    wname, ninst, inst = colls.workload, colls.ninst, colls.inst
    sel = np.ones(len(colls.rows), dtype=bool) if where is None else _where_mask(ops, colls.rows, where)
    nsel = np.bincount(inst, weights=sel.astype(np.float64), minlength=ninst).astype(np.int64)
    count = np.bincount(inst, minlength=ninst)
    partial = (nsel > 0) & (nsel < count)
    if partial.any():
        i = int(np.argmax(partial))
        rows_i = np.flatnonzero(inst == i)
        yes = sorted(int(r) for r in colls.rank[rows_i[sel[rows_i]]])
        no = sorted(int(r) for r in colls.rank[rows_i[~sel[rows_i]]])
        raise OptionError(
            f"trace {wname!r}: the where predicate selects {colls.describe(i)} "
            f"on ranks {yes} but not on {no}; an instance is expanded on all its ranks or none"
        )
    inst_type = colls.inst_type
    has_spec = np.array([t in types for t in inst_type], dtype=bool)
    # a collective of a one-rank group moves nothing: it stays a node (the simulator gives it
    # zero time, whatever the algorithm), as no algorithm has a single rank
    multi = colls.gsize[colls.inst_pg] > 1
    chosen = (nsel > 0) & has_spec & multi
    if not chosen.any():
        why = (
            "the where predicate selects no collective"
            if not (nsel > 0).any()
            else "every selected collective is in a one-rank group (nothing moves)"
            if not ((nsel > 0) & multi).any()
            else (
                "no selected collective has an algorithm for its type "
                f"({', '.join(sorted({str(t) for t in inst_type[nsel > 0]}))}; algorithms given for "
                f"{', '.join(sorted(types)) or 'none'})"
            )
        )
        raise ExpansionError(f"trace {wname!r}: nothing to expand: {why}")
    return chosen


def check_chosen(colls: Collectives, chosen: np.ndarray) -> None:
    """Every chosen instance: nodes on member ranks only, one type and positive size, on every member.

    Raises
    ------
    ExpansionError
        Naming the instance, the rank and node that disagree, or the members without a node.
    """
    wname, inst, crank = colls.workload, colls.inst, colls.rank
    xmask = chosen[inst]
    bad = xmask & (colls.apos < 0)
    if bad.any():
        j = int(np.argmax(bad))
        g = int(colls.pg_code[j])
        raise ExpansionError(
            f"trace {wname!r}: rank {int(crank[j])} node {int(colls.ids[j])} uses group "
            f"{colls.pg_names[g]!r} whose members are {list(colls.members[g])}"
        )
    ctype, size, size_ok = colls.ctype, colls.size, colls.size_ok
    j0 = colls.first_of[inst]
    bad = xmask & ((ctype != ctype[j0]) | (size != size[j0]) | (ctype == "") | ~size_ok | (size <= 0))
    if bad.any():
        j = int(np.argmax(bad))
        i = int(inst[j])
        raise ExpansionError(
            f"trace {wname!r}: {colls.describe(i)} is "
            f"{colls.inst_type[i] or 'untyped'} of {int(size[j0[j]])} bytes on rank {int(crank[j0[j]])} "
            f"but rank {int(crank[j])} node {int(colls.ids[j])} is {ctype[j] or 'untyped'} of "
            f"{int(size[j]) if size_ok[j] else 'no'} bytes (a collective needs a type and a positive "
            "size)"
        )
    count = np.bincount(inst, minlength=colls.ninst)
    lacking = chosen & (count != colls.gsize[colls.inst_pg])
    if lacking.any():
        i = int(np.argmax(lacking))
        have = {int(r) for r in crank[inst == i]}
        missing = sorted(set(colls.members[colls.inst_pg[i]]) - have)
        raise ExpansionError(
            f"trace {wname!r}: {colls.describe(i)} has no COMM_COLL_NODE on member rank(s) {missing}"
        )
