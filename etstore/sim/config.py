"""Simulator parameters (:class:`SimConfig`) and readers for ASTRA-sim's input files.

ASTRA-sim describes a run with three files: a *system* JSON (scheduling policy,
endpoint delay, chunking, collective implementations, local memory bandwidth), an
analytical *network* YAML (one entry per dimension: topology, NPU count, bandwidth,
latency) and optionally a *communicator group* JSON. :func:`read_system_config`
and :func:`read_comm_groups` turn the first and the last into a :class:`SimConfig`
and a group mapping. The network file describes a topology, so the topology
package reads it (:func:`etstore.topology.read_network_config`, re-exported here
with :class:`~etstore.topology.AstraNetwork` and
:func:`~etstore.topology.astra_topology`).

Units: time in ns, sizes in bytes. Network bandwidth is GB/s with GB = 2^30
(ASTRA-sim's analytical network); ``local-mem-bw`` is GB/s with GB = 10^9, which is
how ASTRA-sim's system layer reads it (it multiplies the value by 10^9).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from etstore.collective import COLLECTIVE_NAMES, chakra_name
from etstore.errors import ConfigError
from etstore.formats.files import read_comm_groups
from etstore.sim._native import parse_implementation
from etstore.topology import AstraNetwork, astra_topology, read_network_config

__all__ = [
    "EXPANDED_SLOTS",
    "AstraNetwork",
    "ConfigError",
    "SimConfig",
    "astra_topology",
    "collective_name",
    "read_comm_groups",
    "read_network_config",
    "read_system_config",
]

log = logging.getLogger(__name__)

EXPANDED_SLOTS = ("astra", "collective")
"""Execution models of an expanded collective's ops (:attr:`SimConfig.expanded_slots`)."""


def collective_name(name: str) -> str:
    """Chakra name (``ALL_REDUCE``) for any spelling: ``allreduce``, ``all-reduce``, ``ALL_REDUCE``.

    Raises
    ------
    ConfigError
        The name is not a Chakra collective.
    """
    chakra = chakra_name(name)
    if chakra is None:
        raise ConfigError(f"unknown collective {name!r}; expected one of {', '.join(COLLECTIVE_NAMES)}")
    return chakra


# ASTRA-sim system-JSON keys, by what etstore does with them
_IMPL_KEYS = {
    "all-reduce-implementation": "ALL_REDUCE",
    "all-gather-implementation": "ALL_GATHER",
    "reduce-scatter-implementation": "REDUCE_SCATTER",
    "all-to-all-implementation": "ALL_TO_ALL",
}
_MODELLED = {
    "model-shared-bus",
    "L",
    "o",
    "G",
    "local-reduction-delay",
    "scheduling-policy",
    "endpoint-delay",
    "active-chunks-per-dimension",
    "preferred-dataset-splits",
    "local-mem-bw",
    "collective-optimization",
    *_IMPL_KEYS,
}
# read by ASTRA-sim but without effect on its times (outputs and switches of what we model)
_NO_TIME_EFFECT = {"trace-enabled", "local-mem-trace-filename", "track-local-mem", "replay-only"}
# LogGP's gap (back-to-back transfers) and the roofline's peak: they act only when enabled
_SHARED_BUS = ("g",)
_ROOFLINE = ("peak-perf",)
# read by ASTRA-sim, change its times, not modelled here
_NOT_MODELLED = {
    "roofline-enabled": "roofline compute model",
    "all-reduce-implementation-custom": "custom collective",
    "all-gather-implementation-custom": "custom collective",
    "reduce-scatter-implementation-custom": "custom collective",
    "all-to-all-implementation-custom": "custom collective",
    "per-node-custom-implementation": "per-node custom collectives",
}


