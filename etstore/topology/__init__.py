"""Topologies: the value type, routes and cuts, the spec grammar and the file readers.

Every stage that needs a network (synthesis, simulation, analyses) imports it from here.

Modules, each importing only those above it:

``axes``
    :class:`Dim`, units and defaults, the product construction of built-in shapes.
``links``
    :class:`~etstore.topology.links.LinkArrays`, the checked link arrays.
``paths``, ``cuts``
    Hop counts, transfer times, next-link routes, link dimensions; the bisection.
``spec``
    The spec grammar (``mesh2d:8x8,bw=100,fail=3``) and the default spec for a trace.
``core``
    :class:`Topology`: the above as methods, and the constructors.
``files``
    etstore's YAML/JSON and ASTRA-sim's analytical network YAML.
"""

from __future__ import annotations

from etstore.topology.axes import DEFAULT_BANDWIDTH_GB_PER_S, DEFAULT_LATENCY_NS, GIB, Dim
from etstore.topology.core import Topology
from etstore.topology.files import (
    AstraNetwork,
    astra_topology,
    parse_topology,
    read_network_config,
    read_topology,
)
from etstore.topology.links import LinkArrays
from etstore.topology.paths import dims_of, link_dimensions
from etstore.topology.spec import default_topology

__all__ = [
    "DEFAULT_BANDWIDTH_GB_PER_S",
    "DEFAULT_LATENCY_NS",
    "GIB",
    "AstraNetwork",
    "Dim",
    "LinkArrays",
    "Topology",
    "astra_topology",
    "default_topology",
    "dims_of",
    "link_dimensions",
    "parse_topology",
    "read_network_config",
    "read_topology",
]
