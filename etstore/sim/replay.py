"""Replay a recorded step as it ran, and set each rank's simulated step beside the measured one.

A recorded trace (PyTorch ET + Kineto, ``params["execution"] == "recorded"``) carries its
measured compute: CPU ops with their own work (time blocked in a synchronizing call is a
dependency on the device work it waited for, not a duration), GPU activities on their
streams, each after its launch and the waits it was held by. A collective's recorded time
is mostly waiting for its peers, which the replay models by the collective itself:

* each rank enters the step when it did in the recording (its ``ProfilerStep#`` start,
  else its first op): one op per rank, ``etstore::enter_step``, lasts from the earliest
  rank's entry to its own, and every op of the rank without a dependency waits for it;
* each collective instance (the k-th collective of a process group on every member) has a
  *transfer* part, measured as the median end of its members less the latest start, when
  every peer had arrived;
* the network, one of three (``Replay.network``):

  - ``recorded`` (the default): the step as it ran. Every collective waits for all its
    members (it runs on a network that takes no time) and then, on each member, lasts
    until that member's recorded end (an ``etstore::transfer`` op after it of the time
    from the last arrival to its end);
    point-to-point ops take their recorded time. What remains of the error is the
    execution model's.
  - ``fitted``: a one-switch network (``switch:N``) with the link latency and bandwidth
    that best give the measured transfer parts (non-negative least squares on the relative
    error; the simulated time of a collective is affine in latency and in 1/bandwidth).
    What it adds to the error is the network model's: one time per collective and size,
    where the recording may vary (gloo on a shared CPU, by ×40).
  - a given topology, for what-ifs.

  An *expanded* recording (``etstore expand`` of one) has no recorded time for its
  algorithms' sends and receives: it replays on the ``fitted`` network by default, fitted
  to the recorded collectives its expansion replaced (``params["collective_blocks"]``
  keeps each one's measured start and time), and each such collective's simulated time
  runs from its block's first start to its last end on that rank.

  Collectives run ASTRA-sim's native algorithms; a broadcast, which has none, runs the
  ``ring`` generator's chain from the group's first rank (:data:`ALGORITHMS`).

The measured step of a rank runs from its entry to the end of the last of its ops (CPU or
GPU) in the recording; the simulated one from the same entry to the same ops' simulated
end. Ops are the ones the recording has on both sides, so the two are comparable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.errors import OptionError
from etstore.model import Trace, deps_table, op_rows
from etstore.sim._holds import collective_holds, recorded_blocks
from etstore.sim._lsq import nonneg_lstsq
from etstore.sim.config import SimConfig
from etstore.sim.engine import RECORDED, simulate
from etstore.sim.perturb import Perturbation, perturb
from etstore.sim.result import SimResult
from etstore.sim.sweep import collective_workload
from etstore.topology import Topology

__all__ = [
    "ALGORITHMS",
    "ENTRY_NAME",
    "TRANSFER_NAME",
    "Replay",
    "collective_transfers",
    "fit_network",
    "replay",
]

ENTRY_NAME = "etstore::enter_step"
TRANSFER_NAME = "etstore::transfer"
_FREE = "bw=1e+06,lat=0"  # the network of a ``recorded`` replay: it takes (next to) no time
ALGORITHMS: Mapping[str, str] = {"BROADCAST": "ring"}
"""Collectives whose default algorithm (:meth:`SimConfig.impl_for`) would replay their recorded
time, and what a replay runs instead: a broadcast's recorded time includes waiting for the root."""
_BASE_LAT_NS, _BASE_BW = 500.0, 50.0  # the point the affine model is taken at


@dataclass(frozen=True)
class Replay:
    """A replayed recording: per-rank steps, per-collective rows, the network used, the run."""

    steps: pa.Table  # rank, step, measured_us, simulated_us, error_pct
    collectives: pa.Table  # per rank and instance: measured, transfer and simulated times
    network: str  # "recorded", "fitted" or "given"
    topology: Topology  # for "recorded", the free network the collectives synchronise on
    result: SimResult

    def to_params(self) -> dict[str, Any]:
        """What a recorded run of this replay keeps (``runs.params``, under ``"replay"``): the
        network, and each rank's steps measured beside simulated."""
        return {
            "network": self.network,
            "topology": self.topology.name,
            "label": self.label,
            "steps": self.steps.to_pylist(),
        }

    @property
    def label(self) -> str:
        """How the network is named to a reader."""
        if self.network == "recorded":
            return "its recorded collectives"
        return (
            f"{self.topology.name} ({'fitted to its collectives' if self.network == 'fitted' else 'given'})"
        )


