"""Collective instances of a trace and the algorithm each one runs.

The k-th ``COMM_COLL_NODE`` of a communicator group on every member rank is one
instance (:func:`sim_collectives`, on the finder ``expand`` uses too);
:class:`Algorithms` turns an instance's (collective, size, group) into
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
import pyarrow.compute as pc

from etstore.algorithms._instances import CARRIERS, EVERY, Collectives, find_collectives, given_groups
from etstore.algorithms._parts import buffer_bytes
from etstore.algorithms.check import CheckReport, check_algorithm
from etstore.algorithms.generators import GENERATORS, generate
from etstore.algorithms.nccl import NCCL_GENERATORS, NcclSpec, cached_nccl, is_nccl_spec, resolve_nccl
from etstore.collective import COLLECTIVE_NAMES
from etstore.errors import ConfigError, EtstoreError
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
    "group_members",
    "sim_collectives",
    "vet_algorithm",
]

log = logging.getLogger(__name__)

FULL_CHECK_WORDS = 50_000_000
"""Above this many bitset word operations ((V + E)·N·C/64) a trace algorithm gets only the
run verdict before it is simulated, not the whole symbolic check (which proves its result)."""

AlgorithmSpec = str | Trace

BUILTIN_ALGORITHMS: frozenset[str] = frozenset({"native", "replay", *GENERATORS, "nccl", *NCCL_GENERATORS})
"""Algorithm names the simulator resolves itself: ``native`` (ASTRA-sim's native
implementations per dimension, :attr:`SimConfig.native_impls`; ring by default),
``replay`` (the node's own duration), every generator of
:data:`etstore.algorithms.generators.GENERATORS`, and NCCL's (``nccl``: its tuning model
picks per size; ``nccl-ring``, ``nccl-tree``; with their ``:`` fields,
:mod:`etstore.algorithms.nccl`); any other name is a stored algorithm."""


@dataclass
class CollectiveInstance:
    """One collective across its group: the ``seq``-th of group ``pg`` on every member rank."""

    pg: str
    seq: int
    type: str
    size: int  # comm_size in bytes, as the nodes carry it
    group: tuple[int, ...]
    rows: list[int] = field(default_factory=list)  # op rows of its COMM_COLL_NODEs, one per member, by rank
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
        n = len(group)
        nccl: NcclSpec | None = None
        if is_nccl_spec(spec) and n > 1:  # NCCL's choice and loops depend on the size
            assert isinstance(spec, str)
            try:
                nccl, label = resolve_nccl(spec, COLLECTIVE_NAMES[coll], buffer_bytes(coll, size, n), n)
            except EtstoreError as exc:
                raise not_stuck(f"algorithm {spec!r} for {coll} of {size} bytes on {n} ranks: {exc}") from exc
        self.labels[str(coll)] = label
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
            if nccl is not None:
                trace = self._generated_nccl(nccl, coll, n)
            elif isinstance(spec, str):
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

    def _generated_nccl(self, spec: NcclSpec, coll: str, n: int) -> Trace:
        """NCCL's ring or tree as ``spec`` (loops given) says, for ``coll`` on ``n`` ranks (built once)."""
        cache_key = (spec.text(), coll, n)
        if cache_key not in self.generated:
            try:
                self.generated[cache_key] = cached_nccl(spec.text(), COLLECTIVE_NAMES[coll], n)
            except EtstoreError as exc:
                what = f"cannot generate algorithm {spec.text()!r} for {coll} on {n} ranks"
                raise not_stuck(f"{what}: {exc}") from exc
        return self.generated[cache_key]

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


def sim_collectives(trace: Trace, groups: Mapping[str, Sequence[int]] | None) -> list[CollectiveInstance]:
    """The trace's collective instances in the order the simulator runs them, each complete and
    consistent (:func:`~etstore.algorithms._instances.find_collectives` numbers them: the k-th of
    a group on each member rank in node-id order is instance k, instances rank by rank).

    Raises
    ------
    SimulationError
        A node without ``comm_type``, an instance whose ranks disagree on type or size, a
        rank outside its group, a member rank without the instance's node, or a group of
        every rank in a trace that recorded only some of them.
    ConfigError
        ``groups`` is given and lacks a group a collective names.

    Notes
    -----
    O(V + C log C) for V ops and C collective nodes, vectorised; one object per instance.
    """
    colls = _checked(trace, groups)
    _check_nodes(trace, colls)
    nodes, starts = colls.by_instance()
    rows = colls.rows[nodes].tolist()
    cuts = starts.tolist()
    seqs, pgs = colls.inst_seq.tolist(), colls.inst_pg.tolist()
    sizes = colls.size[colls.first_of].tolist()
    types = [str(t) for t in colls.inst_type]
    count = np.diff(starts)
    lacking = np.flatnonzero(count != colls.gsize[colls.inst_pg])
    if len(lacking):
        i = int(lacking[0])
        have = {int(r) for r in colls.rank[nodes[starts[i] : starts[i + 1]]]}
        pg = colls.pg_names[pgs[i]]
        raise not_stuck(
            f"trace {trace.name!r}: collective #{seqs[i]} ({types[i]}) of group {pg or 'all'} has no "
            f"matching COMM_COLL_NODE on rank(s) {sorted(set(colls.members[pgs[i]]) - have)}"
        )
    return [
        CollectiveInstance(
            colls.pg_names[pgs[i]],
            seqs[i],
            types[i],
            sizes[i],
            colls.members[pgs[i]],
            rows[cuts[i] : cuts[i + 1]],
        )
        for i in range(colls.ninst)
    ]


