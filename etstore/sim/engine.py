"""Event-driven replay of a :class:`~etstore.model.Trace` over a network, ASTRA-sim style.

Issue semantics (FORMATS.md §1, ASTRA-sim's workload layer):

* an op is *ready* when every dependency (data and ctrl) has finished;
* per NPU at most ``max_comp_ops`` compute, ``max_cpu_ops`` CPU, ``max_comm_ops``
  communication (sends and collectives) and ``max_mem_ops`` memory ops run at once,
  receives are unlimited unless ``max_recv_ops`` says otherwise; a ready op that
  finds its slot busy waits, and a freed slot goes to the waiting op that became
  ready first (``FIFO``) or last (``LIFO``);
* ``COMP_NODE`` lasts ``duration_micros · 1000`` ns (1 ns when 0);
* a send completes when its message arrives; a receive completes when its matching
  message has arrived and the receive was posted; sends and receives match on
  (src, dst, tag) (plus size with ``match_on_size``), the n-th send to the n-th
  receive;
* a ``COMM_COLL_NODE`` holds the communication slot while its algorithm runs: the
  node expands, on its rank, into that rank's part of the algorithm chosen for its
  collective type (ASTRA-sim's native ring, a generator, or a stored algorithm); the
  k-th collective of a communicator group on every member rank is one instance.

The trace is converted once into integer-indexed arrays (CSR successors, per-op
kind, duration, size, peer, match key) and replayed by one heap-based loop over
``(time_ns, op)`` tuples; there is no Python object per op.
"""

from __future__ import annotations

import gc
import heapq
import logging
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.collective import COLLECTIVE_NAMES
from etstore.collectives.generators import generate
from etstore.errors import EtstoreError, SimulationError
from etstore.model import Trace
from etstore.sim import _templates as tpl
from etstore.sim.config import SimConfig, collective_name
from etstore.sim.network import Network
from etstore.topology import GIB, Topology

try:  # the optional native loop (setup.py); _run below stays the reference and the fallback
    from etstore.sim import _simloop  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the build
    _simloop = None

__all__ = [
    "COLLECTIVES_SCHEMA",
    "LINKS_SCHEMA",
    "OP_TIMINGS_SCHEMA",
    "RANK_BREAKDOWN_SCHEMA",
    "SimResult",
    "SimulationError",
    "busbw_factor",
    "simulate",
]

log = logging.getLogger(__name__)

AlgorithmSpec = str | Trace




# op kinds inside the loop
K_COMP, K_CPU, K_SEND, K_RECV, K_COLL, K_JOIN, K_DELAY, K_MEM = range(8)
# resource classes per NPU
R_COMP, R_CPU, R_COMM, R_RECV, R_MEM = range(5)
_NRES = 5
_SUB_TAG_BASE = 1 << 40  # tags of collective sub-messages live above every trace tag

OP_TIMINGS_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("id", pa.uint64()),
        ("name", pa.string()),
        ("type", pa.string()),
        ("ready_ns", pa.float64()),
        ("start_ns", pa.float64()),
        ("end_ns", pa.float64()),
    ]
)
RANK_BREAKDOWN_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("total_ns", pa.float64()),
        ("compute_ns", pa.float64()),
        ("comm_ns", pa.float64()),
        ("exposed_comm_ns", pa.float64()),
        ("overlap_ns", pa.float64()),
        ("idle_ns", pa.float64()),
    ]
)
COLLECTIVES_SCHEMA = pa.schema(
    [
        ("coll_seq", pa.int64()),
        ("pg_name", pa.string()),
        ("comm_type", pa.string()),
        ("algorithm", pa.string()),
        ("group_size", pa.int32()),
        ("size_bytes", pa.int64()),
        ("start_ns", pa.float64()),
        ("end_ns", pa.float64()),
        ("time_ns", pa.float64()),
        ("algbw_gb_per_s", pa.float64()),
        ("busbw_gb_per_s", pa.float64()),
        ("busbw_factor", pa.float64()),
    ]
)
LINKS_SCHEMA = pa.schema(
    [
        ("link", pa.int32()),
        ("src", pa.int32()),
        ("dst", pa.int32()),
        ("latency_ns", pa.float64()),
        ("bandwidth_gb_per_s", pa.float64()),
        ("bytes", pa.float64()),
        ("messages", pa.int64()),
        ("busy_ns", pa.float64()),
        ("utilization", pa.float64()),
    ]
)
STUCK_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("id", pa.uint64()),
        ("name", pa.string()),
        ("type", pa.string()),
        ("state", pa.string()),
        ("reason", pa.string()),
    ]
)


