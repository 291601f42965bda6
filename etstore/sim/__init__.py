"""Simulation: replay traces over a network topology and record metrics in DuckDB.

Entry points::

    from etstore.sim import SimConfig, simulate, read_system_config, read_network_config
    net = read_network_config("network_cfg.yml")
    result = simulate(trace, net.topology, config=read_system_config("system_cfg.json"))
    result.total_ns, result.ranks, result.collectives

    from etstore.sim import record_run, sweep
    record_run(duckdb_con, result, trace_name="allreduce")

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
from etstore.sim.metrics import create_schema, record_run, record_sweep
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
    "create_schema",
    "read_comm_groups",
    "read_network_config",
    "read_system_config",
    "record_run",
    "record_sweep",
    "simulate",
    "sweep",
]