class _Entry(NamedTuple):
    """A rank's recorded step: where it entered, its ``ProfilerStep#N`` starts, its last end (µs)."""

    at: int
    steps: list[tuple[str, int]]
    last: int


def _rank_entries(trace: Trace) -> dict[int, _Entry]:
    """Each rank enters at its first ``ProfilerStep#``, else at its first op (``params["windows"]``)."""
    profiler: Mapping[str, Any] = trace.params.get("profiler_steps") or {}
    windows: Mapping[str, Any] = trace.params.get("windows") or {}
    out: dict[int, _Entry] = {}
    for r in trace.ranks:
        first, last = windows.get(str(r)) or (0, 0)
        steps = [(str(name), int(start)) for name, start, _ in profiler.get(str(r)) or []]
        at = steps[0][1] if steps else int(first)
        out[r] = _Entry(at, steps or [("window", at)], int(last))
    return out


def _with_entries(trace: Trace, entries: Mapping[int, _Entry]) -> Trace:
    """The trace with one entry op per rank (see the module's note)."""
    deps = trace.deps
    t0 = min(e.at for e in entries.values())
    rank = trace.ops["rank"].to_numpy()
    has_dep = set(zip(deps["rank"].to_numpy().tolist(), deps["dst"].to_numpy().tolist(), strict=True))
    ids = trace.ops["id"].to_numpy().astype(np.uint64)
    rows: list[dict[str, Any]] = []
    e_src, e_dst, e_rank = [], [], []
    for r, entry in sorted(entries.items()):
        mine = ids[rank == r]
        rows.append(
            dict(rank=r, name=ENTRY_NAME, duration_micros=entry.at - t0, start_time_micros=t0, is_cpu_op=True)
        )
        roots = [int(i) for i in mine.tolist() if (r, int(i)) not in has_dep]
        e_src += [-len(rows)] * len(roots)
        e_dst += roots
        e_rank += [r] * len(roots)
    return _append(trace, rows, e_rank, e_src, e_dst)[0]


def _append(
    trace: Trace, rows: list[dict[str, Any]], e_rank: list[int], e_src: list[int], e_dst: list[int]
) -> tuple[Trace, list[int]]:
    """``trace`` with compute ops ``rows`` (ids after each rank's largest, in order) and ctrl
    edges (an end ``-(k + 1)`` is the k-th new op), and the new ops' ids."""
    ops, deps = trace.ops, trace.deps
    rank = ops["rank"].to_numpy()
    ids = ops["id"].to_numpy().astype(np.uint64)
    next_id = {int(r): int(ids[rank == r].max()) + 1 for r in np.unique(rank).tolist()}
    new_ids = []
    cols: dict[str, list[Any]] = {f.name: [] for f in ops.schema}
    for row in rows:
        r = int(row["rank"])
        new_ids.append(next_id[r])
        next_id[r] += 1
        full = dict.fromkeys(cols)
        full.update(type="COMP_NODE", **row, id=new_ids[-1])
        for k, v in full.items():
            cols[k].append(v)
    src = [new_ids[-s - 1] if s < 0 else s for s in e_src]
    dst = [new_ids[-d - 1] if d < 0 else d for d in e_dst]
    extra = pa.Table.from_pydict(cols, schema=ops.schema)
    new_deps = deps_table(np.asarray(e_rank, dtype=np.int32), src, dst, "ctrl")
    out = trace.replace(
        ops=pa.concat_tables([ops, extra]), deps=pa.concat_tables([deps, new_deps.cast(deps.schema)])
    )
    return out, new_ids