@dataclass(frozen=True)
class SimConfig:
    """Every knob of :func:`etstore.sim.simulate`; the defaults are ASTRA-sim's regression case.

    The defaults equal ``tests/rt_template/inputs/system_cfg.json`` (LIFO, endpoint
    delay 10 ns, one active chunk per dimension, 4 dataset splits, local memory 50 GB/s,
    ring collectives) with the congestion-unaware network.

    Attributes
    ----------
    scheduling_policy
        ``"FIFO"`` or ``"LIFO"``, ASTRA-sim's collective priority: under LIFO a
        rank's newest collective's chunks are served first, under FIFO its oldest.
        It does not order ready ops (they issue in ascending node id) and, as in
        ASTRA-sim, changes no time while a rank runs one collective at a time
        (``max_comm_ops=1``); see docs/simulator.md.
    congestion
        ``"unaware"``: a message takes ``sum(latency) + size / min(bandwidth)`` over
        its route; ``"aware"``: per link with FIFO link queues (see ``hops``).
    hops
        How a congestion-aware message crosses a multi-hop route: ``"store-and-forward"``
        (each hop receives the whole message before sending it on, as ASTRA-sim's
        congestion-aware links; the default) or ``"cut-through"`` (the head moves on after
        a hop's latency). ``None`` is the default.
    max_comp_ops, max_cpu_ops, max_comm_ops, max_mem_ops
        Ops of each class that may run at once per NPU (ASTRA-sim: 1 each). Comm
        covers sends and collectives. ``None`` means unlimited.
    max_recv_ops
        Receives in flight per NPU; ``None`` (ASTRA-sim) means unlimited.
    duration_unit_ns
        ns per unit of ``duration_micros`` (1000: Chakra durations are µs).
    min_comp_ns
        Duration of a compute op whose ``duration_micros`` is 0 (ASTRA-sim: 1 ns).
    endpoint_delay_ns
        ASTRA-sim's ``endpoint-delay``: paid by native collectives once when a chunk
        enters a ring phase and once per received message (the NPU ↔ memory hop).
    message_overhead_ns
        Added to every message before it is injected (0 in ASTRA-sim).
    local_mem_bw_gb_per_s
        ASTRA-sim's ``local-mem-bw``; GB = 10^9 bytes here, as ASTRA-sim reads it.
    reduction_mem_accesses, copy_mem_accesses
        A local reduction of ``b`` bytes costs ``reduction_mem_accesses`` memory passes
        of ``b / local_mem_bw`` each (ASTRA-sim: one write + two reads = 3); a copy
        costs ``copy_mem_accesses`` passes. Applies to native collectives and to
        algorithm ``COMP_NODE``s whose duration is 0.
    active_chunks_per_dimension
        Chunks of a native collective that may use one network dimension at once.
    preferred_dataset_splits
        Chunks (ASTRA-sim "streams") a native collective is split into.
    integer_ns
        Truncate every delay to whole ns, as ASTRA-sim's integer clock does.
    match_on_size
        Also require equal sizes when matching sends to receives (ASTRA-sim does);
        off by default, matching on (src, dst, tag) as the store does.
    all_reduce_impl, all_gather_impl, reduce_scatter_impl, all_to_all_impl
        Default algorithm per collective: ``"native"`` (ASTRA-sim's native
        implementations, one phase per dimension, see ``native_impls``) or a
        generator name (``ring``, ``direct``, ...).
    algorithm_chunks
        ``chunks`` passed to the algorithm generators.
    native_impls
        ASTRA-sim implementation per network dimension for a ``"native"`` collective,
        by Chakra name: ``{"ALL_REDUCE": ("ring", "direct")}`` (``ring``, ``direct``,
        ``halvingDoubling``, ``doubleBinaryTree``, ``oneRing``...). A collective not
        listed runs ``ring`` on every dimension.
    collective_optimization
        ASTRA-sim's ``collective-optimization`` for a native all-reduce:
        ``"localBWAware"`` (reduce-scatter up the dimensions, all-reduce on the last,
        all-gather down) or ``"baseline"`` (an all-reduce of the whole chunk on every
        dimension).
    model_shared_bus
        ASTRA-sim's ``model-shared-bus``: a native collective's packets cross the NPU ↔
        memory LogGP links (``shared_bus_l_ns``, ``shared_bus_o_ns``,
        ``shared_bus_g_ns_per_byte``: ASTRA-sim's ``L``, ``o``, ``G``; and a fixed
        0.0038 ns/byte memory link) and reductions are also processed at
        ``local_reduction_delay`` ns per 100 bytes + 50 ns, instead of one endpoint
        delay per packet (not on a communicator group smaller than the system, whose
        ring uses ASTRA-sim's fixed 10 ns path). See docs/simulator.md.
    expanded_slots
        How the ops of an expanded collective (sends, receives, reductions and copies
        carrying an algorithm's chunk attributes, as ``expand`` writes them) take NPU
        slots. ``"astra"``: as ASTRA-sim's workload layer runs the exported ``.et``, each
        send on its NPU's one communication slot, each reduction or copy on its one
        compute slot, receives on none (``HardwareResource::occupy``). ``"collective"``:
        as ASTRA-sim runs a custom collective inside its node: the steps take no slot and
        the block that replaced a node holds the communication slot as the node did,
        where the trace records its blocks (``params["collective_blocks"]``). See
        docs/simulator.md, "Expanded collectives: two execution models".
    ignored
        Keys of the ASTRA-sim system file that etstore did not apply, each as
        ``key=value (why)``; :func:`read_system_config` also logs them as one warning.
    extra
        Keys of the system file that are not parameters above (including the ignored ones).
    """

    scheduling_policy: str = "LIFO"
    congestion: str = "unaware"
    hops: str | None = None
    max_comp_ops: int | None = 1
    max_cpu_ops: int | None = 1
    max_comm_ops: int | None = 1
    max_recv_ops: int | None = None
    max_mem_ops: int | None = 1
    duration_unit_ns: float = 1000.0
    min_comp_ns: float = 1.0
    endpoint_delay_ns: float = 10.0
    message_overhead_ns: float = 0.0
    local_mem_bw_gb_per_s: float = 50.0
    reduction_mem_accesses: int = 3
    copy_mem_accesses: int = 2
    active_chunks_per_dimension: int = 1
    preferred_dataset_splits: int = 4
    integer_ns: bool = True
    match_on_size: bool = False
    all_reduce_impl: str = "native"
    all_gather_impl: str = "native"
    reduce_scatter_impl: str = "native"
    all_to_all_impl: str = "native"
    algorithm_chunks: int = 1
    native_impls: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    collective_optimization: str = "localBWAware"
    model_shared_bus: bool = False
    shared_bus_l_ns: float = 0.0
    shared_bus_o_ns: float = 0.0
    shared_bus_g_ns_per_byte: float = 0.0
    local_reduction_delay: int = 1
    expanded_slots: str = "collective"
    ignored: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.scheduling_policy not in ("FIFO", "LIFO"):
            raise ConfigError(f"scheduling_policy must be FIFO or LIFO, not {self.scheduling_policy!r}")
        if self.congestion not in ("aware", "unaware"):
            raise ConfigError(f"congestion must be 'aware' or 'unaware', not {self.congestion!r}")
        if self.hops not in (None, "store-and-forward", "cut-through"):
            raise ConfigError(f"hops must be 'store-and-forward' or 'cut-through', not {self.hops!r}")
        for name in ("max_comp_ops", "max_cpu_ops", "max_comm_ops", "max_recv_ops", "max_mem_ops"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1 or None (unlimited), not {value}")
        if not (0 < self.local_mem_bw_gb_per_s < math.inf):
            raise ConfigError(
                f"local_mem_bw_gb_per_s must be a finite number > 0, not {self.local_mem_bw_gb_per_s}"
            )
        if self.preferred_dataset_splits < 1 or self.active_chunks_per_dimension < 1:
            raise ConfigError("preferred_dataset_splits and active_chunks_per_dimension must be >= 1")
        if self.expanded_slots not in EXPANDED_SLOTS:
            raise ConfigError(
                f"expanded_slots must be {' or '.join(EXPANDED_SLOTS)}, not {self.expanded_slots!r}"
            )
        for name in ("endpoint_delay_ns", "message_overhead_ns", "min_comp_ns", "duration_unit_ns"):
            value = getattr(self, name)
            if not (0 <= value < math.inf):  # NaN or infinity would stall the replay's clock
                raise ConfigError(f"{name} must be a finite number >= 0, not {value}")
        if self.collective_optimization not in ("localBWAware", "baseline"):
            raise ConfigError(
                "collective_optimization must be localBWAware or baseline, "
                f"not {self.collective_optimization!r}"
            )
        impls = {collective_name(k): tuple(v) for k, v in self.native_impls.items()}
        for names in impls.values():
            for name in names:
                parse_implementation(name)  # raises on an unknown name
        object.__setattr__(self, "native_impls", impls)

    def native_impls_for(self, coll: str) -> tuple[str, ...]:
        """ASTRA-sim implementation per dimension for a native ``coll`` (empty: ring everywhere)."""
        key = "REDUCE_SCATTER" if coll == "REDUCE_SCATTER_BLOCK" else coll
        return tuple(self.native_impls.get(key, ()))

    def impl_for(self, coll: str) -> str:
        """Default algorithm name for a Chakra collective (``ALL_REDUCE`` → ``all_reduce_impl``)."""
        return {
            "ALL_REDUCE": self.all_reduce_impl,
            "ALL_GATHER": self.all_gather_impl,
            "REDUCE_SCATTER": self.reduce_scatter_impl,
            "REDUCE_SCATTER_BLOCK": self.reduce_scatter_impl,
            "ALL_TO_ALL": self.all_to_all_impl,
        }.get(coll, "replay")

    def replace(self, **changes: Any) -> SimConfig:
        """A copy with some fields changed."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able parameters (what :func:`etstore.app.runs.record_run` stores)."""
        out = asdict(self)
        out["extra"] = dict(self.extra)
        out["native_impls"] = {k: list(v) for k, v in self.native_impls.items()}
        out["ignored"] = list(self.ignored)
        return out

    @classmethod
    def from_astra(cls, system: Mapping[str, Any], **overrides: Any) -> SimConfig:
        """A config from the parsed contents of an ASTRA-sim system JSON.

        Keys modelled: ``scheduling-policy``, ``endpoint-delay``,
        ``active-chunks-per-dimension``, ``preferred-dataset-splits``,
        ``local-mem-bw``, ``collective-optimization``, ``*-implementation`` (per
        dimension, ASTRA-sim's names), ``model-shared-bus`` with ``L``, ``o``, ``G``,
        ``local-reduction-delay``. Keys that do not change ASTRA-sim's times as given
        (``g`` without the shared bus, ``roofline-enabled: 0``, trace outputs) are
        accepted. Every other key is listed in ``ignored`` (``g`` with the shared bus,
        the roofline, custom collectives, and keys ASTRA-sim does not read either, such
        as ``boost-mode``, unless 0); all keys but the modelled ones land in ``extra``.

        Raises
        ------
        ConfigError
            An unsupported value: ``EXPLICIT`` scheduling, an unknown implementation
            or collective optimization.
        """
        values: dict[str, Any] = {}
        if "scheduling-policy" in system:
            values["scheduling_policy"] = str(system["scheduling-policy"]).upper()
            if values["scheduling_policy"] not in ("FIFO", "LIFO"):
                raise ConfigError(
                    f"scheduling-policy {system['scheduling-policy']!r} is not supported (FIFO or LIFO)"
                )
        if "endpoint-delay" in system:
            values["endpoint_delay_ns"] = float(system["endpoint-delay"])
        if "active-chunks-per-dimension" in system:
            values["active_chunks_per_dimension"] = int(system["active-chunks-per-dimension"])
        if "preferred-dataset-splits" in system:
            values["preferred_dataset_splits"] = int(system["preferred-dataset-splits"])
        if "local-mem-bw" in system:
            values["local_mem_bw_gb_per_s"] = float(system["local-mem-bw"])
        if "model-shared-bus" in system:
            values["model_shared_bus"] = _enabled(system["model-shared-bus"])
        for key, attr in (
            ("L", "shared_bus_l_ns"),
            ("o", "shared_bus_o_ns"),
            ("G", "shared_bus_g_ns_per_byte"),
        ):
            if key in system:
                values[attr] = float(system[key])
        if "local-reduction-delay" in system:
            values["local_reduction_delay"] = int(system["local-reduction-delay"])
        if "collective-optimization" in system:
            opt = str(system["collective-optimization"])
            if opt not in ("localBWAware", "baseline"):
                raise ConfigError(f"collective-optimization {opt!r}: expected localBWAware or baseline")
            values["collective_optimization"] = opt
        impls: dict[str, tuple[str, ...]] = {}
        for key, coll in _IMPL_KEYS.items():
            if key in system:
                impls[coll] = _impls_from_astra(key, system[key])
                values[f"{coll.lower()}_impl"] = "native"
        values["native_impls"] = impls
        values["extra"] = {k: v for k, v in system.items() if k not in _MODELLED}
        values["ignored"] = _ignored_keys(system)
        values.update(overrides)
        return cls(**values)

    @classmethod
    def field_names(cls) -> list[str]:
        """Names of every parameter."""
        return [f.name for f in fields(cls)]


def _impls_from_astra(key: str, value: Any) -> tuple[str, ...]:
    """The per-dimension implementation list of ``key`` (a name or a list of names)."""
    names = [value] if isinstance(value, str) else list(value)
    if not names:
        raise ConfigError(f"{key}: empty implementation list")
    for name in names:
        try:
            parse_implementation(str(name))
        except ConfigError as exc:
            raise ConfigError(f"{key}: {exc}") from exc
    return tuple(str(x) for x in names)


def _enabled(value: Any) -> bool:
    return value not in (0, False, None, "0", "false", "False")


def _ignored_keys(system: Mapping[str, Any]) -> tuple[str, ...]:
    """``key=value (why)`` for every key of a system file that changes ASTRA-sim's times but is
    not modelled here, and for every key ASTRA-sim does not read."""
    out = []
    shared_bus = _enabled(system.get("model-shared-bus", 0))
    roofline = _enabled(system.get("roofline-enabled", 0))
    if shared_bus and int(system.get("active-chunks-per-dimension", 1)) > 1:
        out.append(
            "model-shared-bus=1 with active-chunks-per-dimension > 1 (the queueing of concurrent "
            "chunks' packets on the bus)"
        )
    for key, value in system.items():
        if key in _MODELLED or key in _NO_TIME_EFFECT:
            continue
        if key in _SHARED_BUS:
            if shared_bus:
                out.append(f"{key}={value} (LogGP gap between shared-bus transfers)")
        elif key in _ROOFLINE:
            if roofline:
                out.append(f"{key}={value} (roofline compute model)")
        elif key in _NOT_MODELLED:
            if key != "roofline-enabled" or _enabled(value):
                out.append(f"{key}={json.dumps(value)} ({_NOT_MODELLED[key]})")
        elif _enabled(value):  # switched off, an unread key changes nothing anyway
            out.append(f"{key}={json.dumps(value)} (not read by ASTRA-sim either)")
    return tuple(out)


def read_system_config(path: str | Path, **overrides: Any) -> SimConfig:
    """Read an ASTRA-sim system JSON into a :class:`SimConfig`.

    Parameters
    ----------
    path
        The ``system_cfg.json`` file.
    **overrides
        :class:`SimConfig` fields to set on top (``congestion="aware"``...).

    Raises
    ------
    ConfigError
        The file is missing, not JSON, or holds an unsupported value.

    Examples
    --------
    >>> cfg = read_system_config("../shared/fixtures/astra-sim/tests/rt_template/inputs/system_cfg.json")
    ... # doctest: +SKIP
    >>> cfg.scheduling_policy, cfg.preferred_dataset_splits  # doctest: +SKIP
    ('LIFO', 4)
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: no such system config file") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: line {exc.lineno}: not valid JSON ({exc.msg})") from exc
    except RecursionError:
        raise ConfigError(f"{path}: JSON nested too deeply to be a system config") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object of system parameters")
    try:
        config = SimConfig.from_astra(data, **overrides)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    if config.ignored:
        log.warning("%s: not modelled, ignored: %s", path, "; ".join(config.ignored))
    return config