def busbw_factor(comm_type: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor: 2(n-1)/n all-reduce, (n-1)/n gather/scatter/all-to-all, else 1."""
    if n <= 1:
        return 0.0 if comm_type in ("ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "ALL_TO_ALL") else 1.0
    if comm_type == "ALL_REDUCE":
        return 2.0 * (n - 1) / n
    if comm_type in ("ALL_GATHER", "REDUCE_SCATTER", "REDUCE_SCATTER_BLOCK", "ALL_TO_ALL"):
        return (n - 1) / n
    return 1.0


def _nccl_bytes(comm_type: str, comm_size: int, n: int) -> int:
    """nccl-tests' S: the total array for all-gather (comm_size is per rank), else comm_size."""
    return comm_size * n if comm_type == "ALL_GATHER" else comm_size


@dataclass(frozen=True, eq=False)
class SimResult:
    """What one replay produced; every table is Arrow, every time ns.

    Attributes
    ----------
    ops
        :data:`OP_TIMINGS_SCHEMA`, one row per op of the trace (collective sub-ops are
        not listed): when it became ready, started and ended.
    ranks
        :data:`RANK_BREAKDOWN_SCHEMA`: per rank, its finish time ``total_ns`` =
        ``compute_ns + exposed_comm_ns + idle_ns``; ``comm_ns`` is time with any
        send, receive or collective in flight, ``overlap_ns`` the part of it hidden
        under compute.
    collectives
        :data:`COLLECTIVES_SCHEMA`: per collective instance, first start to last end
        over its ranks, and nccl-tests ``algbw = S / t`` and ``busbw = algbw · f``
        (GB = 2^30, like link bandwidths).
    links
        :data:`LINKS_SCHEMA`: bytes and busy time per directed link, utilization =
        busy / ``total_ns`` (congestion-unaware: the load offered, may exceed 1).
    total_ns
        Simulated makespan.
    wall_s
        Wall time of the whole call; ``loop_s`` of the event loop alone.
    events
        Events processed: one per op that finished (a send and its matched receive
        are two), plus one per link hop with the congestion-aware model.
    """

    ops: pa.Table
    ranks: pa.Table
    collectives: pa.Table
    links: pa.Table
    total_ns: float
    wall_s: float
    loop_s: float
    events: int
    sim_ops: int
    trace_name: str
    topology: str
    num_npus: int
    config: SimConfig
    algorithms: Mapping[str, str] = field(default_factory=dict)

    @property
    def events_per_s(self) -> float:
        """Events per wall second of the event loop."""
        return self.events / self.loop_s if self.loop_s > 0 else float("inf")

    def params(self) -> dict[str, Any]:
        """JSON-able parameters of the run (config, algorithms, topology)."""
        return {
            "config": self.config.to_dict(),
            "algorithms": dict(self.algorithms),
            "topology": self.topology,
        }

    def summary(self) -> dict[str, Any]:
        """A JSON-able digest (what ``etstore sim`` prints)."""
        r = self.ranks
        out: dict[str, Any] = {
            "trace": self.trace_name,
            "topology": self.topology,
            "congestion": self.config.congestion,
            "total_ns": self.total_ns,
            "ops": self.ops.num_rows,
            "sim_ops": self.sim_ops,
            "events": self.events,
            "wall_s": round(self.wall_s, 6),
            "events_per_s": round(self.events_per_s, 1),
        }
        if r.num_rows:
            for col in ("compute_ns", "comm_ns", "exposed_comm_ns", "idle_ns"):
                out[f"mean_{col}"] = float(pc.mean(r[col]).as_py())
        if self.collectives.num_rows:
            out["collectives"] = self.collectives.num_rows
            out["mean_busbw_gb_per_s"] = float(pc.mean(self.collectives["busbw_gb_per_s"]).as_py())
        return out


# ---------------------------------------------------------------- preparation


def _col(table: pa.Table, name: str, fill: Any, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """(values with nulls filled, validity mask) of a column."""
    arr = table[name]
    valid = pc.is_valid(arr).to_numpy(zero_copy_only=False)
    vals = pc.fill_null(arr, fill).to_numpy(zero_copy_only=False).astype(dtype)
    return vals, valid


def _factorize(*cols: np.ndarray) -> np.ndarray:
    """A dense integer id per distinct row of the given integer columns."""
    if len(cols[0]) == 0:
        return np.zeros(0, dtype=np.int64)
    key = np.zeros(len(cols[0]), dtype=np.int64)
    span = 1
    for c in cols:
        u, inv = np.unique(c, return_inverse=True)
        if span * max(len(u), 1) >= (1 << 62):
            stacked = np.stack([np.asarray(x, dtype=np.int64) for x in cols], axis=1)
            return np.unique(stacked, axis=0, return_inverse=True)[1].ravel().astype(np.int64)
        key = key * len(u) + inv
        span *= max(len(u), 1)
    return key


def _union_length(start: np.ndarray, end: np.ndarray, group: np.ndarray, ngroups: int) -> np.ndarray:
    """Per group, the length of the union of intervals [start, end) (vectorised sweep)."""
    out = np.zeros(ngroups)
    ok = end > start
    if not ok.any():
        return out
    s, e, g = start[ok], end[ok], group[ok]
    span = float(max(e.max(), 1.0)) * 2.0 + 1.0
    s2, e2 = s + g * span, e + g * span
    order = np.argsort(s2, kind="stable")
    s2, e2, g = s2[order], e2[order], g[order]
    cover = np.maximum.accumulate(e2)
    prev = np.concatenate([[-np.inf], cover[:-1]])
    lo = np.maximum(s2, prev)
    np.add.at(out, g, np.maximum(e2 - lo, 0.0))
    return out


class _Plan:
    """Every array the event loop needs, built once from the trace (see :func:`simulate`)."""

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {
            k: [] for k in ("kind", "dur", "rank", "peer", "tag", "size", "owner", "local")
        }
        self.esrc: list[np.ndarray] = []
        self.edst: list[np.ndarray] = []
        self.count = 0

    def add(self, **cols: np.ndarray) -> int:
        first = self.count
        n = len(cols["kind"])
        for k, v in self.parts.items():
            v.append(np.asarray(cols[k]) if k in cols else np.full(n, -1, dtype=np.int64))
        self.count += n
        return first

    def edges(self, src: np.ndarray, dst: np.ndarray) -> None:
        self.esrc.append(np.asarray(src, dtype=np.int64))
        self.edst.append(np.asarray(dst, dtype=np.int64))

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: np.concatenate(v) if v else np.zeros(0) for k, v in self.parts.items()}


class _Algorithms:
    """Chooses and caches the template for each (collective, size, group)."""

    def __init__(
        self,
        config: SimConfig,
        algorithms: Mapping[str, AlgorithmSpec] | None,
        topo_dims: tuple[int, ...],
        num_npus: int,
    ) -> None:
        self.config = config
        self.explicit: dict[str, AlgorithmSpec] = {}
        for key, spec in (algorithms or {}).items():
            self.explicit[collective_name(key)] = spec
        self.topo_dims = topo_dims
        self.num_npus = num_npus
        self.cache: dict[tuple[Any, ...], tpl.Template | None] = {}
        self.labels: dict[str, str] = {}

    def spec_for(self, coll: str) -> AlgorithmSpec:
        if coll in self.explicit:
            return self.explicit[coll]
        return self.config.impl_for(coll)

    def label(self, spec: AlgorithmSpec) -> str:
        return spec if isinstance(spec, str) else f"trace:{spec.name}"

    def template(self, coll: str, size: int, group: tuple[int, ...]) -> tuple[tpl.Template | None, str]:
        """The template for one instance, or None to replay the node's own duration."""
        spec = self.spec_for(coll)
        label = self.label(spec)
        self.labels[str(coll)] = label
        n = len(group)
        key = (
            coll,
            label,
            id(spec) if not isinstance(spec, str) else 0,
            size,
            group if spec == "native" else n,
        )
        if key in self.cache:
            return self.cache[key], label
        cfg = self.config
        t: tpl.Template | None
        if isinstance(spec, str) and spec == "replay":
            t = None
        elif isinstance(spec, str) and spec == "native":
            dims = self.topo_dims if (n == self.num_npus and group == tuple(range(n))) else (n,)
            t = tpl.native_template(
                coll,
                size,
                dims,
                splits=cfg.preferred_dataset_splits,
                active_chunks=cfg.active_chunks_per_dimension,
                endpoint_delay_ns=cfg.endpoint_delay_ns,
                local_mem_bw_gb_per_s=cfg.local_mem_bw_gb_per_s,
                reduction_mem_accesses=cfg.reduction_mem_accesses,
                integer_ns=cfg.integer_ns,
            )
        else:
            if isinstance(spec, str):
                trace = self._generated(spec, coll, n)
            else:
                trace = spec
                if trace.num_ranks != n:
                    raise SimulationError(
                        f"algorithm {trace.name!r} has {trace.num_ranks} ranks but the {coll} group has {n}"
                    )
            t = tpl.trace_template(
                trace,
                coll,
                size,
                duration_unit_ns=cfg.duration_unit_ns,
                local_mem_bw_gb_per_s=cfg.local_mem_bw_gb_per_s,
                reduction_mem_accesses=cfg.reduction_mem_accesses,
                copy_mem_accesses=cfg.copy_mem_accesses,
                integer_ns=cfg.integer_ns,
                label=label,
            )
        self.cache[key] = t
        return t, label

    def _generated(self, name: str, coll: str, n: int) -> Trace:
        cache_key = ("gen", name, coll, n)
        if cache_key in self.cache:
            return self.cache[cache_key]  # type: ignore[return-value]
        short = COLLECTIVE_NAMES[coll]
        try:
            trace = generate(name, coll=short, ranks=n, chunks=self.config.algorithm_chunks)
        except EtstoreError as exc:
            raise SimulationError(
                f"cannot generate algorithm {name!r} for {coll} on {n} ranks: {exc}"
            ) from exc
        self.cache[cache_key] = trace  # type: ignore[assignment]
        return trace


class _TypeNames:
    """Node type names of a column, dictionary-encoded (no Python string per op)."""

    def __init__(self, column: pa.ChunkedArray) -> None:
        enc = pc.dictionary_encode(column).combine_chunks()
        self.names: list[str] = [str(x) for x in enc.dictionary.to_pylist()]
        self.codes = enc.indices.to_numpy(zero_copy_only=False)

    def mask(self, name: str) -> np.ndarray:
        if name not in self.names:
            return np.zeros(len(self.codes), dtype=bool)
        return self.codes == self.names.index(name)  # type: ignore[no-any-return]

    def __getitem__(self, i: int) -> str:
        return self.names[int(self.codes[i])]


def _groups_for(
    pg: np.ndarray,
    is_coll: np.ndarray,
    rank: np.ndarray,
    all_ranks: np.ndarray,
    groups: Mapping[str, Sequence[int]] | None,
) -> dict[str, tuple[int, ...]]:
    """Member ranks of every communicator group used by a collective."""
    out: dict[str, tuple[int, ...]] = {}
    given = {str(k): tuple(sorted(int(r) for r in v)) for k, v in (groups or {}).items()}
    for name in np.unique(pg[is_coll]):
        name = str(name)
        if name in ("", "0"):
            out[name] = tuple(int(r) for r in all_ranks)
        elif name in given:
            out[name] = given[name]
        else:
            out[name] = tuple(int(r) for r in np.unique(rank[is_coll & (pg == name)]))
    return out


def _build(
    trace: Trace,
    net: Network,
    config: SimConfig,
    algos: _Algorithms,
    groups: Mapping[str, Sequence[int]] | None,
) -> dict[str, Any]:
    """Flatten trace + expanded collectives into the loop's arrays."""
    ops = trace.ops
    n0 = ops.num_rows
    rank = ops["rank"].to_numpy().astype(np.int64)
    ids = ops["id"].to_numpy().astype(np.uint64)
    types = _TypeNames(ops["type"])
    durm = ops["duration_micros"].to_numpy().astype(np.float64)
    is_cpu, _ = _col(ops, "is_cpu_op", False, bool)
    csize, has_size = _col(ops, "comm_size", 0, np.int64)
    csrc, has_src = _col(ops, "comm_src", -1, np.int64)
    cdst, has_dst = _col(ops, "comm_dst", -1, np.int64)
    ctag, _ = _col(ops, "comm_tag", 0, np.int64)

    all_ranks = np.unique(rank)
    if len(all_ranks) and (all_ranks.min() < 0 or all_ranks.max() >= net.num_nodes):
        raise SimulationError(
            f"trace {trace.name!r} has ranks {int(all_ranks.min())}..{int(all_ranks.max())} but topology "
            f"{net.topo.name} has NPUs 0..{net.num_nodes - 1}"
        )
    unit = config.duration_unit_ns
    is_comp = types.mask("COMP_NODE")
    is_send = types.mask("COMM_SEND_NODE")
    is_recv = types.mask("COMM_RECV_NODE")
    is_coll = types.mask("COMM_COLL_NODE")
    is_mem = types.mask("MEM_LOAD_NODE") | types.mask("MEM_STORE_NODE")
    kind = np.full(n0, K_DELAY, dtype=np.int64)
    kind[is_comp & ~is_cpu] = K_COMP
    kind[is_comp & is_cpu] = K_CPU
    kind[is_send] = K_SEND
    kind[is_recv] = K_RECV
    kind[is_mem] = K_MEM
    dur = np.where(is_comp, np.where(durm > 0, durm * unit, config.min_comp_ns), 0.0)
    dur = np.where(is_mem, durm * unit, dur)
    if config.integer_ns:
        dur = np.floor(dur)
    for mask, has, what in ((is_send, has_dst, "comm_dst"), (is_recv, has_src, "comm_src")):
        bad = mask & ~has
        if bad.any():
            i = int(np.argmax(bad))
            raise SimulationError(
                f"trace {trace.name!r}: rank {int(rank[i])} node {int(ids[i])} ({types[i]}) has no {what}"
            )
    peer = np.where(is_send, cdst, np.where(is_recv, csrc, -1))
    bad = (is_send | is_recv) & ((peer < 0) | (peer >= net.num_nodes))
    if bad.any():
        i = int(np.argmax(bad))
        raise SimulationError(
            f"trace {trace.name!r}: rank {int(rank[i])} node {int(ids[i])} names peer {int(peer[i])}, "
            f"outside the topology's NPUs 0..{net.num_nodes - 1}"
        )
    plan = _Plan()
    plan.add(
        kind=kind,
        dur=dur,
        rank=rank,
        peer=peer,
        tag=ctag,
        size=np.where(has_size, csize, 0),
        owner=np.arange(n0),
        local=np.full(n0, -1),
    )

    # trace dependencies -> rows
    key = (rank.astype(np.uint64) << np.uint64(40)) | ids
    korder = np.argsort(key, kind="stable")
    skey = key[korder]
    deps = trace.deps
    if deps.num_rows:
        drank = deps["rank"].to_numpy().astype(np.uint64) << np.uint64(40)
        ks, kd = drank | deps["src"].to_numpy(), drank | deps["dst"].to_numpy()
        es = korder[np.clip(np.searchsorted(skey, ks), 0, max(n0 - 1, 0))]
        ed = korder[np.clip(np.searchsorted(skey, kd), 0, max(n0 - 1, 0))]
        ok = (key[es] == ks) & (key[ed] == kd)
        if not ok.all():
            log.warning("%d dependencies name nodes absent from their rank; ignored", int((~ok).sum()))
        es, ed = es[ok].astype(np.int64), ed[ok].astype(np.int64)
    else:
        es = ed = np.zeros(0, dtype=np.int64)
    if trace.num_missing:
        log.warning("trace %s: %d dependencies on absent nodes are ignored", trace.name, trace.num_missing)

    # collectives
    join_of = np.full(n0, -1, dtype=np.int64)
    coll_rows = np.flatnonzero(is_coll)
    instances: list[dict[str, Any]] = []
    if len(coll_rows):
        take = pa.array(coll_rows)
        ctype = np.full(n0, "", dtype=object)
        pg = np.full(n0, "", dtype=object)
        ctype[coll_rows] = pc.fill_null(ops["comm_type"].take(take), "").to_pylist()
        pg[coll_rows] = pc.fill_null(ops["pg_name"].take(take), "").to_pylist()
        members = _groups_for(pg, is_coll, rank, all_ranks, groups)
        seq_counter: dict[tuple[str, int], int] = {}
        inst_index: dict[tuple[str, int], int] = {}
        for row in coll_rows:
            g = pg[row]
            r = int(rank[row])
            k = seq_counter.get((g, r), 0)
            seq_counter[(g, r)] = k + 1
            ikey = (g, k)
            ct = ctype[row]
            if not ct:
                raise SimulationError(
                    f"trace {trace.name!r}: rank {r} node {int(ids[row])} is a COMM_COLL_NODE "
                    "without comm_type"
                )
            if ikey not in inst_index:
                inst_index[ikey] = len(instances)
                instances.append(
                    {"pg": g, "seq": k, "type": ct, "size": int(csize[row]), "group": members[g], "rows": []}
                )
            inst = instances[inst_index[ikey]]
            if inst["type"] != ct or inst["size"] != int(csize[row]):
                raise SimulationError(
                    f"trace {trace.name!r}: collective #{k} of group {g or 'all'} is {inst['type']} of "
                    f"{inst['size']} bytes on one rank but rank {r} node {int(ids[row])} is {ct} of "
                    f"{int(csize[row])} bytes"
                )
            if r not in inst["group"]:
                raise SimulationError(
                    f"trace {trace.name!r}: rank {r} node {int(ids[row])} uses group {g!r} whose members "
                    f"are {list(inst['group'])}"
                )
            inst["rows"].append(int(row))
        for idx, inst in enumerate(instances):
            have = sorted(int(rank[x]) for x in inst["rows"])
            if have != sorted(inst["group"]):
                lacking = sorted(set(inst["group"]) - set(have))
                raise SimulationError(
                    f"trace {trace.name!r}: collective #{inst['seq']} ({inst['type']}) of group "
                    f"{inst['pg'] or 'all'} has no matching COMM_COLL_NODE on rank(s) {lacking}"
                )
            t, label = algos.template(inst["type"], inst["size"], tuple(inst["group"]))
            inst["algorithm"] = label if t is not None else "replay"
            if t is None:  # replay the node's own duration on the comm slot
                for row in inst["rows"]:
                    kind[row] = K_DELAY
                    dur[row] = np.floor(durm[row] * unit) if config.integer_ns else durm[row] * unit
                inst["replay"] = True
                continue
            grp = np.asarray(inst["group"], dtype=np.int64)
            pos_of = {int(r): p for p, r in enumerate(grp)}
            tag_base = _SUB_TAG_BASE + idx * (t.num_tags + 1)
            for row in inst["rows"]:
                p = pos_of[int(rank[row])]
                a, b = int(t.starts[p]), int(t.starts[p + 1])
                m = b - a
                sk = t.kind[a:b]
                skind = np.where(sk == tpl.K_SEND, K_SEND, np.where(sk == tpl.K_RECV, K_RECV, K_DELAY))
                speer = np.where(t.peer[a:b] >= 0, grp[np.clip(t.peer[a:b], 0, None)], -1)
                first = plan.add(
                    kind=skind,
                    dur=t.dur_ns[a:b],
                    rank=np.full(m, rank[row]),
                    peer=speer,
                    tag=tag_base + t.tag[a:b],
                    size=t.size[a:b],
                    owner=np.full(m, row),
                    local=np.arange(a, b),
                )
                join = plan.add(
                    kind=np.array([K_JOIN]),
                    dur=np.zeros(1),
                    rank=np.array([rank[row]]),
                    owner=np.array([row]),
                    local=np.array([-1]),
                )
                join_of[row] = join
                ea, eb = int(t.edge_starts[p]), int(t.edge_starts[p + 1])
                plan.edges(first + t.esrc[ea:eb], first + t.edst[ea:eb])
                roots = first + np.flatnonzero(t.root[a:b])
                sinks = first + np.flatnonzero(t.sink[a:b])
                plan.edges(np.full(len(roots), row), roots)
                plan.edges(sinks, np.full(len(sinks), join))
                kind[row] = K_COLL
                dur[row] = 0.0
    # trace edges leave a collective from its join
    es = np.where(join_of[es] >= 0, join_of[es], es) if len(es) else es
    plan.edges(es, ed)
    arrays = plan.arrays()
    arrays["kind"][:n0] = kind
    arrays["dur"][:n0] = dur
    return {
        "arrays": arrays,
        "esrc": np.concatenate(plan.esrc) if plan.esrc else np.zeros(0, np.int64),
        "edst": np.concatenate(plan.edst) if plan.edst else np.zeros(0, np.int64),
        "n0": n0,
        "join_of": join_of,
        "instances": instances,
        "ranks": all_ranks,
        "types": types,
        "ids": ids,
        "is_coll": is_coll,
    }


# ---------------------------------------------------------------- the loop


def _run(
    kind: list[int],
    dur: list[float],
    succs: list[list[int]],
    indeg: list[int],
    acq: list[int],
    rel: list[int],
    free: list[float],
    mkey: list[int],
    mt: list[float],
    aware: bool,
    cur: list[int],
    dstn: list[int],
    size: list[float],
    hop: list[list[int] | None],
    ldst: list[int],
    llat: list[float],
    lbw: list[float],
    integer_ns: bool,
    overhead: float,
    lifo: bool,
    n: int,
) -> dict[str, Any]:
    """The event loop: a calendar of distinct times (a heap of floats) with a bucket of items each.

    An item ``x >= 0`` finishes op ``x``; ``x < 0`` moves the message of send ``~x``
    (one hop, or its arrival). Items of one time run in the order they were
    scheduled. Ready and start times are not recorded here (they follow from the end
    times, see :func:`simulate`), except for ops that waited for a slot.
    """
    end_t = [-1.0] * n
    start_t = [-1.0] * n  # only for ops that waited for an NPU slot
    partner = [-1] * n
    arrived = [False] * n
    nres = len(free)
    waitq: list[deque[int]] = [deque() for _ in range(nres)]
    take = deque.pop if lifo else deque.popleft
    send_q: dict[int, deque[int]] = {}
    recv_q: dict[int, deque[int]] = {}
    nl = len(ldst)
    lfree = [0.0] * nl
    lbusy = [0.0] * nl
    lbytes = [0.0] * nl
    lmsgs = [0] * nl
    cal: list[float] = []
    buckets: dict[float, list[int]] = {}
    push = heapq.heappush
    pop = heapq.heappop
    floor = int
    go = [i for i in range(n) if indeg[i] == 0]
    t = 0.0
    nev = 0
    while True:
        # start ops taken from a slot queue (or the roots): same as the inline start below
        if go:
            for j in go:
                c = acq[j]
                if c >= 0 and start_t[j] < 0.0:
                    if free[c] > 0:
                        free[c] -= 1
                    else:
                        waitq[c].append(j)
                        continue
                k = kind[j]
                if k == K_SEND:
                    mk = mkey[j]
                    q = recv_q.get(mk)
                    if q:
                        partner[j] = q.popleft()
                    else:
                        q = send_q.get(mk)
                        if q is None:
                            send_q[mk] = deque((j,))
                        else:
                            q.append(j)
                    t2 = t + (overhead if aware else mt[j])
                    x = ~j
                elif k == K_RECV:
                    mk = mkey[j]
                    q = send_q.get(mk)
                    if q:
                        s = q.popleft()
                        if not arrived[s]:
                            partner[s] = j
                            continue
                        t2, x = t, j
                    else:
                        q = recv_q.get(mk)
                        if q is None:
                            recv_q[mk] = deque((j,))
                        else:
                            q.append(j)
                        continue
                else:
                    t2, x = t + dur[j], j
                b = buckets.get(t2)
                if b is None:
                    buckets[t2] = [x]
                    push(cal, t2)
                else:
                    b.append(x)
            go = []
        if not cal:
            break
        t = pop(cal)
        items = buckets.pop(t)
        for x in items:
            if x < 0:
                s = ~x
                if aware:
                    u = cur[s]
                    d = dstn[s]
                    if u != d:
                        link = hop[d][u]  # type: ignore[index]
                        st = lfree[link]
                        if st < t:
                            st = t
                        sz = size[s]
                        ser = sz / lbw[link]
                        if integer_ns:
                            ser = floor(ser)
                        fin = st + ser
                        lfree[link] = fin
                        lbusy[link] += ser
                        lbytes[link] += sz
                        lmsgs[link] += 1
                        cur[s] = ldst[link]
                        t2 = fin + llat[link]
                        b = buckets.get(t2)
                        if b is None:
                            buckets[t2] = [x]
                            push(cal, t2)
                        else:
                            b.append(x)
                        continue
                arrived[s] = True
                r = partner[s]
                if r >= 0:
                    items.append(r)  # the matched receive finishes now too (same instant)
                y = s
            else:
                y = x
            end_t[y] = t
            c = rel[y]
            if c >= 0:
                w = waitq[c]
                if w:
                    j = take(w)
                    start_t[j] = t
                    go.append(j)
                else:
                    free[c] += 1
            for j in succs[y]:
                d = indeg[j] - 1
                indeg[j] = d
                if d:
                    continue
                c = acq[j]
                if c >= 0:
                    if free[c] > 0:
                        free[c] -= 1
                    else:
                        waitq[c].append(j)
                        continue
                k = kind[j]
                if k == K_SEND:
                    mk = mkey[j]
                    q = recv_q.get(mk)
                    if q:
                        partner[j] = q.popleft()
                    else:
                        q = send_q.get(mk)
                        if q is None:
                            send_q[mk] = deque((j,))
                        else:
                            q.append(j)
                    t2 = t + (overhead if aware else mt[j])
                    x2 = ~j
                elif k == K_RECV:
                    mk = mkey[j]
                    q = send_q.get(mk)
                    if q:
                        s2 = q.popleft()
                        if not arrived[s2]:
                            partner[s2] = j
                            continue
                        t2, x2 = t, j
                    else:
                        q = recv_q.get(mk)
                        if q is None:
                            recv_q[mk] = deque((j,))
                        else:
                            q.append(j)
                        continue
                else:
                    t2, x2 = t + dur[j], j
                b = buckets.get(t2)
                if b is None:
                    buckets[t2] = [x2]
                    push(cal, t2)
                else:
                    b.append(x2)
        nev += len(items)
    return {
        "start": start_t,
        "end": end_t,
        "events": nev,
        "t": t,
        "indeg": indeg,
        "send_q": send_q,
        "recv_q": recv_q,
        "waitq": waitq,
        "lbusy": lbusy,
        "lbytes": lbytes,
        "lmsgs": lmsgs,
    }


def _run_lists(
    perm: np.ndarray,
    inv: np.ndarray,
    succ: np.ndarray,
    ptr: np.ndarray,
    cols: dict[str, np.ndarray],
    free: list[float],
    aware: bool,
    hop: list[list[int] | None],
    net: Network,
    config: SimConfig,
) -> tuple[dict[str, Any], float]:
    """:func:`_run` on renumbered Python lists; (its output, CPU seconds of list conversion + loop)."""
    n = len(perm)
    succ_new = inv[succ].tolist()
    ptr_new = ptr[perm]
    cnt_new = (ptr[perm + 1] - ptr_new).tolist()
    ptr_new = ptr_new.tolist()
    succs = [succ_new[p : p + c] for p, c in zip(ptr_new, cnt_new, strict=True)]
    t_loop = time.process_time()
    col = {k: v[perm] for k, v in cols.items()}
    out = _run(
        col["kind"].tolist(),
        col["dur"].astype(np.float64).tolist(),
        succs,
        col["indeg"].tolist(),
        col["acq"].tolist(),
        col["rel"].tolist(),
        free,
        col["mkey"].tolist(),
        col["mt"].tolist(),
        aware,
        col["cur"].tolist(),
        col["dstn"].tolist(),
        col["size"].astype(np.float64).tolist(),
        hop,
        net.dst.tolist(),
        net.latency_ns.tolist(),
        net.bytes_per_ns.tolist(),
        config.integer_ns,
        float(config.message_overhead_ns),
        config.scheduling_policy == "LIFO",
        n,
    )
    return out, time.process_time() - t_loop


def _run_native(
    perm: np.ndarray,
    inv: np.ndarray,
    succ: np.ndarray,
    ptr: np.ndarray,
    cols: dict[str, np.ndarray],
    free: list[float],
    aware: bool,
    hop: list[list[int] | None],
    net: Network,
    config: SimConfig,
) -> tuple[dict[str, Any], float]:
    """The C loop (``_simloop.run``) on the same renumbered inputs as :func:`_run_lists`, same output.

    Successors stay CSR (each op's list in its original order, which fixes the order
    ready ops are scheduled in); the routing table is the network's ``[dst, src]`` array.
    """
    n = len(perm)
    starts = ptr[perm]
    cnt = ptr[perm + 1] - starts
    sptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(cnt, out=sptr[1:])
    gather = np.arange(int(sptr[-1]), dtype=np.int64) - np.repeat(sptr[:-1] - starts, cnt)
    succ_new = np.ascontiguousarray(inv[succ[gather]], dtype=np.int64)
    nl = net.topo.num_links
    # the network's [dst, src] next-link array (rows built by net.prepare) instead of ``hop``
    nh = np.ascontiguousarray(net._nh, dtype=np.int32).ravel() if aware else np.zeros(0, np.int32)
    t_loop = time.process_time()

    def i64(name: str) -> np.ndarray:
        return np.ascontiguousarray(cols[name][perm], dtype=np.int64)

    def f64(name: str) -> np.ndarray:
        return np.ascontiguousarray(cols[name][perm], dtype=np.float64)

    indeg_new = i64("indeg")
    start = np.full(n, -1.0)
    end = np.full(n, -1.0)
    lbusy = np.zeros(nl)
    lbytes = np.zeros(nl)
    lmsgs = np.zeros(nl, dtype=np.int64)
    events, t, send_q, recv_q, waitq = _simloop.run(
        i64("kind"),
        f64("dur"),
        sptr,
        succ_new,
        indeg_new,
        i64("acq"),
        i64("rel"),
        np.array(free, dtype=np.float64),
        i64("mkey"),
        f64("mt"),
        i64("cur"),
        i64("dstn"),
        f64("size"),
        nh,
        np.ascontiguousarray(net.dst, dtype=np.int64),
        np.ascontiguousarray(net.latency_ns, dtype=np.float64),
        np.ascontiguousarray(net.bytes_per_ns, dtype=np.float64),
        start,
        end,
        np.zeros(nl),
        lbusy,
        lbytes,
        lmsgs,
        aware,
        bool(config.integer_ns),
        float(config.message_overhead_ns),
        config.scheduling_policy == "LIFO",
    )
    loop_s = time.process_time() - t_loop
    out = {
        "start": start,
        "end": end,
        "events": events,
        "t": t,
        "indeg": indeg_new,
        "send_q": send_q,
        "recv_q": recv_q,
        "waitq": waitq,
        "lbusy": lbusy,
        "lbytes": lbytes,
        "lmsgs": lmsgs,
    }
    return out, loop_s


# ---------------------------------------------------------------- entry point


def simulate(
    trace: Trace,
    topo: Topology,
    *,
    config: SimConfig | None = None,
    algorithms: Mapping[str, AlgorithmSpec] | None = None,
    groups: Mapping[str, Sequence[int]] | None = None,
    dims: Sequence[int] | None = None,
) -> SimResult:
    """Replay ``trace`` on ``topo`` and measure it.

    Parameters
    ----------
    trace
        A workload (or an algorithm, or an expanded trace); rank ``r`` runs on NPU ``r``.
    topo
        The network; bandwidth GB/s with GB = 2^30, latency ns.
    config
        Issue, network and collective parameters (:class:`SimConfig`; default:
        ASTRA-sim's regression-case system config, congestion-unaware).
    algorithms
        Per collective type (``"ALL_REDUCE"``, ``"allgather"``, ...), the algorithm a
        ``COMM_COLL_NODE`` runs: ``"native"`` (ASTRA-sim's ring), a generator name
        (``"ring"``, ``"direct"``, ...), ``"replay"`` (the node's own duration) or an
        algorithm :class:`Trace` with as many ranks as the group. Defaults come from
        ``config.*_impl``; collectives with no default replay their duration.
    groups
        Communicator groups by ``pg_name``; ``""`` and ``"0"`` mean every rank, an
        unknown name means the ranks whose collectives carry it.
    dims
        Network dimensions for dimension-order routing and native collectives;
        default from the topology.

    Returns
    -------
    SimResult
        Op timings, rank breakdown, collectives, link utilization and totals.

    Raises
    ------
    SimulationError
        A receive never gets its message, a dependency cycle, a collective missing on
        some rank of its group, or an op without the fields it needs. Stuck replays
        raise with ``.stuck`` listing the ops that never finished; nothing hangs.
    TopologyError
        The trace has more ranks than the topology has NPUs, or a peer is unreachable.
    ConfigError
        An unknown collective name in ``algorithms``.

    Notes
    -----
    O(V + E) preparation with numpy over the expanded trace (V ops, E deps), then
    O(events · log V) for the loop; events ≈ ops + messages (+ link hops when
    congestion-aware). Semantics follow ASTRA-sim; see ``docs/simulator.md``.

    Examples
    --------
    >>> from etstore.model import ops_table, Trace
    >>> from etstore.topology import Topology
    >>> ops = ops_table({"rank": [0, 1], "id": [1, 1], "type": ["COMM_SEND_NODE", "COMM_RECV_NODE"],
    ...                  "comm_dst": [1, None], "comm_src": [None, 0], "comm_tag": [0, 0],
    ...                  "comm_size": [1 << 20, 1 << 20]})
    >>> simulate(Trace(ops), Topology.ring(2)).total_ns  # 500 ns + 1 MiB / 50 GiB/s
    20031.0
    """
    # The replay allocates ~one list per op and many small tuples; the cyclic GC would
    # rescan them over and over (none of them can form cycles), so it is paused.
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        return _simulate(trace, topo, config or SimConfig(), algorithms, groups, dims)
    finally:
        if gc_was_on:
            gc.enable()


def _simulate(
    trace: Trace,
    topo: Topology,
    config: SimConfig,
    algorithms: Mapping[str, AlgorithmSpec] | None,
    groups: Mapping[str, Sequence[int]] | None,
    dims: Sequence[int] | None,
) -> SimResult:
    t0 = time.perf_counter()
    try:
        net = Network(topo, dims)
        algos = _Algorithms(config, algorithms, net.dims, topo.num_npus)
        built = _build(trace, net, config, algos, groups)
    except tpl.TemplateError as exc:
        raise SimulationError(str(exc)) from exc
    a = built["arrays"]
    n = len(a["kind"])
    kind = a["kind"].astype(np.int64)
    rank = a["rank"].astype(np.int64)
    peer = a["peer"].astype(np.int64)
    tag = a["tag"].astype(np.int64)
    size = a["size"].astype(np.int64)
    esrc, edst = built["esrc"], built["edst"]
    # CSR successors
    order = np.argsort(esrc, kind="stable")
    succ = edst[order]
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(esrc, minlength=n), out=ptr[1:])
    indeg = np.bincount(edst, minlength=n)
    # resources: slot id = rank_index * 5 + class
    ranks = built["ranks"]
    rix = np.searchsorted(ranks, rank)
    cls = np.full(n, -1, dtype=np.int64)
    caps = {
        R_COMP: config.max_comp_ops,
        R_CPU: config.max_cpu_ops,
        R_COMM: config.max_comm_ops,
        R_RECV: config.max_recv_ops,
        R_MEM: config.max_mem_ops,
    }
    n0 = built["n0"]
    top = np.arange(n) < n0
    cls[(kind == K_COMP)] = R_COMP
    cls[(kind == K_CPU)] = R_CPU
    cls[(kind == K_MEM)] = R_MEM
    cls[top & ((kind == K_SEND) | (kind == K_COLL))] = R_COMM
    cls[top & (kind == K_RECV)] = R_RECV
    is_coll_top = built["is_coll"]
    replay_coll = np.zeros(n, dtype=bool)
    replay_coll[:n0] = is_coll_top & (kind[:n0] == K_DELAY)
    cls[replay_coll] = R_COMM
    for c, cap in caps.items():
        if cap is None:
            cls[cls == c] = -1
    slot = np.where(cls >= 0, rix * _NRES + cls, -1)
    acq = slot.copy()
    rel = slot.copy()
    coll_rows = np.flatnonzero((kind == K_COLL) & top)
    join_of = built["join_of"]
    rel[coll_rows] = -1
    rel[join_of[coll_rows]] = slot[coll_rows]
    free = [0.0] * (len(ranks) * _NRES)
    for r in range(len(ranks)):
        for c, cap in caps.items():
            free[r * _NRES + c] = float(cap) if cap is not None else 0.0
    # messages
    is_msg = (kind == K_SEND) | (kind == K_RECV)
    msrc = np.where(kind == K_SEND, rank, peer)
    mdst = np.where(kind == K_SEND, peer, rank)
    mkey = np.full(n, -1, dtype=np.int64)
    if is_msg.any():
        cols = [msrc[is_msg], mdst[is_msg], tag[is_msg]]
        if config.match_on_size:
            cols.append(size[is_msg])
        mkey[is_msg] = _factorize(*cols)
    sends = np.flatnonzero(kind == K_SEND)
    mt = np.zeros(n)
    aware = config.congestion == "aware"
    native = _simloop is not None
    hop: list[list[int] | None] = []
    if len(sends):
        if aware and native:
            net.prepare(mdst[sends])
        elif aware:
            hop = net.hop_table(mdst[sends])
        else:
            mt[sends] = net.message_times_ns(
                msrc[sends],
                mdst[sends],
                size[sends],
                integer_ns=config.integer_ns,
                overhead_ns=config.message_overhead_ns,
            )
    cur = np.where(kind == K_SEND, rank, 0)
    # Renumber ops so that ops likely to run at about the same time sit next to each other
    # (k-th op of every rank together): the loop touches ~10 lists per op and locality
    # makes it ~2x faster on large traces. Results are mapped back afterwards.
    perm = _locality_order(rank, a["owner"].astype(np.int64), n0)
    inv = np.empty(n, dtype=np.int64)
    inv[perm] = np.arange(n)
    cols = {"kind": kind, "dur": a["dur"], "indeg": indeg, "acq": acq, "rel": rel, "mkey": mkey}
    cols.update(mt=mt, cur=cur, dstn=mdst, size=size)
    run = _run_native if native else _run_lists
    out, loop_s = run(perm, inv, succ, ptr, cols, free, aware, hop, net, config)
    for key in ("end", "start", "indeg"):
        out[key] = np.asarray(out[key])[inv]
    end = out["end"]
    if (end < 0).any():
        for key in ("send_q", "recv_q"):
            out[key] = {k: [int(perm[j]) for j in q] for k, q in out[key].items() if q}
        out["waitq"] = [[int(perm[j]) for j in q] for q in out["waitq"] if q]
        raise _stuck_error(trace, built, a, out, kind, rank, peer, tag, size, succ, ptr)
    # an op is ready when its last dependency ends; it starts then unless it waited for a slot
    ready = np.zeros(n)
    if len(esrc):
        by_dst = np.argsort(edst, kind="stable")
        d_sorted = edst[by_dst]
        cuts = np.flatnonzero(np.r_[True, d_sorted[1:] != d_sorted[:-1]])
        ready[d_sorted[cuts]] = np.maximum.reduceat(end[esrc[by_dst]], cuts)
    start = np.asarray(out["start"])
    start = np.where(start >= 0, start, ready)
    total = float(end.max()) if n else 0.0
    # trace-level timings: a collective ends with its join
    end_top = end[:n0].copy()
    has_join = join_of >= 0
    end_top[has_join] = end[join_of[has_join]]
    ops = trace.ops
    timings = pa.Table.from_arrays(
        [
            ops["rank"],
            ops["id"],
            ops["name"],
            ops["type"],
            pa.array(ready[:n0]),
            pa.array(start[:n0]),
            pa.array(end_top),
        ],
        schema=OP_TIMINGS_SCHEMA,
    )
    ranks_table = _breakdown(built, kind[:n0], rank[:n0], start[:n0], end_top, is_coll_top)
    colls = _collectives(built, start[:n0], end_top)
    links = _links(net, out, aware, msrc[sends], mdst[sends], size[sends], total)
    events = int(out["events"])
    wall = time.perf_counter() - t0
    log.debug("simulated %s: %d ops, %d events in %.3f s", trace.name, n, events, loop_s)
    return SimResult(
        ops=timings,
        ranks=ranks_table,
        collectives=colls,
        links=links,
        total_ns=total,
        wall_s=wall,
        loop_s=loop_s,
        events=events,
        sim_ops=n,
        trace_name=trace.name,
        topology=topo.name,
        num_npus=topo.num_npus,
        config=config,
        algorithms=dict(algos.labels),
    )