def _with_transfers(trace: Trace, transfers: pa.Table) -> tuple[Trace, np.ndarray]:
    """The trace with each collective followed by its instance's measured transfer part and each
    recorded point-to-point op by its recorded time (what depended on the op depends on that
    time), and the transfer op of each row of ``transfers``. An expansion's sends and receives
    were never recorded: they get none."""
    ops, deps = trace.ops, trace.deps
    after: dict[tuple[int, int], float] = {
        (int(r), int(i)): float(t)
        for r, i, t in zip(
            *(transfers[k].to_pylist() for k in ("rank", "id", "own_transfer_us")), strict=True
        )
    }
    p2p = np.isin(ops["type"].to_numpy(zero_copy_only=False), ["COMM_SEND_NODE", "COMM_RECV_NODE"])
    holds = collective_holds(trace, ops["rank"].to_numpy(), ops["id"].to_numpy().astype(np.uint64))
    if holds is not None:
        p2p &= holds.member < 0
    for r, i, d in zip(
        ops["rank"].to_numpy()[p2p].tolist(),
        ops["id"].to_numpy()[p2p].tolist(),
        ops["duration_micros"].to_numpy(zero_copy_only=False)[p2p].tolist(),
        strict=True,
    ):
        after[(int(r), int(i))] = float(d)
    if not after:
        return trace, np.zeros(0, dtype=np.uint64)
    keys = list(after)
    rows = [
        dict(rank=r, name=TRANSFER_NAME, duration_micros=round(after[(r, i)]), is_cpu_op=False)
        for r, i in keys
    ]
    k_rank = np.asarray([r for r, _ in keys], dtype=np.int64)
    k_id = np.asarray([i for _, i in keys], dtype=np.uint64)
    order = np.lexsort((k_id, k_rank))
    sorted_keys = np.rec.fromarrays([k_rank[order], k_id[order]])
    d_rank, d_src = deps["rank"].to_numpy().astype(np.int64), deps["src"].to_numpy().astype(np.uint64)
    at = np.minimum(np.searchsorted(sorted_keys, np.rec.fromarrays([d_rank, d_src])), len(keys) - 1)
    moved = (k_rank[order][at] == d_rank) & (k_id[order][at] == d_src)
    # the op's dependents wait for its transfer part (new op k is -(k + 1)) instead
    e_rank = [*d_rank[moved].tolist(), *k_rank.tolist()]
    e_src = [*(-(order[at[moved]] + 1)).tolist(), *k_id.astype(np.int64).tolist()]
    e_dst = [
        *deps["dst"].to_numpy()[moved].astype(np.int64).tolist(),
        *(-(np.arange(len(keys)) + 1)).tolist(),
    ]
    trace = trace.replace(deps=deps.filter(pa.array(~moved)))
    out, ids = _append(trace, rows, e_rank, e_src, e_dst)
    return out, np.asarray(ids[: transfers.num_rows], dtype=np.uint64)  # collectives come first in keys


