"""Collective instances of a trace and the algorithm each one runs.

The k-th ``COMM_COLL_NODE`` of a communicator group on every member rank is one
instance; :class:`Algorithms` turns an instance's (collective, size, group) into
the :class:`~etstore.sim._templates.Template` its ranks expand into, or None to
replay the node's own duration.

An algorithm given as a trace is judged first, by the verdict ``etstore check`` and
the MSCCL-IR writer share (:func:`~etstore.algorithms.check.check_algorithm`): one
that cannot run to completion as MSCCL runs it (a deadlock, a receive that waits
forever, a send that is never received) is refused, since a simulated time for it
would be wrong; one that runs but fails the check otherwise (a wrong result, two
threadblocks on one connection, a race) is simulated as written, with a logged warning
naming its first problem.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.algorithms.check import CheckReport, check_algorithm
from etstore.algorithms.generators import GENERATORS, generate
from etstore.collective import COLLECTIVE_NAMES
from etstore.errors import ConfigError, EtstoreError
from etstore.formats.comm_groups import DEFAULT_GROUP_NAMES, find_group
from etstore.ir import run_verdict
from etstore.model import Trace
from etstore.sim import _templates as tpl
from etstore.sim._native import native_template
from etstore.sim._phases import SharedBus
from etstore.sim.config import SimConfig, collective_name
from etstore.sim.result import not_stuck

__all__ = [
    "BUILTIN_ALGORITHMS",
    "AlgorithmSpec",
    "Algorithms",
    "CollectiveInstance",
    "check_complete",
    "collective_instances",
    "vet_algorithm",
]

log = logging.getLogger(__name__)

FULL_CHECK_WORDS = 50_000_000
"""Above this many bitset word operations ((V + E)·N·C/64) a trace algorithm gets only the
run verdict before it is simulated, not the whole symbolic check (which proves its result)."""

AlgorithmSpec = str | Trace

BUILTIN_ALGORITHMS: frozenset[str] = frozenset({"native", "replay", *GENERATORS})
"""Algorithm names the simulator resolves itself: ``native`` (ASTRA-sim's native
implementations per dimension, :attr:`SimConfig.native_impls`; ring by default),
``replay`` (the node's own duration) and every generator of
:data:`etstore.algorithms.generators.GENERATORS`; any other name is a stored algorithm."""


@dataclass
class CollectiveInstance:
    """One collective across its group: the ``seq``-th of group ``pg`` on every member rank."""

    pg: str
    seq: int
    type: str
    size: int  # comm_size in bytes, as the nodes carry it
    group: tuple[int, ...]
    rows: list[int] = field(default_factory=list)  # op rows of its COMM_COLL_NODEs, one per member
    algorithm: str = ""  # label of the algorithm it ran ("replay" when none)


class Algorithms:
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
        self.cache: dict[tuple[Any, ...], tpl.AnyTemplate | None] = {}
        self.generated: dict[tuple[str, str, int], Trace] = {}
        self.labels: dict[str, str] = {}

    def spec_for(self, coll: str) -> AlgorithmSpec:
        """The algorithm asked for ``coll``: explicit, else the config's default."""
        if coll in self.explicit:
            return self.explicit[coll]
        return self.config.impl_for(coll)

    @staticmethod
    def label(spec: AlgorithmSpec) -> str:
        """How results name an algorithm: its name, or ``trace:<name>``."""
        return spec if isinstance(spec, str) else f"trace:{spec.name}"

    def _whole(self, group: tuple[int, ...]) -> bool:
        """Whether ``group`` is every NPU of the system (in any order)."""
        n = len(group)
        return n == self.num_npus and sorted(group) == list(range(n))

    def placement(self, coll: str, group: tuple[int, ...]) -> tuple[int, ...]:
        """The ranks a template's positions 0, 1, ... stand for: the group's members in their
        order, except that a native collective of every NPU runs on the network in NPU order."""
        spec = self.spec_for(coll)
        if isinstance(spec, str) and spec == "native" and self._whole(group):
            return tuple(range(len(group)))
        return group

    def template(self, coll: str, size: int, group: tuple[int, ...]) -> tuple[tpl.AnyTemplate | None, str]:
        """The template for one instance, or None to replay the node's own duration."""
        spec = self.spec_for(coll)
        label = self.label(spec)
        self.labels[str(coll)] = label
        n = len(group)
        # a native collective of every NPU runs on the network's dimensions (in NPU order,
        # however a comm-group file lists them: ASTRA-sim's CommunicatorGroup compares sizes
        # only); any other group runs one ring of its members in their order, the same
        # template whoever they are
        whole = self._whole(group)
        key = (
            coll,
            label,
            id(spec) if not isinstance(spec, str) else 0,
            size,
            n,
            whole if spec == "native" else False,
        )
        if key in self.cache:
            return self.cache[key], label
        cfg = self.config
        t: tpl.AnyTemplate | None
        if isinstance(spec, str) and spec == "replay":
            t = None
        elif n == 1 and isinstance(spec, str):  # a group of one moves nothing, whatever the algorithm
            t = tpl.empty_template(f"{label}-{coll}-1", 1)
        elif isinstance(spec, str) and spec == "native":
            # a group of every NPU runs on the network's dimensions; a smaller one is a
            # single "local" ring of its members, as ASTRA-sim's communicator groups are
            dims = self.topo_dims if whole else (n,)
            t = native_template(  # ConfigError names the implementation ASTRA-sim cannot run
                coll,
                size,
                dims,
                impls=cfg.native_impls_for(coll),
                local=not whole,
                total_npus=self.num_npus,
                **self._native_kwargs(),
            )
        else:
            if isinstance(spec, str):
                trace = self._generated(spec, coll, n)
            else:
                trace = spec
                vet_algorithm(trace)
                if trace.num_ranks != n:
                    raise not_stuck(
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
                min_comp_ns=cfg.min_comp_ns,
                label=label,
            )
        self.cache[key] = t
        return t, label

    def _native_kwargs(self) -> dict[str, Any]:
        """The config's parameters of ASTRA-sim's native ring."""
        cfg = self.config
        return {
            "splits": cfg.preferred_dataset_splits,
            "active_chunks": cfg.active_chunks_per_dimension,
            "endpoint_delay_ns": cfg.endpoint_delay_ns,
            "local_mem_bw_gb_per_s": cfg.local_mem_bw_gb_per_s,
            "reduction_mem_accesses": cfg.reduction_mem_accesses,
            "integer_ns": cfg.integer_ns,
            "optimization": cfg.collective_optimization,
            "shared_bus": SharedBus(
                cfg.shared_bus_l_ns,
                cfg.shared_bus_o_ns,
                cfg.shared_bus_g_ns_per_byte,
                cfg.local_reduction_delay,
            )
            if cfg.model_shared_bus
            else None,
        }

    def _generated(self, name: str, coll: str, n: int) -> Trace:
        """The generator's algorithm ``name`` for ``coll`` on ``n`` ranks (built once)."""
        cache_key = (name, coll, n)
        if cache_key in self.generated:
            return self.generated[cache_key]
        short = COLLECTIVE_NAMES[coll]
        try:
            trace = generate(name, coll=short, ranks=n, chunks=self.config.algorithm_chunks)
        except EtstoreError as exc:
            raise not_stuck(f"cannot generate algorithm {name!r} for {coll} on {n} ranks: {exc}") from exc
        self.generated[cache_key] = trace
        return trace


def _trace_groups(trace: Trace) -> dict[str, Sequence[int]] | None:
    """The communicator groups a trace carries in ``params["comm_groups"]`` (the workload generator's)."""
    found = (trace.params or {}).get("comm_groups")
    if not isinstance(found, Mapping):
        return None
    return {str(k): v for k, v in found.items() if isinstance(v, Sequence)}


def _comm_groups(
    trace: Trace,
    pg: np.ndarray,
    is_coll: np.ndarray,
    rank: np.ndarray,
    ids: np.ndarray,
    all_ranks: np.ndarray,
    groups: Mapping[str, Sequence[int]] | None,
) -> dict[str, tuple[int, ...]]:
    """Member ranks of every communicator group used by a collective, in the order given.

    An absent ``pg_name`` (null or ``""``) is every rank. A name is looked up in ``groups``
    when given — a name it lacks is an error, as in ASTRA-sim — else in the trace's own
    ``params["comm_groups"]``, first as written, then as ASTRA-sim reads it (``stoi``:
    ``"0.0"`` finds group ``"0"``); members keep their order (a native ring runs in it,
    and an algorithm's rank i is member i). ``"0"`` that no group defines is every rank
    (ASTRA-sim's default group); any other unknown name is the ranks whose collectives
    carry it.
    """
    out: dict[str, tuple[int, ...]] = {}
    explicit = groups is not None
    source = groups if explicit else _trace_groups(trace)
    given = {str(k): tuple(int(r) for r in v) for k, v in (source or {}).items()}
    world = (trace.params or {}).get("world_size")
    for name in np.unique(pg[is_coll]):
        name = str(name)
        key = find_group(name, given) if name else None
        if key is None and name in DEFAULT_GROUP_NAMES:
            if isinstance(world, int) and world > len(all_ranks):  # a recording of some ranks only
                lacking = sorted(set(range(world)) - {int(r) for r in all_ranks})
                raise not_stuck(
                    f"trace {trace.name!r} holds ranks {[int(r) for r in all_ranks]} of a world of {world}: "
                    f"its collectives of group {name or 'all'} need ranks {lacking} too, which were not "
                    "recorded"
                )
            out[name] = tuple(int(r) for r in all_ranks)
        elif key is not None:
            out[name] = given[key]
        elif explicit:
            i = int(np.flatnonzero(is_coll & (pg == name))[0])
            raise ConfigError(
                f"trace {trace.name!r}: rank {int(rank[i])} node {int(ids[i])}: communicator group "
                f"{name} not found in the communicator groups given ({', '.join(sorted(given)) or 'none'})"
            )
        else:
            out[name] = tuple(int(r) for r in np.unique(rank[is_coll & (pg == name)]))
    return out


def collective_instances(
    trace: Trace,
    is_coll: np.ndarray,
    rank: np.ndarray,
    ids: np.ndarray,
    csize: np.ndarray,
    all_ranks: np.ndarray,
    groups: Mapping[str, Sequence[int]] | None,
) -> list[CollectiveInstance]:
    """Group the trace's ``COMM_COLL_NODE`` rows into instances: the k-th of a group on each
    member rank, in node-id order, is instance k (instances numbered rank by rank).

    Raises
    ------
    SimulationError
        A node without ``comm_type``, an instance whose ranks disagree on type or
        size, or a rank outside its group.
    ConfigError
        ``groups`` is given and lacks a group a collective names.
    """
    ops = trace.ops
    n0 = ops.num_rows
    coll_rows = np.flatnonzero(is_coll)
    # the k-th collective of a group on each rank in node-id order (the order ASTRA-sim
    # issues them in, and so numbers their streams) is instance k
    coll_rows = coll_rows[np.lexsort((ids[coll_rows], rank[coll_rows]))]
    take = pa.array(coll_rows)
    ctype = np.full(n0, "", dtype=object)
    pg = np.full(n0, "", dtype=object)
    ctype[coll_rows] = pc.fill_null(ops["comm_type"].take(take), "").to_pylist()
    pg[coll_rows] = pc.fill_null(ops["pg_name"].take(take), "").to_pylist()
    members = _comm_groups(trace, pg, is_coll, rank, ids, all_ranks, groups)
    instances: list[CollectiveInstance] = []
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
            raise not_stuck(
                f"trace {trace.name!r}: rank {r} node {int(ids[row])} is a COMM_COLL_NODE without comm_type"
            )
        if ikey not in inst_index:
            inst_index[ikey] = len(instances)
            instances.append(CollectiveInstance(g, k, ct, int(csize[row]), members[g]))
        inst = instances[inst_index[ikey]]
        if inst.type != ct or inst.size != int(csize[row]):
            raise not_stuck(
                f"trace {trace.name!r}: collective #{k} of group {g or 'all'} is {inst.type} of "
                f"{inst.size} bytes on one rank but rank {r} node {int(ids[row])} is {ct} of "
                f"{int(csize[row])} bytes"
            )
        if r not in inst.group:
            raise not_stuck(
                f"trace {trace.name!r}: rank {r} node {int(ids[row])} uses group {g!r} whose members "
                f"are {list(inst.group)}"
            )
        inst.rows.append(int(row))
    return instances


def check_complete(trace: Trace, inst: CollectiveInstance, rank: np.ndarray) -> None:
    """Raise :class:`SimulationError` unless every member rank of ``inst`` has its node."""
    have = sorted(int(rank[x]) for x in inst.rows)
    if have != sorted(inst.group):
        lacking = sorted(set(inst.group) - set(have))
        raise not_stuck(
            f"trace {trace.name!r}: collective #{inst.seq} ({inst.type}) of group "
            f"{inst.pg or 'all'} has no matching COMM_COLL_NODE on rank(s) {lacking}"
        )


# verdicts of the trace algorithms seen, by object (a sweep simulates one algorithm many times):
# the check's report (None when only the run verdict was affordable) and why it cannot finish
_VETTED: dict[int, tuple[weakref.ref[Trace], CheckReport | None, str]] = {}


def vet_algorithm(trace: Trace) -> CheckReport | None:
    """Judge an algorithm trace before it is simulated: refuse it if it cannot finish, warn if it is wrong.

    The verdict is the one ``etstore check`` prints and the MSCCL-IR writer refuses with
    (:func:`~etstore.algorithms.check.check_algorithm`, whose first problem is a
    deadlock or hang when there is one). It is made once per trace object, and its
    warning logged once. A trace too large for the whole check within
    :data:`FULL_CHECK_WORDS` gets the run verdict only (:func:`etstore.ir.run_verdict`),
    and None is returned for it.

    Raises
    ------
    SimulationError
        The algorithm cannot run to completion as MSCCL/RCCL run it: a deadlock (named
        with its wait-for cycle), a receive without a send, or a send never received.

    Notes
    -----
    O(V + E) for the run verdict; the check costs O((V + E)·N·C/64) word operations.
    """
    key = id(trace)
    seen = _VETTED.get(key)
    if seen is None or seen[0]() is not trace:
        report = _judge(trace)
        if report is not None:
            hang = report.hang
        else:
            verdict = run_verdict(trace)
            hang = "" if verdict.ok else verdict.headline
        seen = (weakref.ref(trace, _forget(key)), report, hang)
        _VETTED[key] = seen
        if report is not None and not report.ok and not hang:
            more = len(report.problems) - 1
            if report.checked:
                log.warning(
                    "algorithm %r fails its check, simulated as written: %s%s",
                    trace.name,
                    report.verdict,
                    f" (+{more} more; etstore check lists them)" if more else "",
                )
            else:
                log.info("algorithm %r simulated unchecked: %s", trace.name, report.verdict)
    if seen[2]:
        raise not_stuck(
            f"algorithm {trace.name!r} cannot run to completion, so it has no simulated time: {seen[2]}"
        )
    return seen[1]


def _forget(key: int) -> Callable[[weakref.ref[Trace]], None]:
    """A callback dropping ``key``'s verdict when its trace is gone (its id may be reused)."""

    def forget(_ref: weakref.ref[Trace]) -> None:
        _VETTED.pop(key, None)

    return forget


def _judge(trace: Trace) -> CheckReport | None:
    """The whole check when it is affordable, else None (the run verdict then decides alone)."""
    params = trace.params or {}
    n = int(params.get("ngpus") or trace.num_ranks or 1)
    c = int(params.get("nchunksperloop") or 1)
    if (trace.num_ops + trace.num_deps) * max(1, n * c // 64) > FULL_CHECK_WORDS:
        log.info("algorithm %r: too large to check whole before simulating, run verdict only", trace.name)
        return None
    return check_algorithm(trace)
