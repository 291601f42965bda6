"""Several jobs on one fabric: each trace's ranks placed on NPUs of one topology, sharing its links.

A job's time on a shared cluster depends on its neighbours: under the congestion-aware
model their messages queue on the links both route over. The simulator replays one trace
whose rank ``r`` is NPU ``r``, so several jobs become one *combined* workload
(:func:`combine`): each job's ranks renumbered to the NPUs a placement names, its
point-to-point peers mapped the same way, and each of its communicator groups given a
number of its own (so one job's all-reduce never matches another's), members mapped in
their order. The existing simulator replays that workload; :func:`split` takes each job's
ops, ranks and collectives back out under the job's own rank numbers and group names.

A placement is one ``{job rank: NPU}`` per job; by default the jobs take consecutive NPUs
in the order given (:func:`consecutive`). ASTRA-sim's multi-tenant tooling writes it as
JSON keyed ``"J<job>-<rank>"`` (``{"J0-0": 0, "J0-1": 1, "J1-0": 2}``; job ``J<i>`` is the
i-th trace given), which :func:`read_placement` and :func:`placement_from_keys` read.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.errors import ConfigError
from etstore.model import Trace
from etstore.progress import ProgressFn
from etstore.sim._algorithms import AlgorithmSpec, group_members
from etstore.sim._holds import recorded_blocks
from etstore.sim.config import SimConfig
from etstore.sim.engine import RECORDED, simulate
from etstore.sim.result import LINKS_SCHEMA, OVERLOAD_SCHEMA, SimResult
from etstore.topology import Topology

__all__ = [
    "Combined",
    "Job",
    "JobRuns",
    "JobsResult",
    "combine",
    "consecutive",
    "job_tables",
    "placement_from_keys",
    "read_placement",
    "simulate_jobs",
    "split",
]

Placement = list[dict[int, int]]
"""Per job, ``{job rank: NPU}``."""

_KEY = re.compile(r"J(\d+)-(\d+)")


@dataclass(frozen=True)
class Job:
    """One job of a combined workload: where its ranks run and what its groups became."""

    label: str  # "J0": the i-th trace given, as ASTRA-sim's multi-tenant placements name it
    trace_name: str
    npu: dict[int, int]  # job rank -> NPU
    groups: dict[str, str]  # pg_name in the combined trace -> the job's own pg_name ("" when absent)

    def placement(self) -> dict[str, int]:
        """This job's ranks in ASTRA-sim's multi-tenant form, ``{"J0-0": 0, ...}``."""
        return _keys([self])


@dataclass(frozen=True)
class Combined:
    """The combined workload (rank = NPU, ``params["comm_groups"]`` every job's groups) and its jobs."""

    trace: Trace
    jobs: tuple[Job, ...]

    def placement(self) -> dict[str, int]:
        """The placement in ASTRA-sim's multi-tenant form, ``{"J0-0": 0, ...}``."""
        return _keys(self.jobs)


@dataclass(frozen=True, eq=False)
class JobsResult:
    """What :func:`simulate_jobs` produced: the joint replay and each job's part of it."""

    joint: SimResult
    jobs: tuple[SimResult, ...]
    combined: Combined


@dataclass(frozen=True)
class JobRuns:
    """Run ids :func:`etstore.app.runs.record_jobs` gave: the joint run's and one per job, in job order."""

    joint: int
    jobs: tuple[int, ...]


def consecutive(ranks: Sequence[Sequence[int]]) -> Placement:
    """Each job's ranks, ascending, on the next free NPUs in job order.

    >>> consecutive([[0, 1], [0, 1, 2]])
    [{0: 0, 1: 1}, {0: 2, 1: 3, 2: 4}]
    """
    out: Placement = []
    nxt = 0
    for job in ranks:
        out.append({r: nxt + i for i, r in enumerate(sorted(job))})
        nxt += len(job)
    return out


def _label(i: int, names: Sequence[str] | None) -> str:
    return f"J{i}" + (f" ({names[i]!r})" if names else "")


def placement_from_keys(
    keys: Mapping[str, Any],
    ranks: Sequence[Sequence[int]],
    num_npus: int,
    names: Sequence[str] | None = None,
) -> Placement:
    """A placement from ``{"J<job>-<rank>": NPU}``, checked against the jobs' ranks and the NPUs.

    >>> placement_from_keys({"J0-0": 3, "J0-1": 2, "J1-0": 0}, [[0, 1], [0]], 4)
    [{0: 3, 1: 2}, {0: 0}]
    >>> placement_from_keys({"J1-0": 0}, [[0]], 4)
    Traceback (most recent call last):
    etstore.errors.ConfigError: placement: J1-0 names job J1, but 1 job was given (J0)

    Raises
    ------
    ConfigError
        One line: a key not ``J<job>-<rank>``, an unknown job or rank, an NPU that is not a
        whole number or is outside ``0..num_npus-1``, two ranks on one NPU, a rank missing.
    """
    out: Placement = [{} for _ in ranks]
    given = ", ".join(f"J{i}" for i in range(len(ranks)))
    for key, npu in keys.items():
        m = _KEY.fullmatch(str(key))
        if m is None:
            raise ConfigError(f"placement: key {key!r} is not J<job>-<rank> (e.g. J0-0)")
        job, rank = int(m[1]), int(m[2])
        if job >= len(ranks):
            count = "1 job was" if len(ranks) == 1 else f"{len(ranks)} jobs were"
            raise ConfigError(f"placement: {key} names job J{job}, but {count} given ({given})")
        if rank not in ranks[job]:
            raise ConfigError(
                f"placement: {key} names rank {rank} of {_label(job, names)}, which has ranks "
                f"{_span(ranks[job])}"
            )
        if rank in out[job]:
            raise ConfigError(f"placement: J{job}-{rank} is given twice")
        if isinstance(npu, bool) or not isinstance(npu, int):
            raise ConfigError(f"placement: {key} is {npu!r}, not an NPU number")
        out[job][rank] = npu
    _check(out, ranks, num_npus, names)
    return out


def _span(ranks: Sequence[int]) -> str:
    """``0..3`` for a run of ranks, else the list."""
    r = sorted(ranks)
    return f"{r[0]}..{r[-1]}" if r and r[-1] - r[0] + 1 == len(r) else str(r)


def _check(
    placement: Placement, ranks: Sequence[Sequence[int]], num_npus: int, names: Sequence[str] | None
) -> None:
    """Every rank placed once, on an NPU of the topology, no two on one NPU (one-line errors)."""
    if len(placement) != len(ranks):
        raise ConfigError(f"placement: {len(placement)} jobs placed, {len(ranks)} given")
    taken: dict[int, str] = {}
    for j, (where, have) in enumerate(zip(placement, ranks, strict=True)):
        for r, npu in sorted(where.items()):
            if r not in have:
                raise ConfigError(
                    f"placement: J{j}-{r} names rank {r} of {_label(j, names)}, which has ranks {_span(have)}"
                )
            if not 0 <= npu < num_npus:
                raise ConfigError(
                    f"placement: J{j}-{r} is on NPU {npu}, outside the topology's NPUs 0..{num_npus - 1}"
                )
            if npu in taken:
                raise ConfigError(f"placement: {taken[npu]} and J{j}-{r} are both on NPU {npu}")
            taken[npu] = f"J{j}-{r}"
    for j, (where, have) in enumerate(zip(placement, ranks, strict=True)):
        missing = sorted(set(have) - set(where))
        if missing:
            r = missing[0]
            more = f" ({len(missing) - 1} more of its ranks neither)" if len(missing) > 1 else ""
            raise ConfigError(f"placement: J{j}-{r} (rank {r} of {_label(j, names)}) is not placed{more}")


def read_placement(path: str | Path) -> dict[str, int]:
    """A placement file: a JSON object ``{"J<job>-<rank>": NPU}`` (ASTRA-sim's multi-tenant form).

    Raises
    ------
    ConfigError
        The file is missing, not JSON, not an object, or names a key twice; one line naming it.
    """
    path = Path(path)

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for k, v in items:
            if k in seen:
                raise ConfigError(f"{path}: placement key {k!r} is given twice")
            seen[k] = v
        return seen

    try:
        data = json.loads(path.read_text(), object_pairs_hook=pairs)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such placement file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the placement file ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: line {exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise ConfigError(f'{path}: expected an object mapping "J<job>-<rank>" to an NPU, e.g. {{"J0-0": 0}}')
    return data


def _mapped(column: pa.ChunkedArray, lookup: np.ndarray) -> pa.Array:
    """``column`` (ranks, nulls kept) through ``lookup``; values outside it stay as they are."""
    values = pc.fill_null(column, -1).to_numpy().astype(np.int64)
    inside = (values >= 0) & (values < len(lookup))
    out = values.copy()
    out[inside] = np.where(lookup[values[inside]] >= 0, lookup[values[inside]], values[inside])
    return pa.array(out, type=column.type, mask=pc.is_null(column).to_numpy(zero_copy_only=False))


def _place(
    trace: Trace, label: str, where: dict[int, int], renamed: dict[str, str]
) -> tuple[pa.Table, pa.Table, pa.Table, pa.Table]:
    """One job's ops, deps, missing deps and metadata with ranks, peers and group names replaced."""
    lookup = np.full(max(where) + 1, -1, dtype=np.int64)
    lookup[list(where)] = list(where.values())
    ops = trace.ops
    types = ops["type"]
    p2p = pc.is_in(types, value_set=pa.array(["COMM_SEND_NODE", "COMM_RECV_NODE"]))
    for col in ("comm_src", "comm_dst"):
        peer = pc.fill_null(ops[col], -1).to_numpy()
        foreign = p2p.to_numpy(zero_copy_only=False) & pc.is_valid(ops[col]).to_numpy(zero_copy_only=False)
        foreign &= (peer < 0) | (peer >= len(lookup)) | (lookup[np.clip(peer, 0, len(lookup) - 1)] < 0)
        if foreign.any():
            i = int(np.argmax(foreign))
            at = f"rank {ops['rank'][i].as_py()} node {ops['id'][i].as_py()}"
            raise ConfigError(
                f"{label} ({trace.name!r}): {at} names peer {int(peer[i])} ({col}), "
                "which is not a rank of the job"
            )
        ops = ops.set_column(ops.schema.get_field_index(col), col, _mapped(ops[col], lookup))
    if renamed:  # every collective's group by its new number; other ops keep theirs
        own = pc.fill_null(ops["pg_name"], "")
        keys = pa.array(list(renamed), pa.string())
        new = pc.take(pa.array(list(renamed.values()), pa.string()), pc.index_in(own, value_set=keys))
        pg = pc.if_else(pc.equal(types, "COMM_COLL_NODE"), new, ops["pg_name"])
        ops = ops.set_column(ops.schema.get_field_index("pg_name"), "pg_name", pg)
    tables = [
        t.set_column(t.schema.get_field_index("rank"), "rank", _mapped(t["rank"], lookup))
        for t in (ops, trace.deps, trace.missing, trace.meta)
    ]
    return tables[0], tables[1], tables[2], tables[3]


def combine(
    traces: Sequence[Trace],
    placement: Placement | Mapping[str, Any] | None = None,
    *,
    num_npus: int | None = None,
    groups: Sequence[Mapping[str, Sequence[int]] | None] | None = None,
) -> Combined:
    """The jobs as one workload whose rank ``r`` is NPU ``r``.

    Parameters
    ----------
    traces
        The jobs, ``J0``, ``J1``, ... in this order (one trace may be given twice).
    placement
        Per job ``{job rank: NPU}``, or ``{"J<job>-<rank>": NPU}``; default :func:`consecutive`.
    num_npus
        The topology's NPU count, which a placement must stay inside (default: as many as used).
    groups
        Per job, communicator groups replacing its own (``sim --comm-groups``), or None.

    Returns
    -------
    Combined
        Each job's ranks, deps and peers renumbered; each group it names (every rank of the
        job when unnamed) numbered ``1, 2, ...`` across jobs, in ``params["comm_groups"]``.

    Raises
    ------
    ConfigError
        A bad placement, a job without ops, a send or receive whose peer the job lacks, or
        jobs that mix a recorded trace with a replayed one.

    Notes
    -----
    O(V + E) Arrow work over the jobs' ops and deps.
    """
    if not traces:
        raise ConfigError("jobs: give at least one trace")
    names = [t.name for t in traces]
    ranks = [t.ranks for t in traces]
    for i, r in enumerate(ranks):
        if not r:
            raise ConfigError(f"jobs: {_label(i, names)} has no ops")
    if placement is None:
        where = consecutive(ranks)
        need = sum(len(r) for r in ranks)
        if num_npus is not None and need > num_npus:
            counts = ", ".join(f"J{i}: {len(r)}" for i, r in enumerate(ranks))
            raise ConfigError(
                f"placement: the jobs need {need} NPUs ({counts}) but the topology has {num_npus}"
            )
    elif isinstance(placement, Mapping):
        where = placement_from_keys(placement, ranks, num_npus if num_npus is not None else 1 << 31, names)
    else:
        where = [dict(p) for p in placement]
        _check(where, ranks, num_npus if num_npus is not None else 1 << 31, names)
    if groups is not None and len(groups) != len(traces):
        raise ConfigError(f"jobs: {len(groups)} communicator group sets for {len(traces)} jobs")
    executions = {t.params.get("execution") for t in traces}
    if len(executions) > 1:
        raise ConfigError(
            "jobs: recorded traces (replayed as they ran) cannot share a fabric with other traces"
        )
    jobs: list[Job] = []
    parts: list[tuple[pa.Table, ...]] = []
    comm_groups: dict[str, list[int]] = {}
    blocks: dict[str, list[int]] = {"rank": [], "parent_id": [], "first_id": [], "ops": []}
    for i, trace in enumerate(traces):
        members = group_members(trace, groups[i] if groups is not None else None)
        renamed: dict[str, str] = {}
        for own in sorted(members):
            renamed[own] = str(len(comm_groups) + 1)
            comm_groups[renamed[own]] = [where[i][r] for r in members[own]]
        parts.append(_place(trace, f"J{i}", where[i], renamed))
        jobs.append(Job(f"J{i}", trace.name, where[i], {v: k for k, v in renamed.items()}))
        found = recorded_blocks(trace.params or {})[0]
        if found is not None:  # an expanded job's collective blocks, on the NPUs its ranks went to
            blocks["rank"] += [where[i].get(int(r), int(r)) for r in found["rank"]]
            for k in ("parent_id", "first_id", "ops"):
                blocks[k] += [int(v) for v in found[k]]
    out_jobs = tuple(jobs)
    params: dict[str, Any] = {
        "comm_groups": comm_groups,
        "jobs": {"traces": names, "placement": _keys(out_jobs)},
    }
    if RECORDED in executions:
        params["execution"] = RECORDED
    if blocks["rank"]:
        params["collective_blocks"] = blocks
    trace = Trace(
        ops=pa.concat_tables([p[0] for p in parts]),
        deps=pa.concat_tables([p[1] for p in parts]),
        missing=pa.concat_tables([p[2] for p in parts]),
        meta=pa.concat_tables([p[3] for p in parts]),
        name="+".join(names),
        kind=traces[0].kind if len({t.kind for t in traces}) == 1 else "workload",
        source=" ".join(t.source for t in traces if t.source),
        params=params,
    )
    return Combined(trace, out_jobs)


def _keys(jobs: Sequence[Job]) -> dict[str, int]:
    """A placement in ASTRA-sim's multi-tenant form."""
    return {f"{j.label}-{r}": n for j in jobs for r, n in sorted(j.npu.items())}


def _restrict(table: pa.Table, back: np.ndarray) -> pa.Table:
    """The rows of ``table`` whose ``rank`` (an NPU) ``back`` maps to a job rank, renumbered, by rank."""
    npu = table["rank"].to_numpy().astype(np.int64)
    rank = back[npu]
    rows = np.flatnonzero(rank >= 0)
    rows = rows[np.argsort(rank[rows], kind="stable")]
    out = table.take(pa.array(rows))
    return out.set_column(0, "rank", pa.array(rank[rows].astype(np.int32)))


def split(result: SimResult, combined: Combined) -> tuple[SimResult, ...]:
    """Each job's part of the joint replay, under its own rank numbers and group names.

    A job's ``ops``, ``ranks`` and ``collectives`` are the joint tables' rows of its NPUs and
    groups; ``total_ns`` is its last rank's finish (the job completion time). ``links`` and
    ``overloaded`` are empty: links are shared, they stay with the joint result, as do
    ``events``, ``sim_ops`` and the wall times (each job's result repeats the joint's).

    Notes
    -----
    O(V log V) over the joint result's op rows, once per job.
    """
    size = max([result.num_npus, *(n + 1 for j in combined.jobs for n in j.npu.values())])
    out = []
    for job in combined.jobs:
        back = np.full(size, -1, dtype=np.int64)
        back[list(job.npu.values())] = list(job.npu)
        ranks = _restrict(result.ranks, back)
        colls = result.collectives
        keep = pc.is_in(colls["pg_name"], value_set=pa.array(list(job.groups), pa.string()))
        colls = colls.filter(keep)
        own = [job.groups[g] for g in colls["pg_name"].to_pylist()]
        colls = colls.set_column(
            colls.schema.get_field_index("pg_name"), "pg_name", pa.array(own, pa.string())
        )
        total = pc.max(ranks["total_ns"]).as_py() if ranks.num_rows else 0.0
        out.append(
            dataclasses.replace(
                result,
                ops=_restrict(result.ops, back),
                ranks=ranks,
                collectives=colls,
                links=LINKS_SCHEMA.empty_table(),
                overloaded=OVERLOAD_SCHEMA.empty_table(),
                total_ns=float(total or 0.0),
                trace_name=job.trace_name,
            )
        )
    return tuple(out)


def simulate_jobs(
    traces: Sequence[Trace],
    topo: Topology,
    *,
    placement: Placement | Mapping[str, Any] | None = None,
    config: SimConfig | None = None,
    algorithms: Mapping[str, AlgorithmSpec] | None = None,
    groups: Sequence[Mapping[str, Sequence[int]] | None] | None = None,
    dims: Sequence[int] | None = None,
    progress: ProgressFn | None = None,
) -> JobsResult:
    """Replay several jobs together on ``topo``: :func:`combine`, then simulate, then :func:`split`.

    Parameters are :func:`combine`'s and :func:`~etstore.sim.simulate`'s. Two jobs simulated
    together equal their combined trace simulated alone, to the ns, under either network
    model; under the congestion-unaware one a job's times never depend on its neighbours.

    Raises
    ------
    ConfigError
        A bad placement (one line), or what :func:`combine` refuses.
    SimulationError
        What :func:`~etstore.sim.simulate` raises for the combined workload.

    Examples
    --------
    >>> from etstore.testing import p2p_trace
    >>> two = simulate_jobs([p2p_trace(1 << 20), p2p_trace(1 << 20)], Topology.from_spec("ring:4"))
    >>> two.combined.trace.params["jobs"]["placement"]
    {'J0-0': 0, 'J0-1': 1, 'J1-0': 2, 'J1-1': 3}
    >>> [job.total_ns for job in two.jobs] == [two.joint.total_ns] * 2
    True
    """
    combined = combine(traces, placement, num_npus=topo.num_npus, groups=groups)
    joint = simulate(combined.trace, topo, config=config, algorithms=algorithms, dims=dims, progress=progress)
    return JobsResult(joint, split(joint, combined), combined)


def job_tables(result: JobsResult, runs: JobRuns | None = None) -> dict[str, pa.Table]:
    """What ``etstore sim A B`` prints: ``summary`` (the joint run, then a row per job),
    ``ranks`` and ``collectives`` (each row with its job; ranks with their NPU).
    """
    rows = []
    for i, res in enumerate((result.joint, *result.jobs)):
        job = result.combined.jobs[i - 1] if i else None
        run_id = None if runs is None else (runs.jobs[i - 1] if i else runs.joint)
        summary = res.summary()
        if job is not None:  # the joint replay's counts, not the job's own
            for k in ("sim_ops", "events", "wall_s", "events_per_s"):
                summary.pop(k, None)
        rows.append({"job": job.label if job else "all", "run_id": run_id, **summary})
    columns = list(dict.fromkeys(k for r in rows for k in r))
    summary_table = pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in rows])
    ranks, colls = [], []
    for job, res in zip(result.combined.jobs, result.jobs, strict=True):
        n = res.ranks.num_rows
        npus = [job.npu[r] for r in res.ranks["rank"].to_pylist()]
        ranks.append(
            res.ranks.add_column(0, "job", pa.array([job.label] * n, pa.string())).add_column(
                2, "npu", pa.array(npus, pa.int32())
            )
        )
        m = res.collectives.num_rows
        colls.append(res.collectives.add_column(0, "job", pa.array([job.label] * m, pa.string())))
    return {
        "summary": summary_table,
        "ranks": pa.concat_tables(ranks),
        "collectives": pa.concat_tables(colls),
    }