def collective_transfers(trace: Trace) -> pa.Table:
    """Per collective kernel: its instance, measured time and the instance's transfer part (µs).

    The k-th ``COMM_COLL_NODE`` of a process group on each rank is instance k (the
    simulator pairs them the same way). The transfer part is the median end of the
    instance's kernels less their latest start: the time after the last peer arrived;
    ``own_transfer_us`` is each member's own end less that start (what a ``recorded``
    replay gives it: members do not finish together, a gloo worker that lost its core
    finishes late). ``expanded`` marks the nodes an expansion replaced (their rows come
    from ``params["collective_blocks"]``, ``id`` the replaced node's).
    """
    ops = trace.ops
    is_coll = np.asarray([t == "COMM_COLL_NODE" for t in ops["type"].to_pylist()], dtype=bool)
    kept = ops.take(pa.array(np.flatnonzero(is_coll), pa.int64()))
    cols = {
        "rank": kept["rank"].to_numpy().astype(np.int64),
        "id": kept["id"].to_numpy().astype(np.int64),
        "pg": [p or "" for p in kept["pg_name"].to_pylist()],
        "type": kept["comm_type"].to_pylist(),
        "size": kept["comm_size"].to_pylist(),
        "start": kept["start_time_micros"].to_numpy(zero_copy_only=False).astype(np.int64),
        "dur": kept["duration_micros"].to_numpy(zero_copy_only=False).astype(np.int64),
    }
    replaced = _replaced(trace)
    expanded = np.r_[np.zeros(kept.num_rows, dtype=bool), np.ones(len(replaced["rank"]), dtype=bool)]
    for col, v in replaced.items():
        cols[col] = np.r_[cols[col], v] if isinstance(cols[col], np.ndarray) else [*cols[col], *v]
    rank, ids, pg, start, dur = cols["rank"], cols["id"], cols["pg"], cols["start"], cols["dur"]
    n = len(rank)
    seq = np.zeros(n, dtype=np.int64)
    count: dict[tuple[int, str], int] = {}
    for i in np.lexsort((ids, rank)).tolist():
        key = (int(rank[i]), pg[i])
        seq[i] = count.get(key, 0)
        count[key] = seq[i] + 1
    transfer = np.zeros(n, dtype=np.float64)
    own = np.zeros(n, dtype=np.float64)
    for group, k in {(p, int(s)) for p, s in zip(pg, seq.tolist(), strict=True)}:
        members = np.flatnonzero((np.asarray(pg, dtype=object) == group) & (seq == k))
        ends = start[members] + dur[members]
        last = float(start[members].max())
        transfer[members] = max(1.0, float(np.median(ends)) - last)
        own[members] = np.maximum(ends - last, 0.0)
    return pa.table(
        {
            "rank": pa.array(rank, pa.int32()),
            "id": pa.array(ids.astype(np.uint64)),
            "pg_name": pa.array(pg, pa.string()),
            "seq": seq,
            "comm_type": pa.array(cols["type"], pa.string()),
            "size_bytes": pa.array(cols["size"], pa.int64()),
            "measured_us": dur.astype(np.float64),
            "transfer_us": transfer,
            "own_transfer_us": own,
            "expanded": expanded,
        }
    )


def _replaced(trace: Trace) -> dict[str, Any]:
    """The recorded collective nodes an expansion replaced, as columns (empty when it recorded
    none): rank, id, pg, type, size, start and dur of each, from ``params["collective_blocks"]``."""
    found = recorded_blocks(trace.params or {})[0] or {}
    need = ("rank", "parent_id", "pg_name", "comm_type", "comm_size", "start_time_micros", "duration_micros")
    if any(not isinstance(found.get(k), list) for k in need) or not found["rank"]:
        empty = np.zeros(0, dtype=np.int64)
        return {"rank": empty, "id": empty, "pg": [], "type": [], "size": [], "start": empty, "dur": empty}
    return {
        "rank": np.asarray(found["rank"], dtype=np.int64),
        "id": np.asarray(found["parent_id"], dtype=np.int64),
        "pg": [p or "" for p in found["pg_name"]],
        "type": list(found["comm_type"]),
        "size": list(found["comm_size"]),
        "start": np.asarray([x or 0 for x in found["start_time_micros"]], dtype=np.int64),
        "dur": np.asarray([x or 0 for x in found["duration_micros"]], dtype=np.int64),
    }


