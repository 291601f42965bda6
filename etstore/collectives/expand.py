"""Expansion: replace a workload's collective nodes by the send/recv/reduce ops of an algorithm.

Every selected ``COMM_COLL_NODE`` on every rank of its communicator group becomes
that rank's part of the chosen algorithm (``docs/expand.md``): message sizes scaled
to the node's ``comm_size``, algorithm ranks mapped to the group's global ranks,
tags unique per collective instance, the node's predecessors feeding the part's
entry ops and its exit ops feeding the node's successors. The result is an
``expanded`` :class:`~etstore.model.Trace` plus a lineage table linking each
collective node to the ops that replace it (``BECOMES`` edges once stored).

The whole pass is vectorised: algorithms are prepared once per (collective, group
size) by :mod:`etstore.collectives._parts`, then every part is stamped into the
workload with ragged numpy gathers; no Python loop runs per op or per node.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.collective import COLLECTIVE_NAMES, chakra_name
from etstore.collectives._parts import Parts, concat, prepare
from etstore.collectives.generators import GENERATORS, generate
from etstore.errors import EtstoreError, QueryError
from etstore.model import DEPS_SCHEMA, OPS_SCHEMA, Trace, content_hash, deps_table, op_rows

__all__ = [
    "EXPANDED_SCHEMA",
    "LINEAGE_SCHEMA",
    "AlgorithmSpec",
    "Expansion",
    "StoredExpansion",
    "algorithms_by_type",
    "expand",
    "expand_stored",
    "parse_by_type",
    "parse_generator",
    "resolve_algorithm",
]

log = logging.getLogger(__name__)

AlgorithmSpec = str | Trace  # a generator ("ring", "ring:2" = 2 chunks per rank) or an algorithm trace

LINEAGE_SCHEMA = pa.schema([("rank", pa.int32()), ("id", pa.uint64()), ("parent_id", pa.uint64())])
EXPANDED_SCHEMA = pa.schema(
    [
        ("coll_seq", pa.int64()),
        ("pg_name", pa.string()),
        ("comm_type", pa.string()),
        ("comm_size", pa.int64()),
        ("group_size", pa.int32()),
        ("algorithm", pa.string()),
        ("ops", pa.int64()),
        ("sends", pa.int64()),
        ("bytes_sent", pa.int64()),
        ("first_tag", pa.int32()),
    ]
)

# Chakra CollectiveCommType name -> the algorithm representation's collective name
_INT32_MAX = (1 << 31) - 1


@dataclass(frozen=True, eq=False)
class Expansion:
    """What :func:`expand` produced.

    Attributes
    ----------
    trace
        The ``expanded`` trace. ``params`` records ``workload`` (name),
        ``workload_hash``, ``algorithms`` (per Chakra collective type, the
        algorithm trace's name), ``where``, ``tag_base``, ``tag_span``,
        ``reduce_duration_micros`` and the workload's ``comm_groups``.
    lineage
        :data:`LINEAGE_SCHEMA`: op ``(rank, id)`` of the expanded trace replaces
        collective ``(rank, parent_id)`` of the workload. Only new ops are listed;
        every other op keeps its rank and id.
    collectives
        :data:`EXPANDED_SCHEMA`, one row per expanded collective instance (all its
        ranks), in order of first appearance: ``coll_seq`` (k-th collective of its
        group), ``ops`` and ``sends`` written, ``bytes_sent`` (sum of the sends'
        ``comm_size``), ``first_tag`` (the instance's tags are
        ``first_tag .. first_tag + tag_span - 1``).
    algorithms
        Every algorithm trace used (generated ones included), by name.
    skipped
        ``COMM_COLL_NODE`` rows left as they were (not selected, or no algorithm
        for their type).
    """

    trace: Trace
    lineage: pa.Table
    collectives: pa.Table
    algorithms: Mapping[str, Trace] = field(default_factory=dict)
    skipped: int = 0


def _chakra_type(name: str) -> str:
    """Chakra collective name for any spelling (``allreduce``, ``all-reduce``, ``ALL_REDUCE``)."""
    chakra = chakra_name(name)
    if chakra is not None:
        return chakra
    raise EtstoreError(f"unknown collective {name!r}; expected one of {', '.join(COLLECTIVE_NAMES)}")


def parse_by_type(text: str) -> dict[str, str]:
    """``"allreduce=ring,allgather=direct"`` → ``{"ALL_REDUCE": "ring", "ALL_GATHER": "direct"}``.

    Raises
    ------
    EtstoreError
        An item is not ``COLLECTIVE=ALGORITHM`` or names an unknown collective.

    Examples
    --------
    >>> parse_by_type("allreduce=ring, all-gather=my-algo")
    {'ALL_REDUCE': 'ring', 'ALL_GATHER': 'my-algo'}
    """
    out: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise EtstoreError(f"--by-type item {item.strip()!r}: expected COLLECTIVE=ALGORITHM")
        out[_chakra_type(key.strip())] = value.strip()
    if not out:
        raise EtstoreError(f"--by-type {text!r}: expected COLLECTIVE=ALGORITHM[,COLLECTIVE=ALGORITHM...]")
    return out


def parse_generator(spec: str) -> tuple[str, int]:
    """``"ring:2"`` → ``("ring", 2)``: a generator name and its chunks per rank (default 1).

    Raises
    ------
    EtstoreError
        Unknown generator (the message lists them) or a chunk count that is not a
        positive integer.
    """
    name, _, chunks = spec.partition(":")
    if name not in GENERATORS:
        raise EtstoreError(
            f"algorithm {spec!r} is neither a stored algorithm nor a generator; generators: "
            f"{', '.join(GENERATORS)} (optionally NAME:CHUNKS)"
        )
    if chunks and (not chunks.isdigit() or int(chunks) < 1):
        raise EtstoreError(f"algorithm {spec!r}: chunks after ':' must be a positive integer")
    return name, int(chunks) if chunks else 1


def algorithms_by_type(algorithms: AlgorithmSpec | Mapping[str, AlgorithmSpec]) -> dict[str, AlgorithmSpec]:
    """Per Chakra collective type, the algorithm spec.

    A mapping's keys may be spelt any way (``allreduce``, ``ALL_REDUCE``); a single
    generator covers every collective it implements, a single trace the one in its
    ``params["collective"]`` (every type when it names none).

    Raises
    ------
    EtstoreError
        Unknown collective or generator.
    """
    if isinstance(algorithms, Mapping):
        out = {_chakra_type(str(k)): v for k, v in algorithms.items()}
        for spec in out.values():
            if isinstance(spec, str):
                parse_generator(spec)
        if "REDUCE_SCATTER" in out:
            out.setdefault("REDUCE_SCATTER_BLOCK", out["REDUCE_SCATTER"])
        return out
    if isinstance(algorithms, str):
        gen, _ = parse_generator(algorithms)
        shorts = GENERATORS[gen].collectives
        return {c: algorithms for c, s in COLLECTIVE_NAMES.items() if s in shorts}
    coll = algorithms.params.get("collective")
    if not coll:  # the caller vouches for it: every selected collective
        return dict.fromkeys(COLLECTIVE_NAMES, algorithms)
    return {c: algorithms for c, s in COLLECTIVE_NAMES.items() if s == str(coll)}


def _where_mask(ops: pa.Table, rows: np.ndarray, where: str) -> np.ndarray:
    """Which of ``rows`` satisfy the DuckDB boolean expression ``where`` (NULL counts as false)."""
    import duckdb

    cols = [c for c in ops.column_names if c not in ("attrs", "attr_order")]
    view = ops.select(cols).take(pa.array(rows)).append_column("_row", pa.array(np.arange(len(rows))))
    con = duckdb.connect()
    try:
        con.register("ops", view)
        got = con.sql(f"SELECT _row FROM ops WHERE ({where})").to_arrow_table()
    except duckdb.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise QueryError(
            f"--where {where!r} is not a boolean SQL expression over op columns: {first}"
        ) from exc
    finally:
        con.close()
    mask = np.zeros(len(rows), dtype=bool)
    mask[got["_row"].to_numpy()] = True
    return mask


def _members(
    pg_names: list[str],
    used_rank: list[np.ndarray],
    all_ranks: np.ndarray,
    groups: Mapping[str, Sequence[int]] | None,
) -> list[tuple[int, ...]]:
    """Member ranks (ascending) of each communicator group, as the simulator forms them."""
    given = {str(k): tuple(sorted(int(r) for r in v)) for k, v in (groups or {}).items()}
    out = []
    for name, used in zip(pg_names, used_rank, strict=True):
        if name in ("", "0"):
            out.append(tuple(int(r) for r in all_ranks))
        elif name in given:
            out.append(given[name])
        else:
            out.append(tuple(int(r) for r in np.unique(used)))
    return out


def _ragged(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For segments ``[starts[i], starts[i] + counts[i])``: each element's segment and index."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    owner = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    offs = np.cumsum(counts) - counts
    idx = np.asarray(starts, dtype=np.int64)[owner] + (np.arange(total, dtype=np.int64) - offs[owner])
    return owner, idx


def _describe(pg: str, seq: int, ctype: str) -> str:
    return (
        f"collective #{seq} ({ctype or 'no comm_type'}) of group {pg!r}"
        if pg
        else (f"collective #{seq} ({ctype or 'no comm_type'}) of the all-ranks group")
    )


def expand(
    workload: Trace,
    algorithms: AlgorithmSpec | Mapping[str, AlgorithmSpec],
    *,
    where: str | None = None,
    groups: Mapping[str, Sequence[int]] | None = None,
    reduce_duration_micros: int | None = None,
    name: str | None = None,
) -> Expansion:
    """Replace collective nodes of ``workload`` by their algorithm's per-rank subgraphs.

    Parameters
    ----------
    workload
        Any trace with ``COMM_COLL_NODE`` ops (``comm_type``, ``comm_size`` in bytes,
        ``pg_name``).
    algorithms
        One spec, or a mapping from collective type (``"ALL_REDUCE"``,
        ``"allgather"``, ...) to a spec. A spec is a generator name, optionally with
        chunks per rank (``"ring"``, ``"ring:2"``, generated for each group size and
        collective), or an algorithm :class:`Trace` whose rank count must equal the
        group size. A single generator covers the collectives it implements; a
        single trace covers the collective in its ``params["collective"]``.
    where
        DuckDB boolean expression over the collective nodes' columns
        (:data:`~etstore.model.OPS_SCHEMA` minus ``attrs``/``attr_order``), e.g.
        ``"comm_size > 1048576 AND pg_name = 'dp0'"``. A collective instance is
        expanded on all of its ranks or none.
    groups
        Communicator groups by ``pg_name``; default ``workload.params["comm_groups"]``.
        ``""`` and ``"0"`` mean every rank; an unknown name means the ranks whose
        collectives carry it (the simulator's rule).
    reduce_duration_micros
        Duration (µs) given to every ``COMP_NODE`` of an expansion; ``None`` keeps the
        algorithm's own (0 for generated algorithms).
    name
        Name of the expanded trace (default ``<workload>-expanded``).

    Returns
    -------
    Expansion
        The expanded trace, the lineage table and one row per expanded instance.

    Raises
    ------
    EtstoreError
        Nothing to expand, a group whose size differs from its algorithm's ranks, a
        collective missing on a member rank or disagreeing on type or size, a
        ``where`` that selects part of an instance, a size too small for the
        algorithm's chunks, tags beyond int32, or an unusable algorithm. Messages
        name the collective (group, sequence number, type), the group and the
        algorithm.
    QueryError
        ``where`` is not a valid expression.

    Notes
    -----
    Ids: each rank's new ops take ids after the rank's largest workload id, in
    row order, one contiguous block per collective node. Tags: instance ``i``
    (0-based among expanded ones, in order of first appearance) uses
    ``tag_base + i·tag_span + algorithm tag``, ``tag_base`` one more than the
    workload's largest ``comm_tag``. Sizes follow the simulator's (and ASTRA-sim's)
    reading of ``comm_size``: the per-rank contribution for ``ALL_GATHER`` (buffer
    = ``comm_size · group size``), the whole buffer otherwise; a message of ``c``
    chunks from chunk ``j`` of ``C`` moves ``S // C · c`` bytes plus ``S % C`` when
    it includes the last chunk (:func:`~etstore.collectives.message_sizes`), so
    the chunks of a buffer add up to ``S`` exactly.

    O(V + E + V' + E') with V', E' the expanded ops and deps, plus
    O(V_a log V_a) per distinct (algorithm, group size) to prepare it and
    O(E log E) sorts over the workload's deps.

    Examples
    --------
    >>> from etstore.model import ops_table
    >>> w = Trace(ops_table({"rank": [0, 1], "id": [5, 5], "type": ["COMM_COLL_NODE"] * 2,
    ...                      "comm_type": ["ALL_REDUCE"] * 2, "comm_size": [1024, 1024]}))
    >>> x = expand(w, "ring")
    >>> x.trace.num_ops, x.collectives["bytes_sent"].to_pylist()  # 2 sends of 512 bytes per rank
    (10, [2048])
    """
    ops = workload.ops
    n0 = ops.num_rows
    wname = workload.name
    if reduce_duration_micros is not None and reduce_duration_micros < 0:
        raise EtstoreError(f"reduce_duration_micros must not be negative, got {reduce_duration_micros}")
    is_coll = pc.fill_null(pc.equal(ops["type"], "COMM_COLL_NODE"), False).to_numpy(zero_copy_only=False)
    coll_rows = np.flatnonzero(is_coll)
    if len(coll_rows) == 0:
        raise EtstoreError(f"trace {wname!r} has no COMM_COLL_NODE to expand")
    specs = algorithms_by_type(algorithms)
    rank_all = ops["rank"].to_numpy().astype(np.int64)
    ids_all = ops["id"].to_numpy()
    crank = rank_all[coll_rows]
    take = pa.array(coll_rows)
    ctype = np.asarray(pc.fill_null(ops["comm_type"].take(take), "").to_pylist(), dtype=object)
    csize_v, csize_ok = (
        pc.fill_null(ops["comm_size"].take(take), 0).to_numpy().astype(np.int64),
        pc.is_valid(ops["comm_size"].take(take)).to_numpy(zero_copy_only=False),
    )
    pg_enc = pc.dictionary_encode(pc.fill_null(ops["pg_name"].take(take), "")).combine_chunks()
    pg_names = [str(x) for x in pg_enc.dictionary.to_pylist()]
    pg_code = pg_enc.indices.to_numpy().astype(np.int64)

    # ---- instances: the k-th collective of group g on each rank
    span_r = int(rank_all.max()) + 1
    key = pg_code * span_r + crank
    order = np.argsort(key, kind="stable")
    ks = key[order]
    new = np.r_[True, ks[1:] != ks[:-1]]
    seq = np.empty(len(coll_rows), dtype=np.int64)
    seq[order] = np.arange(len(ks)) - np.maximum.accumulate(np.where(new, np.arange(len(ks)), 0))
    ikey = pg_code * (int(seq.max()) + 1) + seq
    _, first_of, inst = np.unique(ikey, return_index=True, return_inverse=True)
    inst = inst.reshape(-1)
    # renumber instances by first appearance (file order)
    by_first = np.argsort(first_of, kind="stable")
    renum = np.empty_like(by_first)
    renum[by_first] = np.arange(len(by_first))
    inst = renum[inst]
    first_of = first_of[by_first]
    ninst = len(first_of)
    inst_pg = pg_code[first_of]
    inst_seq = seq[first_of]
    inst_type = ctype[first_of]

    def what(i: int) -> str:
        return _describe(pg_names[inst_pg[i]], int(inst_seq[i]), str(inst_type[i]))

    if groups is None:
        cg = workload.params.get("comm_groups")
        groups = cg if isinstance(cg, Mapping) else None
    members = _members(
        pg_names, [crank[pg_code == g] for g in range(len(pg_names))], np.unique(rank_all), groups
    )
    gsize = np.array([len(m) for m in members], dtype=np.int64)
    top = max([span_r, *(max(m) + 1 for m in members if m)])
    pos_in = np.full((len(members), top), -1, dtype=np.int64)
    for g, m in enumerate(members):
        pos_in[g, list(m)] = np.arange(len(m))
    apos = pos_in[pg_code, crank]

    # ---- selection
    sel = np.ones(len(coll_rows), dtype=bool) if where is None else _where_mask(ops, coll_rows, where)
    nsel = np.bincount(inst, weights=sel.astype(np.float64), minlength=ninst).astype(np.int64)
    count = np.bincount(inst, minlength=ninst)
    partial = (nsel > 0) & (nsel < count)
    if partial.any():
        i = int(np.argmax(partial))
        rows_i = np.flatnonzero(inst == i)
        yes = sorted(int(r) for r in crank[rows_i[sel[rows_i]]])
        no = sorted(int(r) for r in crank[rows_i[~sel[rows_i]]])
        raise EtstoreError(
            f"trace {wname!r}: --where selects {what(i)} "
            f"on ranks {yes} but not on {no}; an instance is expanded on all its ranks or none"
        )
    has_spec = np.array([t in specs for t in inst_type], dtype=bool)
    chosen = (nsel > 0) & has_spec
    if not chosen.any():
        what = (
            "the --where predicate selects no collective"
            if not (nsel > 0).any()
            else (
                "no selected collective has an algorithm for its type "
                f"({', '.join(sorted({str(t) for t in inst_type[nsel > 0]}))}; algorithms given for "
                f"{', '.join(sorted(specs)) or 'none'})"
            )
        )
        raise EtstoreError(f"trace {wname!r}: nothing to expand: {what}")
    xmask = chosen[inst]
    # consistency of the chosen instances
    bad = xmask & (apos < 0)
    if bad.any():
        j = int(np.argmax(bad))
        raise EtstoreError(
            f"trace {wname!r}: rank {int(crank[j])} node {int(ids_all[coll_rows[j]])} uses group "
            f"{pg_names[pg_code[j]]!r} whose members are {list(members[pg_code[j]])}"
        )
    j0 = first_of[inst]
    bad = xmask & (
        (ctype != ctype[j0]) | (csize_v != csize_v[j0]) | (ctype == "") | ~csize_ok | (csize_v <= 0)
    )
    if bad.any():
        j = int(np.argmax(bad))
        i = int(inst[j])
        raise EtstoreError(
            f"trace {wname!r}: {what(i)} is "
            f"{inst_type[i] or 'untyped'} of {int(csize_v[j0[j]])} bytes on rank {int(crank[j0[j]])} "
            f"but rank {int(crank[j])} node {int(ids_all[coll_rows[j]])} is {ctype[j] or 'untyped'} of "
            f"{int(csize_v[j]) if csize_ok[j] else 'no'} bytes (a collective needs a type and a positive "
            "size)"
        )
    lacking = chosen & (count != gsize[inst_pg])
    if lacking.any():
        i = int(np.argmax(lacking))
        have = {int(r) for r in crank[inst == i]}
        missing = sorted(set(members[inst_pg[i]]) - have)
        raise EtstoreError(f"trace {wname!r}: {what(i)} has no COMM_COLL_NODE on member rank(s) {missing}")

    # ---- algorithms per (type, group size)
    prepared: list[Parts] = []
    used: dict[str, Trace] = {}
    alg_of: dict[tuple[str, int], int] = {}
    cache: dict[tuple[int, str, int], int] = {}  # (id(spec) / spec hash, short, n) -> algorithm index
    inst_alg = np.full(ninst, -1, dtype=np.int64)
    for i in np.flatnonzero(chosen).tolist():
        t, n = str(inst_type[i]), int(gsize[inst_pg[i]])
        k = (t, n)
        if k not in alg_of:
            spec = specs[t]
            ck = (hash(spec) if isinstance(spec, str) else id(spec), COLLECTIVE_NAMES[t], n)
            if ck not in cache:
                alg = _algorithm(spec, t, n, wname, pg_names[inst_pg[i]], int(inst_seq[i]))
                cache[ck] = len(prepared)
                prepared.append(prepare(alg, alg.name))
                used[alg.name] = alg
            alg_of[k] = cache[ck]
        inst_alg[i] = alg_of[k]
    parts = concat(prepared)
    inst_n = gsize[inst_pg]
    inst_buf = np.where(inst_type == "ALL_GATHER", csize_v[first_of] * inst_n, csize_v[first_of])
    small = chosen & (inst_buf < parts.max_chunks[np.clip(inst_alg, 0, None)])
    if small.any():
        i = int(np.argmax(small))
        raise EtstoreError(
            f"trace {wname!r}: {what(i)} moves "
            f"{int(inst_buf[i])} bytes, fewer than the {int(parts.max_chunks[inst_alg[i]])} chunks of "
            f"algorithm {parts.labels[inst_alg[i]]!r}"
        )
    # tags
    tags = ops["comm_tag"]
    tag_base = max(int(pc.max(tags).as_py() or 0) + 1, 0) if tags.null_count < n0 else 0
    span = parts.tag_span
    inst_ord = np.cumsum(chosen) - 1
    nchosen = int(chosen.sum())
    if tag_base + nchosen * span - 1 > _INT32_MAX:
        raise EtstoreError(
            f"trace {wname!r}: {nchosen} collectives × {span} tags from {tag_base} exceed int32 comm_tag; "
            "expand fewer collectives at a time (--where)"
        )
    inst_tag0 = tag_base + inst_ord * span

    # ---- the expanded collective nodes (X rows), in row order
    xj = np.flatnonzero(xmask)  # index into coll_rows
    xrows = coll_rows[xj]
    xinst = inst[xj]
    xrank = crank[xj]
    xpart = parts.part_base[inst_alg[xinst]] + apos[xj]
    xm = parts.op_start[xpart + 1] - parts.op_start[xpart]
    # ids: after each rank's largest id, one block per node in row order
    rank_max = np.zeros(span_r, dtype=np.uint64)
    np.maximum.at(rank_max, rank_all, ids_all.astype(np.uint64))
    rorder = np.argsort(xrank, kind="stable")
    rs = xrank[rorder]
    csum = np.cumsum(xm[rorder]) - xm[rorder]
    gstart = np.maximum.accumulate(np.where(np.r_[True, rs[1:] != rs[:-1]], np.arange(len(rs)), 0))
    within = np.empty(len(xj), dtype=np.int64)
    within[rorder] = csum - csum[gstart]
    xbase = rank_max[xrank] + np.uint64(1) + within.astype(np.uint64)

    # ---- new ops
    owner, q = _ragged(parts.op_start[xpart], xm)
    nnew = len(q)
    new_rank = xrank[owner]
    new_id = xbase[owner] + parts.local[q].astype(np.uint64)
    grp = inst_pg[xinst]
    member = np.full((len(members), max(int(gsize.max()), 1)), -1, dtype=np.int64)
    for g, m in enumerate(members):
        member[g, : len(m)] = m
    peer = parts.peer[q]
    gpeer = member[grp[owner], np.clip(peer, 0, None)]
    is_send, is_recv = parts.is_send[q], parts.is_recv[q]
    comm = is_send | is_recv
    S = inst_buf[xinst][owner]
    c, C, f0 = parts.cnt[q], parts.total[q], parts.first[q]
    chunk_bytes = (S // C) * c + np.where((f0 + c >= C) & (c > 0), S % C, 0)
    size = np.where(parts.chunked[q], chunk_bytes, parts.fixed_size[q])
    tag = inst_tag0[xinst][owner] + parts.tag[q]
    dur = parts.duration[q]
    if reduce_duration_micros is not None:
        dur = np.where(parts.is_comp[q], np.uint64(reduce_duration_micros), dur)
    # ---- assemble in output order: each expanded node's block takes the node's place on its rank
    out_len = np.ones(n0, dtype=np.int64)
    out_len[xrows] = xm
    out_start = np.cumsum(out_len) - out_len
    kept_rows = np.flatnonzero(out_len == 1 if len(xrows) == 0 else _not_in(n0, xrows))
    offs = np.cumsum(xm) - xm
    place = _Placer(
        int(out_len.sum()),
        out_start[kept_rows],
        kept_rows,
        out_start[xrows][owner] + (np.arange(nnew) - offs[owner]),
    )
    ones = np.ones(nnew, dtype=bool)
    new_cols: dict[str, tuple[np.ndarray, np.ndarray] | tuple[pa.Array, np.ndarray]] = {
        "rank": (new_rank, ones),
        "id": (new_id, ones),
        "duration_micros": (dur, ones),
        "comm_size": (size, comm),
        "comm_src": (gpeer, is_recv),
        "comm_dst": (gpeer, is_send),
        "comm_tag": (tag, comm),
    }
    arrays = []
    for f in OPS_SCHEMA:
        old = ops[f.name]
        if f.name in new_cols:
            arrays.append(place.numeric(old, *new_cols[f.name], f.type))
        elif f.name == "pg_name":  # the collective's group
            arrays.append(place.take(old, None, xrows[owner]))
        elif f.name == "comm_type":
            arrays.append(place.take(old, pa.nulls(1, f.type), np.zeros(nnew, dtype=np.int64)))
        elif pa.types.is_string(f.type) or pa.types.is_binary(f.type):
            arrays.append(place.take(old, parts.columns[f.name], q))
        else:
            vals, valid = _numpy(parts.columns[f.name])
            arrays.append(place.numeric(old, vals[q], valid[q], f.type))
    out_ops = pa.Table.from_arrays(arrays, schema=OPS_SCHEMA)

    # ---- dependencies
    xof = np.full(n0, -1, dtype=np.int64)
    xof[xrows] = np.arange(len(xrows))
    deps, missing = _external_deps(workload, xof, xpart, xbase, parts)
    iowner, iq = _ragged(parts.edge_start[xpart], parts.edge_start[xpart + 1] - parts.edge_start[xpart])
    internal = pa.Table.from_arrays(
        [
            pa.array(xrank[iowner].astype(np.int32)),
            pa.array(xbase[iowner] + parts.esrc[iq].astype(np.uint64)),
            pa.array(xbase[iowner] + parts.edst[iq].astype(np.uint64)),
            _gather_bytes(parts.ekind, iq),
            pa.array(parts.epos[iq].astype(np.int32)),
        ],
        schema=DEPS_SCHEMA,
    )
    all_deps = pa.concat_tables([deps, internal])
    dorder = np.argsort(all_deps["rank"].to_numpy(), kind="stable")
    all_deps = all_deps.take(pa.array(dorder))

    lineage = pa.Table.from_arrays(
        [pa.array(new_rank.astype(np.int32)), pa.array(new_id), pa.array(ids_all[xrows][owner])],
        schema=LINEAGE_SCHEMA,
    )
    summary = _summary(
        np.flatnonzero(chosen),
        xinst,
        owner,
        xm,
        is_send,
        size,
        pg_names,
        inst_pg,
        inst_seq,
        inst_type,
        csize_v[first_of],
        inst_n,
        [parts.labels[a] for a in inst_alg.tolist()],
        inst_tag0,
    )
    params: dict[str, Any] = {
        "workload": wname,
        "workload_hash": content_hash(workload),
        "algorithms": {t: parts.labels[a] for (t, _), a in sorted(alg_of.items())},
        "where": where,
        "tag_base": tag_base,
        "tag_span": span,
        "reduce_duration_micros": reduce_duration_micros,
        "expanded_collectives": nchosen,
        "producer": "expand",
    }
    if groups:
        params["comm_groups"] = {str(k): [int(r) for r in v] for k, v in groups.items()}
    trace = Trace(
        ops=out_ops,
        deps=all_deps,
        missing=missing,
        meta=workload.meta,
        name=name or f"{wname}-expanded",
        kind="expanded",
        source=f"expand({wname!r})",
        params=params,
    )
    skipped = len(coll_rows) - len(xrows)
    log.debug("expanded %d collective nodes of %s into %d ops", len(xrows), wname, nnew)
    return Expansion(trace=trace, lineage=lineage, collectives=summary, algorithms=used, skipped=skipped)


def _algorithm(spec: AlgorithmSpec, ctype: str, n: int, wname: str, pg: str, seq: int) -> Trace:
    """The algorithm trace for a collective of type ``ctype`` on ``n`` ranks (generated or checked)."""
    short = COLLECTIVE_NAMES[ctype]
    what = _describe(pg, seq, ctype)
    if isinstance(spec, str):
        gen, chunks = parse_generator(spec)
        try:
            return generate(gen, coll=short, ranks=n, chunks=chunks)
        except EtstoreError as exc:
            raise EtstoreError(
                f"trace {wname!r}: cannot generate {spec!r} for {what} on {n} ranks: {exc}"
            ) from exc
    have = int(spec.params.get("ngpus") or 0) or spec.num_ranks
    if have != n:
        raise EtstoreError(
            f"trace {wname!r}: {what} has {n} member ranks but algorithm {spec.name!r} has {have} ranks; "
            "use an algorithm for that group size (or a generator such as 'ring')"
        )
    coll = spec.params.get("collective")
    if coll and str(coll) != short:
        raise EtstoreError(
            f"trace {wname!r}: {what} is {short} but algorithm {spec.name!r} implements {coll}"
        )
    return spec


def _external_deps(
    workload: Trace, xof: np.ndarray, xpart: np.ndarray, xbase: np.ndarray, parts: Parts
) -> tuple[pa.Table, pa.Table]:
    """The workload's deps (and missing deps) rewired around the expanded nodes.

    An edge into an expanded node becomes one edge into each entry op of its part;
    an edge out of one becomes one edge out of each exit op; both ends expanded
    gives the cross product. Positions are recomputed per (rank, dst, kind) over
    present and missing deps together, keeping their original order.
    """
    ops = workload.ops
    tables = []
    for flag, d in ((0, workload.deps), (1, workload.missing)):
        if d.num_rows:
            tables.append(d.append_column("_missing", pa.array(np.full(d.num_rows, flag, dtype=np.int8))))
    if not tables:
        empty = DEPS_SCHEMA.empty_table()
        return empty, empty
    d = pa.concat_tables(tables)
    d = d.take(
        pa.array(
            np.lexsort(
                (d["pos"].to_numpy(), _kind_code(d["kind"]), d["dst"].to_numpy(), d["rank"].to_numpy())
            )
        )
    )
    rank = d["rank"].to_numpy().astype(np.int64)
    src = d["src"].to_numpy()
    dst = d["dst"].to_numpy()
    is_missing = d["_missing"].to_numpy().astype(bool)
    drow = op_rows(ops, rank, dst)
    dx = xof[drow]
    sx = np.full(len(src), -1, dtype=np.int64)
    present = np.flatnonzero(~is_missing)
    if len(present):
        sx[present] = xof[op_rows(ops, rank[present], src[present])]
    sp = xpart[np.clip(sx, 0, None)] if len(xpart) else np.zeros(len(sx), np.int64)
    dp = xpart[np.clip(dx, 0, None)] if len(xpart) else np.zeros(len(dx), np.int64)
    ns = np.where(sx >= 0, parts.exit_start[sp + 1] - parts.exit_start[sp], 1)
    nd = np.where(dx >= 0, parts.entry_start[dp + 1] - parts.entry_start[dp], 1)
    owner, k = _ragged(np.zeros(len(ns), dtype=np.int64), ns * nd)
    si, di = k // nd[owner], k % nd[owner]
    so, do = sx[owner], dx[owner]
    exit_local = parts.exit[np.clip(parts.exit_start[sp[owner]] + si, 0, max(len(parts.exit) - 1, 0))]
    entry_local = parts.entry[np.clip(parts.entry_start[dp[owner]] + di, 0, max(len(parts.entry) - 1, 0))]
    base = np.concatenate([xbase, np.zeros(1, dtype=np.uint64)])
    new_src = np.where(so >= 0, base[so] + exit_local.astype(np.uint64), src[owner])
    new_dst = np.where(do >= 0, base[do] + entry_local.astype(np.uint64), dst[owner])
    kinds = d["kind"].take(pa.array(owner))
    table = deps_table(rank[owner], new_src, new_dst, kinds)
    miss = is_missing[owner]
    return table.filter(pa.array(~miss)), table.filter(pa.array(miss))


def _not_in(n: int, rows: np.ndarray) -> np.ndarray:
    keep = np.ones(n, dtype=bool)
    keep[rows] = False
    return keep


def _numpy(col: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(values with nulls zeroed, validity) of a numeric or boolean column."""
    valid = pc.is_valid(col).to_numpy(zero_copy_only=False)
    return pc.fill_null(col, pa.scalar(0, col.type) if not pa.types.is_boolean(col.type) else False).to_numpy(
        zero_copy_only=False
    ), valid


class _Placer:
    """Builds output columns from kept workload rows and new ops, each at its output position."""

    def __init__(self, n: int, kpos: np.ndarray, kept: np.ndarray, npos: np.ndarray) -> None:
        self.n, self.kpos, self.kept, self.npos = n, kpos, kept, npos

    def numeric(
        self, old: pa.ChunkedArray, values: np.ndarray, valid: np.ndarray, typ: pa.DataType
    ) -> pa.Array:
        """Fixed-width column: numpy scatter of old and new values and validity (O(n))."""
        ov, ok = _numpy(old)
        dtype = np.bool_ if pa.types.is_boolean(typ) else typ.to_pandas_dtype()
        out = np.empty(self.n, dtype=dtype)
        out[self.kpos] = ov[self.kept]
        out[self.npos] = values
        mask = np.empty(self.n, dtype=bool)
        mask[self.kpos] = ok[self.kept]
        mask[self.npos] = valid
        return pa.array(out, type=typ, mask=None if mask.all() else ~mask)

    def take(self, old: pa.ChunkedArray, pool: pa.Array | None, src: np.ndarray) -> pa.Array:
        """Variable-width column: one take from the small source ``old ++ pool`` (``src`` indexes
        ``pool``, or ``old`` when ``pool`` is None)."""
        base = old.combine_chunks()
        n_old = len(base)
        idx = np.empty(self.n, dtype=np.int64)
        idx[self.kpos] = self.kept
        idx[self.npos] = src if pool is None else n_old + src
        source = base if pool is None else pa.concat_arrays([base, pool.cast(base.type)])
        return _gather_bytes(source, idx)


def _gather_bytes(source: pa.Array, idx: np.ndarray) -> pa.Array:
    """``source.take(idx)`` for a string/binary array, copying runs of consecutive indices at once.

    Expanded ops copy whole blocks of the algorithm's rows, so ``idx`` is a few
    thousand runs; each run is one slice of the data buffer (a memcpy) instead of
    one copy per element. Falls back to Arrow's take when runs are short.
    """
    n = len(idx)
    if n == 0:
        return source.take(pa.array(idx))
    breaks = np.flatnonzero(np.diff(idx) != 1) + 1
    if len(breaks) * 8 > n or source.offset:
        return source.take(pa.array(idx))
    _, offsets_buf, data_buf = source.buffers()[:3]
    src_off = np.frombuffer(offsets_buf, dtype=np.int32)[: len(source) + 1].astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    lens = src_off[idx + 1] - src_off[idx]
    out_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=out_off[1:])
    if out_off[-1] >= 1 << 31:
        return source.take(pa.array(idx))
    run_start = np.r_[0, breaks]
    run_end = np.r_[breaks, n]
    a = src_off[idx[run_start]].tolist()
    b = src_off[idx[run_end - 1] + 1].tolist()
    out_data = np.concatenate([data[x:y] for x, y in zip(a, b, strict=True)])
    bufs: list[pa.Buffer | None] = [None, pa.py_buffer(out_off.astype(np.int32)), pa.py_buffer(out_data)]
    if source.null_count:
        valid = pc.is_valid(source).to_numpy(zero_copy_only=False)[idx]
        if not valid.all():
            bufs[0] = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(source.type, n, bufs)


def _kind_code(kinds: pa.ChunkedArray) -> np.ndarray:
    return pc.equal(kinds, "ctrl").to_numpy(zero_copy_only=False).astype(np.int8)


def _summary(
    chosen: np.ndarray,
    xinst: np.ndarray,
    owner: np.ndarray,
    xm: np.ndarray,
    is_send: np.ndarray,
    size: np.ndarray,
    pg_names: list[str],
    inst_pg: np.ndarray,
    inst_seq: np.ndarray,
    inst_type: np.ndarray,
    inst_size: np.ndarray,
    inst_n: np.ndarray,
    labels: list[str],
    inst_tag0: np.ndarray,
) -> pa.Table:
    """One :data:`EXPANDED_SCHEMA` row per expanded instance."""
    ninst = len(inst_pg)
    new_inst = xinst[owner]
    ops_n = np.bincount(xinst, weights=xm, minlength=ninst)
    sends = np.bincount(new_inst[is_send], minlength=ninst)
    sent = np.zeros(ninst, dtype=np.int64)
    np.add.at(sent, new_inst[is_send], size[is_send].astype(np.int64))
    return pa.Table.from_arrays(
        [
            pa.array(inst_seq[chosen]),
            pa.array([pg_names[g] for g in inst_pg[chosen].tolist()], pa.string()),
            pa.array([str(t) for t in inst_type[chosen]], pa.string()),
            pa.array(inst_size[chosen].astype(np.int64)),
            pa.array(inst_n[chosen].astype(np.int32)),
            pa.array([labels[i] for i in chosen.tolist()], pa.string()),
            pa.array(ops_n[chosen].astype(np.int64)),
            pa.array(sends[chosen].astype(np.int64)),
            pa.array(sent[chosen]),
            pa.array(inst_tag0[chosen].astype(np.int32)),
        ],
        schema=EXPANDED_SCHEMA,
    )


@dataclass(frozen=True)
class StoredExpansion:
    """What :func:`expand_stored` did: the expansion, the ingest report of the new
    trace, and the stored name of each algorithm used (by the expansion's label)."""

    expansion: Expansion
    report: Any
    algorithm_names: Mapping[str, str]


def resolve_algorithm(store: Any, spec: str | Trace, loaded: dict[str, Trace] | None = None) -> str | Trace:
    """A stored algorithm trace by name, else a generator spec (``ring``, ``ring:2``), checked."""
    if isinstance(spec, Trace):
        return spec
    loaded = {} if loaded is None else loaded
    if spec in loaded:
        return loaded[spec]
    if spec in {t.name for t in store.traces()}:
        trace = store.load(spec)
        if trace.kind != "algorithm":
            raise EtstoreError(f"{spec!r} is a {trace.kind} trace, not an algorithm")
        loaded[spec] = trace
        return trace
    parse_generator(spec)  # raises naming the generators and the stored traces are not it
    return spec


def expand_stored(
    store: Any,
    workload: str,
    algorithms: str | Trace | Mapping[str, str | Trace],
    *,
    where: str | None = None,
    reduce_duration_micros: int | None = None,
    name: str | None = None,
) -> StoredExpansion:
    """Expand stored trace ``workload`` and store the result with its lineage.

    ``algorithms`` is as for :func:`expand`, except that a string may also name a
    stored algorithm trace. Generated algorithms are stored too, so the expanded
    trace's ``params["algorithms"]`` names stored traces; if the expanded trace then
    fails to land, the algorithms stored here are removed again (nothing partial).

    Raises
    ------
    UnknownTraceError
        ``workload`` is not stored.
    EtstoreError
        As :func:`expand`.
    """
    trace = store.load(workload)
    loaded: dict[str, Trace] = {}
    if isinstance(algorithms, Mapping):
        specs: Any = {k: resolve_algorithm(store, v, loaded) for k, v in algorithms.items()}
    else:
        specs = resolve_algorithm(store, algorithms, loaded)
    result = expand(trace, specs, where=where, reduce_duration_micros=reduce_duration_micros, name=name)
    names: dict[str, str] = {}
    created: list[str] = []
    try:
        for label, alg in result.algorithms.items():
            if any(alg is t for t in loaded.values()):  # already stored: keep its name
                names[label] = alg.name
                continue
            got = store.ingest(alg)
            names[label] = got.trace.name
            if got.created:
                created.append(got.trace.name)
        params = dict(result.trace.params)
        params["algorithms"] = {t: names.get(a, a) for t, a in params["algorithms"].items()}
        report = store.ingest(
            result.trace.replace(params=params), name=name, parent=workload, lineage=result.lineage
        )
    except BaseException:
        for stored_name in created:
            store.remove(stored_name)
        raise
    return StoredExpansion(result, report, names)