def _locality_order(rank: np.ndarray, owner: np.ndarray, n0: int) -> np.ndarray:
    """Op order for the loop: by position within its rank (sub-ops at their collective's), then rank."""
    n = len(rank)
    top_rank = rank[:n0]
    order = np.argsort(top_rank, kind="stable")
    first = np.zeros(n0, dtype=np.int64)
    if n0:
        r_sorted = top_rank[order]
        starts = np.flatnonzero(np.r_[True, r_sorted[1:] != r_sorted[:-1]])
        group_start = np.repeat(starts, np.diff(np.r_[starts, n0]))
        first[order] = np.arange(n0) - group_start
    within = np.empty(n, dtype=np.int64)
    within[:n0] = first
    if n > n0:
        within[n0:] = first[owner[n0:]]
    return np.lexsort((np.arange(n), rank, within))


def _breakdown(
    built: dict[str, Any],
    kind: np.ndarray,
    rank: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    is_coll: np.ndarray,
) -> pa.Table:
    ranks = built["ranks"]
    ng = len(ranks)
    g = np.searchsorted(ranks, rank)
    comp = (kind == K_COMP) | (kind == K_CPU)
    comm = (kind == K_SEND) | (kind == K_RECV) | is_coll
    total = np.zeros(ng)
    if len(end):
        np.maximum.at(total, g, end)
    comp_u = _union_length(start[comp], end[comp], g[comp], ng)
    comm_u = _union_length(start[comm], end[comm], g[comm], ng)
    both = comp | comm
    all_u = _union_length(start[both], end[both], g[both], ng)
    return pa.Table.from_arrays(
        [
            pa.array(ranks.astype(np.int32)),
            pa.array(total),
            pa.array(comp_u),
            pa.array(comm_u),
            pa.array(all_u - comp_u),
            pa.array(comp_u + comm_u - all_u),
            pa.array(np.maximum(total - all_u, 0.0)),
        ],
        schema=RANK_BREAKDOWN_SCHEMA,
    )