def fit_network(
    transfers: pa.Table,
    num_npus: int,
    config: SimConfig | None = None,
    algorithms: Mapping[str, str] = ALGORITHMS,
) -> Topology:
    """``switch:N`` with the latency and bandwidth that best give the measured transfer parts.

    One simulation per distinct collective (type, size) at a base point and one per
    parameter give each time as ``c + a·latency + b/bandwidth``; the relative errors are
    then minimised over latency ≥ 0 and 1/bandwidth ≥ 0.
    """
    cfg = (config or SimConfig()).replace(integer_ns=False)
    measured: dict[tuple[str, int], list[float]] = {}
    for c, size, t in zip(
        *(transfers[k].to_pylist() for k in ("comm_type", "size_bytes", "transfer_us")), strict=True
    ):
        if c and size:
            measured.setdefault((str(c), int(size)), []).append(float(t))
    keys = sorted(measured)
    if not keys:
        return Topology.from_spec(f"switch:{num_npus},bw={_BASE_BW:g},lat={_BASE_LAT_NS:g}")

    def times(lat: float, bw: float) -> np.ndarray:
        topo = Topology.from_spec(f"switch:{num_npus},bw={bw!r},lat={lat!r}")
        return np.asarray(
            [
                simulate(
                    collective_workload(c, num_npus, s if c != "ALL_GATHER" else s * num_npus),
                    topo,
                    config=cfg,
                    algorithms=algorithms,
                ).total_ns
                / 1e3
                for c, s in keys
            ]
        )

    base = times(_BASE_LAT_NS, _BASE_BW)
    a = (times(2 * _BASE_LAT_NS, _BASE_BW) - base) / _BASE_LAT_NS  # µs per ns of latency
    b = (times(_BASE_LAT_NS, _BASE_BW / 2) - base) * _BASE_BW  # µs per (1 / GB/s)
    c = base - a * _BASE_LAT_NS - b / _BASE_BW
    m = np.asarray([float(np.median(measured[k])) for k in keys])
    x = nonneg_lstsq(np.stack([a / m, b / m], axis=1), 1.0 - c / m)
    lat = float(x[0])
    bw = 1.0 / float(x[1]) if x[1] > 1e-12 else 1e6
    return Topology.from_spec(f"switch:{num_npus},bw={bw:.6g},lat={lat:.6g}")


def replay(
    trace: Trace,
    topo: Topology | None = None,
    *,
    fit: bool = False,
    config: SimConfig | None = None,
    perturbation: Perturbation | None = None,
) -> Replay:
    """Replay ``trace`` (recorded) as it ran, on a network fitted to its collectives, or on ``topo``;
    with ``perturbation``, its compute changed (stragglers, jitter, :mod:`etstore.sim.perturb`)
    while the measured side stays the recording's.

    Raises
    ------
    OptionError
        The trace carries no recorded timings (an execution trace without Kineto, a
        Chakra or synthetic trace): there is nothing measured to replay.
    """
    if trace.params.get("durations") == "et+":
        raise OptionError(
            f"trace {trace.name!r} is an ET+ (Chakra's trace linker output): it has Kineto's times "
            "but not the runtime calls and threads a replay reads; replay the execution trace with "
            "its Kineto trace"
        )
    if trace.params.get("execution") != RECORDED:
        raise OptionError(
            f"trace {trace.name!r} was not recorded with timings (a PyTorch execution trace linked with its "
            "Kineto trace): nothing measured to replay; 'etstore sim' simulates it"
        )
    entries = _rank_entries(trace)
    npus = max(2, max(entries) + 1)
    transfers = collective_transfers(trace)
    played = perturb(trace, perturbation) if perturbation is not None else trace
    work, transfer_ids = played, None
    # an expansion's messages were never recorded: only a network can time them
    expanded = bool(pc.any(transfers["expanded"]).as_py())
    if topo is not None:
        network, net = "given", topo
    elif (fit or expanded) and len(entries) > 1:  # one rank has no network to fit: it replays as recorded
        network, net = "fitted", fit_network(transfers, npus, config)
    else:
        network, net = "recorded", Topology.from_spec(f"switch:{npus},{_FREE}")
        work, transfer_ids = _with_transfers(played, transfers.filter(pc.invert(transfers["expanded"])))
    res = simulate(_with_entries(work, entries), net, config=config, algorithms=ALGORITHMS)
    steps = _steps(trace, played, res, entries)
    return Replay(steps, _collective_rows(trace, transfers, res, transfer_ids), network, net, res)