def group_members(trace: Trace, groups: Mapping[str, Sequence[int]] | None) -> dict[str, tuple[int, ...]]:
    """Member ranks of every communicator group a collective of ``trace`` names, as its replay
    forms them (:func:`sim_collectives`' rule and group errors); empty without collectives."""
    if not pc.any(pc.equal(trace.ops["type"], "COMM_COLL_NODE")).as_py():
        return {}
    colls = _checked(trace, groups)
    return dict(zip(colls.pg_names, colls.members, strict=True))


def _checked(trace: Trace, groups: Mapping[str, Sequence[int]] | None) -> Collectives:
    """The trace's collectives, its groups looked up as the simulator looks them up.

    An absent ``pg_name`` (null or ``""``) is every rank. A name is looked up in ``groups``
    when given (a name it lacks is an error, as in ASTRA-sim), else in the trace's own
    ``params["comm_groups"]``, as written or as ASTRA-sim reads it (``stoi``); ``"0"``
    that no group defines is every rank (ASTRA-sim's default group), which a trace that
    recorded some ranks of a larger world cannot run; any other unknown name is the ranks
    whose collectives carry it.
    """
    given = given_groups(trace, groups)
    colls = find_collectives(trace, given)
    world = (trace.params or {}).get("world_size")
    ranks = [int(r) for r in colls.ranks]
    for g in sorted(range(len(colls.pg_names)), key=colls.pg_names.__getitem__):
        name, rule = colls.pg_names[g], colls.rule[g]
        if rule == EVERY and isinstance(world, int) and world > len(ranks):  # a recording of some ranks
            raise not_stuck(
                f"trace {trace.name!r} holds ranks {ranks} of a world of {world}: its collectives of group "
                f"{name or 'all'} need ranks {sorted(set(range(world)) - set(ranks))} too, which were not "
                "recorded"
            )
        if rule == CARRIERS and groups is not None:
            j = int(np.argmax(colls.pg_code == g))
            known = ", ".join(sorted(map(str, groups))) or "none"
            raise ConfigError(
                f"trace {trace.name!r}: rank {int(colls.rank[j])} node {int(colls.ids[j])}: communicator "
                f"group {name} not found in the communicator groups given ({known})"
            )
    return colls


def _check_nodes(trace: Trace, colls: Collectives) -> None:
    """Raise :class:`SimulationError` at the first node in issue order that has no ``comm_type``,
    disagrees with its instance's first node on type or size, or is outside its group."""
    ctype, size = colls.ctype, colls.size
    j0 = colls.first_of[colls.inst]
    untyped = ctype == ""
    differs = (ctype != ctype[j0]) | (size != size[j0])
    outside = colls.apos < 0
    issue = colls.issue_order()
    bad = (untyped | differs | outside)[issue]
    if not bad.any():
        return
    j = int(issue[np.argmax(bad)])
    r, node = int(colls.rank[j]), int(colls.ids[j])
    where = f"trace {trace.name!r}: rank {r} node {node}"
    if untyped[j]:
        raise not_stuck(f"{where} is a COMM_COLL_NODE without comm_type")
    g = int(colls.pg_code[j])
    pg = colls.pg_names[g]
    if differs[j]:
        i = int(colls.inst[j])
        raise not_stuck(
            f"trace {trace.name!r}: collective #{int(colls.inst_seq[i])} of group {pg or 'all'} is "
            f"{ctype[j0[j]]} of {int(size[j0[j]])} bytes on one rank but rank {r} node {node} is {ctype[j]} "
            f"of {int(size[j])} bytes"
        )
    raise not_stuck(f"{where} uses group {pg!r} whose members are {list(colls.members[g])}")


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