def _collectives(built: dict[str, Any], start: np.ndarray, end: np.ndarray) -> pa.Table:
    rows: dict[str, list[Any]] = {f.name: [] for f in COLLECTIVES_SCHEMA}
    for inst in built["instances"]:
        rws = np.asarray(inst["rows"])
        s, e = float(start[rws].min()), float(end[rws].max())
        n = len(inst["group"])
        t = e - s
        nbytes = _nccl_bytes(inst["type"], inst["size"], n)
        f = busbw_factor(inst["type"], n)
        algbw = nbytes / t * 1e9 / GIB if t > 0 else 0.0
        for k, v in (
            ("coll_seq", inst["seq"]),
            ("pg_name", inst["pg"]),
            ("comm_type", inst["type"]),
            ("algorithm", inst.get("algorithm", "")),
            ("group_size", n),
            ("size_bytes", inst["size"]),
            ("start_ns", s),
            ("end_ns", e),
            ("time_ns", t),
            ("algbw_gb_per_s", algbw),
            ("busbw_gb_per_s", algbw * f),
            ("busbw_factor", f),
        ):
            rows[k].append(v)
    return pa.Table.from_pydict(rows, schema=COLLECTIVES_SCHEMA)


def _links(
    net: Network,
    out: dict[str, Any],
    aware: bool,
    src: np.ndarray,
    dst: np.ndarray,
    size: np.ndarray,
    total: float,
) -> pa.Table:
    if aware:
        nbytes = np.asarray(out["lbytes"], dtype=np.float64)
        msgs = np.asarray(out["lmsgs"], dtype=np.int64)
        busy = np.asarray(out["lbusy"], dtype=np.float64)
    else:
        nbytes, msgs, busy = net.link_loads(src, dst, size)
    nl = net.topo.num_links
    util = busy / total if total > 0 else np.zeros(nl)
    return pa.Table.from_arrays(
        [
            pa.array(np.arange(nl, dtype=np.int32)),
            pa.array(net.src.astype(np.int32)),
            pa.array(net.dst.astype(np.int32)),
            pa.array(net.latency_ns),
            pa.array(np.asarray(net.topo.bandwidth_gb_per_s, dtype=np.float64)),
            pa.array(nbytes),
            pa.array(msgs),
            pa.array(busy),
            pa.array(util),
        ],
        schema=LINKS_SCHEMA,
    )