def _steps(trace: Trace, played: Trace, res: SimResult, entries: Mapping[int, _Entry]) -> pa.Table:
    """One row per rank and profiler step: the measured step (``trace``) beside the simulated one
    (``played``, the same ops, perhaps perturbed).

    A step starts where the thread left off before the first op that started in it (that op's
    start less its thread time), in the recording and in the replay alike; the first starts at
    the rank's entry, the last ends with the rank's last op.
    """
    ops = trace.ops
    rank = ops["rank"].to_numpy()
    start = ops["start_time_micros"].to_numpy(zero_copy_only=False).astype(np.int64)
    dur = ops["duration_micros"].to_numpy(zero_copy_only=False).astype(np.int64)
    played_dur = played.ops["duration_micros"].to_numpy(zero_copy_only=False).astype(np.int64)
    cpu = pc.fill_null(ops["is_cpu_op"], False).to_numpy(zero_copy_only=False) & (start > 0)
    sim = res.ops
    s_rank = sim["rank"].to_numpy()
    is_entry = sim["name"].to_numpy(zero_copy_only=False) == ENTRY_NAME
    s_end = sim["end_ns"].to_numpy()[
        op_rows(sim, ops["rank"].to_numpy(), ops["id"].to_numpy())
    ]  # the end of each trace row in the replay
    e_rank, e_end = s_rank[is_entry], sim["end_ns"].to_numpy()[is_entry]
    out: dict[str, list[Any]] = {
        "rank": [],
        "step": [],
        "measured_us": [],
        "simulated_us": [],
        "error_pct": [],
    }
    for r, entry in sorted(entries.items()):
        mine = np.flatnonzero((rank == r) & cpu)
        mine = mine[np.argsort(start[mine], kind="stable")]
        rec = [float(entry.at)]
        rep = [float(e_end[e_rank == r].max()) / 1e3]
        for _, at in entry.steps[1:]:
            i = int(np.searchsorted(start[mine], at))
            b = int(mine[min(i, len(mine) - 1)])
            rec.append(float(start[b] - dur[b]))
            rep.append(float(s_end[b]) / 1e3 - float(played_dur[b]))
        rec.append(float(entry.last))
        rep.append(float(s_end[rank == r].max()) / 1e3)
        for k, (name, _) in enumerate(entry.steps):
            measured, simulated = rec[k + 1] - rec[k], rep[k + 1] - rep[k]
            out["rank"].append(r)
            out["step"].append(name)
            out["measured_us"].append(measured)
            out["simulated_us"].append(round(simulated, 3))
            out["error_pct"].append(round(100.0 * (simulated - measured) / measured, 2) if measured else None)
    return pa.table(out)


def _collective_rows(
    trace: Trace, transfers: pa.Table, res: SimResult, transfer_ids: np.ndarray | None
) -> pa.Table:
    """``transfers`` with each collective's simulated time: from its start to its end, or to
    the end of its transfer part (op ``transfer_ids``) where the replay added one; a replaced
    node's from its block's first start to its last end on the rank."""
    sim = res.ops
    s_start, s_end = sim["start_ns"].to_numpy(), sim["end_ns"].to_numpy()
    t_rank, t_id = transfers["rank"].to_numpy(), transfers["id"].to_numpy()
    replaced = transfers["expanded"].to_numpy(zero_copy_only=False)
    start = np.full(len(t_rank), np.nan)
    end = np.full(len(t_rank), np.nan)
    kept = np.flatnonzero(~replaced)
    if len(kept):
        rows = op_rows(sim, t_rank[kept], t_id[kept])
        start[kept] = s_start[rows]
        ends = rows if transfer_ids is None else op_rows(sim, t_rank[kept], transfer_ids[: len(kept)])
        end[kept] = s_end[ends]
    holds = collective_holds(trace, sim["rank"].to_numpy(), sim["id"].to_numpy().astype(np.uint64))
    if replaced.any() and holds is not None:
        b_start, b_end = np.full(holds.count, np.inf), np.full(holds.count, -np.inf)
        m = np.flatnonzero(holds.member >= 0)
        np.minimum.at(b_start, holds.member[m], s_start[m])
        np.maximum.at(b_end, holds.member[m], s_end[m])
        block = {int(k): b for b, k in enumerate(holds.parent_key.tolist())}
        for i in np.flatnonzero(replaced).tolist():
            b = block.get((int(t_rank[i]) << 40) | int(t_id[i]))
            if b is not None:
                start[i], end[i] = b_start[b], b_end[b]
    simulated = np.round((end - start) / 1e3, 3)
    return transfers.append_column("simulated_us", pa.array(simulated, pa.float64(), from_pandas=True))
