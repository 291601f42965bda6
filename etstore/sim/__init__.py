"""Simulation: replay traces over a network topology; the results are Arrow tables.

Entry points::

    from etstore.sim import SimConfig, simulate, read_system_config, read_network_config
    net = read_network_config("network_cfg.yml")
    result = simulate(trace, net.topology, config=read_system_config("system_cfg.json"))
    result.total_ns, result.ranks, result.collectives

Nothing here writes to a store: :mod:`etstore.app.runs` records a result as a run
(``record_run(store.warehouse, result)``), :mod:`etstore.app.compare` and
:mod:`etstore.app.calibrate` load, simulate and record comparisons and calibrations.

Topology construction lives in :mod:`etstore.topology` (imported from there,
not re-exported here).
"""

from __future__ import annotations

from etstore.errors import ConfigError, SimulationError
from etstore.sim._algorithms import BUILTIN_ALGORITHMS
from etstore.sim.config import (
    AstraNetwork,
    SimConfig,
    read_comm_groups,
    read_network_config,
    read_system_config,
)
from etstore.sim.engine import simulate
from etstore.sim.network import Network
from etstore.sim.result import SimResult, busbw_factor
from etstore.sim.sweep import collective_workload, sweep

__all__ = [
    "BUILTIN_ALGORITHMS",
    "AstraNetwork",
    "ConfigError",
    "Network",
    "SimConfig",
    "SimResult",
    "SimulationError",
    "busbw_factor",
    "collective_workload",
    "read_comm_groups",
    "read_network_config",
    "read_system_config",
    "simulate",
    "sweep",
]
