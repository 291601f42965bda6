"""Expansion: replace a workload's collective nodes by the send/recv/reduce ops of an algorithm.

Every selected ``COMM_COLL_NODE`` on every rank of its communicator group becomes
that rank's part of the chosen algorithm (``docs/expand.md``): message sizes scaled
to the node's ``comm_size``, algorithm ranks mapped to the group's global ranks,
tags unique per collective instance, the node's predecessors feeding the part's
entry ops and its exit ops feeding the node's successors. The result is an
``expanded`` :class:`~etstore.model.Trace` plus a lineage table linking each
collective node to the ops that replace it (``BECOMES`` edges once stored).

The whole pass is vectorised: algorithms are prepared once per (collective, group
size) by :mod:`etstore.algorithms._parts`, then every part is stamped into the
workload with ragged numpy gathers; no Python loop runs per op or per node.

Phases, one module each: selection of instances (``_instances``), algorithm
instantiation (here, cached per spec and group size), placement of the new ops
(``_placement``), rewiring of dependencies (``_rewire``), then lineage and the
per-instance summary (here). Storing an expansion is :mod:`etstore.app.expand`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.algorithms._chunk_reads import narrow_consumers
from etstore.algorithms._instances import Collectives, check_chosen, find_collectives, given_groups, select
from etstore.algorithms._parts import Parts, buffer_bytes, concat, prepare
from etstore.algorithms._placement import Placed, place_ops
from etstore.algorithms._rewire import rewire
from etstore.algorithms.generators import generate
from etstore.algorithms.specs import AlgorithmSpec, algorithms_by_type, parse_by_type, parse_generator
from etstore.collective import COLLECTIVE_NAMES
from etstore.digest import content_hash
from etstore.errors import EtstoreError, ExpansionError, OptionError
from etstore.model import Trace
from etstore.progress import ProgressFn

__all__ = [
    "EXPANDED_SCHEMA",
    "LINEAGE_SCHEMA",
    "AlgorithmSpec",
    "Expansion",
    "algorithms_by_type",
    "expand",
    "parse_by_type",
    "parse_generator",
]

log = logging.getLogger(__name__)


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
        ranks), in order of first appearance by rank, then node id: ``coll_seq`` (k-th
        collective of its group, counted in node-id order), ``ops`` and ``sends``
        written, ``bytes_sent`` (sum of the sends' ``comm_size``), ``first_tag`` (the
        instance's tags are
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


def expand(
    workload: Trace,
    algorithms: AlgorithmSpec | Mapping[str, AlgorithmSpec],
    *,
    where: str | None = None,
    groups: Mapping[str, Sequence[int]] | None = None,
    reduce_duration_micros: int | None = None,
    name: str | None = None,
    progress: ProgressFn | None = None,
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
    progress
        Called as ``progress(phase, done, total)``: ``collectives`` (workload ops, 0
        then all), then ``algorithms``, ``place`` and ``rewire`` (collective instances
        to expand; ``algorithms`` about every 1,024 instances).

    Returns
    -------
    Expansion
        The expanded trace, the lineage table and one row per expanded instance.

    Raises
    ------
    ExpansionError
        Nothing to expand, a group whose size differs from its algorithm's ranks, a
        collective missing on a member rank or disagreeing on type or size, a size
        too small for the algorithm's chunks, tags beyond int32, or an unusable
        algorithm. Messages name the collective (group, sequence number, type), the
        group and the algorithm.
    OptionError
        An unknown collective or generator, a negative ``reduce_duration_micros``,
        or a ``where`` that selects part of an instance.
    QueryError
        ``where`` is not a valid expression.

    Notes
    -----
    Ids: each rank's new ops take ids after the rank's largest workload id, in
    row order, one contiguous block per collective node. Tags: instance ``i``
    (0-based among expanded ones, in order of first appearance by rank, then node id) uses
    ``tag_base + i·tag_span + algorithm tag``, ``tag_base`` one more than the
    workload's largest ``comm_tag``. Sizes follow the simulator's (and ASTRA-sim's)
    reading of ``comm_size``: the per-rank contribution for ``ALL_GATHER`` (buffer
    = ``comm_size · group size``), the whole buffer otherwise; a message of ``c``
    chunks from chunk ``j`` of ``C`` moves ``S // C · c`` bytes plus ``S % C`` when
    it includes the last chunk (:func:`~etstore.formats.message_sizes`), so
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
    wname = workload.name
    if reduce_duration_micros is not None and reduce_duration_micros < 0:
        raise OptionError(f"reduce_duration_micros must not be negative, got {reduce_duration_micros}")
    specs = algorithms_by_type(algorithms)
    groups = given_groups(workload, groups)
    step = progress or _no_progress
    step("collectives", 0, workload.num_ops)
    colls = find_collectives(workload, groups)
    chosen = select(colls, workload.ops, where, list(specs))
    check_chosen(colls, chosen)
    step("collectives", workload.num_ops, workload.num_ops)
    nchosen = int(chosen.sum())
    parts, used, labels_by_type, inst_alg = _instantiate(colls, chosen, specs, step)
    inst_buf = _buffer_bytes(colls, chosen, parts, inst_alg)
    tag_base, inst_tag0 = _assign_tags(workload, chosen, parts.tag_span)
    step("place", 0, nchosen)
    placed = place_ops(workload, colls, chosen, parts, inst_alg, inst_buf, inst_tag0, reduce_duration_micros)
    step("place", nchosen, nchosen)
    step("rewire", 0, nchosen)
    deps, missing = rewire(workload, placed, parts)
    step("rewire", nchosen, nchosen)
    lineage = pa.Table.from_arrays(
        [
            pa.array(placed.new_rank.astype(np.int32)),
            pa.array(placed.new_id),
            pa.array(workload.ops["id"].to_numpy()[placed.xrows][placed.owner]),
        ],
        schema=LINEAGE_SCHEMA,
    )
    summary = _summary(colls, chosen, placed, [parts.labels[a] for a in inst_alg.tolist()], inst_tag0)
    params: dict[str, Any] = {
        "workload": wname,
        "workload_hash": content_hash(workload),
        "algorithms": labels_by_type,
        "where": where,
        "tag_base": tag_base,
        "tag_span": parts.tag_span,
        "reduce_duration_micros": reduce_duration_micros,
        "expanded_collectives": int(chosen.sum()),
        "producer": "expand",
        "collective_blocks": _blocks(workload, placed),
    }
    if groups:
        params["comm_groups"] = {str(k): [int(r) for r in v] for k, v in groups.items()}
    for key in RECORDING_PARAMS:  # a recording's execution model and measured steps stay
        if key in workload.params:
            params[key] = workload.params[key]
    trace = Trace(
        ops=placed.ops,
        deps=deps,
        missing=missing,
        meta=workload.meta,
        name=name or f"{wname}-expanded",
        kind="expanded",
        source=f"expand({wname!r})",
        params=params,
    )
    trace = narrow_consumers(workload, trace)[0]  # a recording's consumers wait for their chunks
    skipped = len(colls.rows) - len(placed.xrows)
    log.debug("expanded %d collective nodes of %s into %d ops", len(placed.xrows), wname, len(placed.owner))
    return Expansion(trace=trace, lineage=lineage, collectives=summary, algorithms=used, skipped=skipped)


def _no_progress(phase: str, done: int, total: int) -> None:
    """The progress callback when none is given."""


def _instantiate(
    colls: Collectives,
    chosen: np.ndarray,
    specs: Mapping[str, AlgorithmSpec],
    step: ProgressFn = _no_progress,
) -> tuple[Parts, dict[str, Trace], dict[str, str], np.ndarray]:
    """Prepare one algorithm per (type, group size) of the chosen instances.

    Returns the concatenated parts, every algorithm trace used (by name), the
    algorithm label per Chakra type, and each instance's algorithm index (-1 when
    not chosen). A spec shared by several types is generated or checked once per
    group size.
    """
    prepared: list[Parts] = []
    used: dict[str, Trace] = {}
    alg_of: dict[tuple[str, int], int] = {}
    cache: dict[tuple[int, str, int], int] = {}  # (id(spec) / spec hash, short, n) -> algorithm index
    inst_alg = np.full(colls.ninst, -1, dtype=np.int64)
    inst_type, inst_n = colls.inst_type, colls.gsize[colls.inst_pg]
    todo = np.flatnonzero(chosen).tolist()
    step("algorithms", 0, len(todo))
    for done, i in enumerate(todo):
        if done & 1023 == 0 and done:
            step("algorithms", done, len(todo))
        t, n = str(inst_type[i]), int(inst_n[i])
        k = (t, n)
        if k not in alg_of:
            spec = specs[t]
            ck = (hash(spec) if isinstance(spec, str) else id(spec), COLLECTIVE_NAMES[t], n)
            if ck not in cache:
                alg = _algorithm(spec, t, n, colls.workload, colls.describe(i))
                cache[ck] = len(prepared)
                prepared.append(prepare(alg, alg.name))
                used[alg.name] = alg
            alg_of[k] = cache[ck]
        inst_alg[i] = alg_of[k]
    step("algorithms", len(todo), len(todo))
    parts = concat(prepared)
    labels = {t: parts.labels[a] for (t, _), a in sorted(alg_of.items())}
    return parts, used, labels, inst_alg


def _algorithm(spec: AlgorithmSpec, ctype: str, n: int, wname: str, what: str) -> Trace:
    """The algorithm trace for a collective of type ``ctype`` on ``n`` ranks (generated or checked)."""
    short = COLLECTIVE_NAMES[ctype]
    if isinstance(spec, str):
        gen, chunks = parse_generator(spec)
        try:
            return generate(gen, coll=short, ranks=n, chunks=chunks)
        except EtstoreError as exc:
            raise ExpansionError(
                f"trace {wname!r}: cannot generate {spec!r} for {what} on {n} ranks: {exc}"
            ) from exc
    have = int(spec.params.get("ngpus") or 0) or spec.num_ranks
    if have != n:
        raise ExpansionError(
            f"trace {wname!r}: {what} has {n} member ranks but algorithm {spec.name!r} has {have} ranks; "
            "use an algorithm for that group size (or a generator such as 'ring')"
        )
    coll = spec.params.get("collective")
    if coll and str(coll) != short:
        raise ExpansionError(
            f"trace {wname!r}: {what} is {short} but algorithm {spec.name!r} implements {coll}"
        )
    return spec


def _buffer_bytes(colls: Collectives, chosen: np.ndarray, parts: Parts, inst_alg: np.ndarray) -> np.ndarray:
    """Per instance: the buffer its algorithm's chunks divide (bytes, :func:`buffer_bytes`); refuses one
    smaller than the chunks."""
    inst_buf = buffer_bytes(colls.inst_type, colls.size[colls.first_of], colls.gsize[colls.inst_pg])
    small = chosen & (inst_buf < parts.max_chunks[np.clip(inst_alg, 0, None)])
    if small.any():
        i = int(np.argmax(small))
        raise ExpansionError(
            f"trace {colls.workload!r}: {colls.describe(i)} moves "
            f"{int(inst_buf[i])} bytes, fewer than the {int(parts.max_chunks[inst_alg[i]])} chunks of "
            f"algorithm {parts.labels[inst_alg[i]]!r}"
        )
    return inst_buf


def _assign_tags(workload: Trace, chosen: np.ndarray, span: int) -> tuple[int, np.ndarray]:
    """(tag base, first tag of each instance): chosen instance i uses ``base + i·span`` onwards."""
    tags = workload.ops["comm_tag"]
    tag_base = max(int(pc.max(tags).as_py() or 0) + 1, 0) if tags.null_count < workload.ops.num_rows else 0
    inst_ord = np.cumsum(chosen) - 1
    nchosen = int(chosen.sum())
    if tag_base + nchosen * span - 1 > _INT32_MAX:
        raise ExpansionError(
            f"trace {workload.name!r}: {nchosen} collectives × {span} tags from {tag_base} exceed int32 "
            "comm_tag; expand fewer collectives at a time (a narrower where predicate)"
        )
    return tag_base, tag_base + inst_ord * span


_BLOCK_NODE_COLUMNS = ("pg_name", "comm_type", "comm_size", "start_time_micros", "duration_micros")

RECORDING_PARAMS = ("execution", "durations", "profiler_steps", "windows", "device_events", "world_size")
"""What a recording's params say about how it ran (``etstore.formats.pytorch_et``): an expansion
keeps them, so it replays against the same measured steps."""


def _blocks(workload: Trace, placed: Placed) -> dict[str, list[int]]:
    """Where each expanded node's ops went: rank, the node's id, its block's first id and op
    count, and its rank's place in its group (``group_pos`` of ``group_size``).

    A block's ids are contiguous; the simulator lets each block hold its rank's
    communication slot as the node did (docs/expand.md, docs/simulator.md).
    """
    node = workload.ops.take(pa.array(placed.xrows, pa.int64()))
    return {
        "rank": placed.xrank.astype(np.int64).tolist(),
        "parent_id": workload.ops["id"].to_numpy()[placed.xrows].astype(np.int64).tolist(),
        "first_id": placed.xbase.astype(np.int64).tolist(),
        "ops": placed.xm.astype(np.int64).tolist(),
        "group_pos": placed.xpos.astype(np.int64).tolist(),
        "group_size": placed.xgroup.astype(np.int64).tolist(),
        # what the node was, and when it ran if it was recorded (a replay fits a network to it)
        **{k: node[k].to_pylist() for k in _BLOCK_NODE_COLUMNS},
    }


def _summary(
    colls: Collectives, chosen_mask: np.ndarray, placed: Placed, labels: list[str], inst_tag0: np.ndarray
) -> pa.Table:
    """One :data:`EXPANDED_SCHEMA` row per expanded instance."""
    chosen = np.flatnonzero(chosen_mask)
    ninst = colls.ninst
    owner, is_send, size = placed.owner, placed.is_send, placed.size
    new_inst = placed.xinst[owner]
    ops_n = np.bincount(placed.xinst, weights=placed.xm, minlength=ninst)
    sends = np.bincount(new_inst[is_send], minlength=ninst)
    sent = np.zeros(ninst, dtype=np.int64)
    np.add.at(sent, new_inst[is_send], size[is_send].astype(np.int64))
    inst_pg = colls.inst_pg
    return pa.Table.from_arrays(
        [
            pa.array(colls.inst_seq[chosen]),
            pa.array([colls.pg_names[g] for g in inst_pg[chosen].tolist()], pa.string()),
            pa.array([str(t) for t in colls.inst_type[chosen]], pa.string()),
            pa.array(colls.size[colls.first_of][chosen].astype(np.int64)),
            pa.array(colls.gsize[inst_pg][chosen].astype(np.int32)),
            pa.array([labels[i] for i in chosen.tolist()], pa.string()),
            pa.array(ops_n[chosen].astype(np.int64)),
            pa.array(sends[chosen].astype(np.int64)),
            pa.array(sent[chosen]),
            pa.array(inst_tag0[chosen].astype(np.int32)),
        ],
        schema=EXPANDED_SCHEMA,
    )