def _stuck_error(
    trace: Trace,
    built: dict[str, Any],
    a: dict[str, np.ndarray],
    out: dict[str, Any],
    kind: np.ndarray,
    rank: np.ndarray,
    peer: np.ndarray,
    tag: np.ndarray,
    size: np.ndarray,
    succ: np.ndarray,
    ptr: np.ndarray,
) -> SimulationError:
    """Explain why ops never finished: unmatched receives, cycles, slots held forever."""
    n0 = built["n0"]
    ids, types = built["ids"], built["types"]
    names = trace.ops["name"].to_pylist()
    owner = a["owner"].astype(np.int64)
    end = np.asarray(out["end"])
    blocked = np.asarray(out["indeg"]) > 0  # some dependency never finished
    unfinished = np.flatnonzero(end < 0)
    t_stop = out["t"]

    def describe(i: int) -> str:
        o = int(owner[i]) if i >= n0 else i
        base = f"rank {int(rank[i])} id {int(ids[o])} ({types[o]} {names[o]!r})"
        if i >= n0:
            what = {K_SEND: "send", K_RECV: "recv", K_JOIN: "end"}.get(int(kind[i]), "step")
            base += f" {what} step {int(a['local'][i])}" if what != "end" else " completion"
        return base

    reasons: dict[int, tuple[str, str]] = {}
    lines: list[str] = []
    for q in out["recv_q"].values():
        for r in q:
            r = int(r)
            tg = int(tag[r])
            tag_s = f"tag {tg}" if tg < _SUB_TAG_BASE else "its collective's messages"
            reasons[r] = (
                "posted",
                f"waits for a message from rank {int(peer[r])} ({tag_s}, {int(size[r])} "
                "bytes): no matching send",
            )
    # dependency cycles among ops that never became ready
    never = np.zeros(len(end), dtype=bool)
    never[unfinished] = blocked[unfinished]
    cyc = _find_cycle(never, succ, ptr)
    if cyc:
        same = all(int(rank[i]) == int(rank[cyc[0]]) for i in cyc)
        path = " -> ".join(f"id {int(ids[int(owner[i]) if i >= n0 else i])}" for i in cyc + cyc[:1])
        where = (
            f"rank {int(rank[cyc[0]])}"
            if same
            else "ranks " + ",".join(sorted({str(int(rank[i])) for i in cyc}))
        )
        lines.append(f"dependency cycle on {where}: {path}")
        for i in cyc:
            reasons.setdefault(i, ("blocked", "on a dependency cycle"))
    for wq in out["waitq"]:
        for j in wq:
            reasons.setdefault(
                int(j), ("waiting", "ready but its NPU slot is held by an op that never finished")
            )
    for i in unfinished:
        i = int(i)
        if i not in reasons:
            if blocked[i]:
                reasons[i] = ("blocked", "a dependency never finished")
            else:
                reasons[i] = ("started", "in flight when the replay stopped")
    for i, (state, why) in reasons.items():
        if state == "posted":
            lines.append(f"{describe(i)} {why}")
    top_rows = sorted({int(owner[i]) if i >= n0 else int(i) for i in unfinished})
    rows: dict[str, list[Any]] = {f.name: [] for f in STUCK_SCHEMA}
    for i in sorted(reasons):
        o = int(owner[i]) if i >= n0 else i
        state, why = reasons[i]
        rows["rank"].append(int(rank[i]))
        rows["id"].append(int(ids[o]))
        rows["name"].append(names[o])
        rows["type"].append(str(types[o]))
        rows["state"].append(state)
        rows["reason"].append(why if i < n0 else f"{describe(i)}: {why}")
    stuck = pa.Table.from_pydict(rows, schema=STUCK_SCHEMA)
    shown = lines[:10]
    more = f"\n  ... and {len(lines) - 10} more" if len(lines) > 10 else ""
    msg = (
        f"simulation of {trace.name!r} stuck at t={t_stop:.0f} ns: {len(top_rows)} of {n0} ops never finished"
        + (
            "".join(f"\n  {x}" for x in shown)
            if shown
            else "\n  (no unmatched receive or cycle found; see .stuck)"
        )
        + more
    )
    return SimulationError(msg, stuck)


