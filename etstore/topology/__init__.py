"""Topologies: the value type, routes and cuts, the spec grammar and the file readers.

Every stage that needs a network (synthesis, simulation, analyses) imports it from here.
"""

from __future__ import annotations

from etstore.topology.core import (
    DEFAULT_BANDWIDTH_GB_PER_S,
    DEFAULT_LATENCY_NS,
    GIB,
    Dim,
    Topology,
    parse_topology,
    read_topology,
)

__all__ = [
    "DEFAULT_BANDWIDTH_GB_PER_S",
    "DEFAULT_LATENCY_NS",
    "GIB",
    "Dim",
    "Topology",
    "parse_topology",
    "read_topology",
]