def _find_cycle(never: np.ndarray, succ: np.ndarray, ptr: np.ndarray) -> list[int]:
    """One dependency cycle among the ``never``-ready ops, or [] if there is none.

    Peels ops whose never-ready predecessors are all peeled (they wait on something
    else: a stuck receive, a held slot); every op left has a predecessor left, so
    walking predecessors must repeat, and the repeat closes a cycle.
    """
    nodes = np.flatnonzero(never)
    if len(nodes) == 0:
        return []
    preds: dict[int, list[int]] = {int(i): [] for i in nodes}
    for i in preds:
        for e in range(int(ptr[i]), int(ptr[i + 1])):
            j = int(succ[e])
            if j in preds:
                preds[j].append(i)
    indeg = {i: len(p) for i, p in preds.items()}
    succs: dict[int, list[int]] = {i: [] for i in preds}
    for j, p in preds.items():
        for i in p:
            succs[i].append(j)
    stack = [i for i, d in indeg.items() if d == 0]
    alive = set(preds)
    while stack:
        i = stack.pop()
        alive.discard(i)
        for j in succs[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                stack.append(j)
    if not alive:
        return []
    seen: dict[int, int] = {}
    path: list[int] = []
    i = min(alive)
    while i not in seen:
        seen[i] = len(path)
        path.append(i)
        i = min(p for p in preds[i] if p in alive)
    cycle = path[seen[i] :]
    cycle.reverse()  # predecessors were walked: reverse to read in dependency order
    return cycle
