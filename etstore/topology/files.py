"""Topology files: etstore's YAML/JSON and ASTRA-sim's analytical network YAML.

One loader reads either format; :func:`read_topology` accepts both and gives a
:class:`~etstore.topology.Topology`, :func:`read_network_config` reads the
ASTRA-sim format only and also gives its per-dimension kinds and sizes, which a
simulator needs to run collectives one dimension at a time. :func:`parse_topology`
takes a spec or a file name, whichever it is given.

Bandwidth is in GB/s with GB = 2^30 bytes, latency in ns.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from etstore.errors import TopologyError
from etstore.topology.axes import (
    DEFAULT_BANDWIDTH_GB_PER_S,
    DEFAULT_LATENCY_NS,
    Dim,
    Values,
    dims_spec,
    require_budget,
)
from etstore.topology.core import Topology
from etstore.units import format_bytes

__all__ = [
    "ASTRA_KINDS",
    "AstraNetwork",
    "astra_topology",
    "parse_topology",
    "read_network_config",
    "read_topology",
]

log = logging.getLogger(__name__)

ASTRA_KINDS = {"ring": "ring", "fullyconnected": "fc", "switch": "switch"}
"""ASTRA-sim topology kind (lower case) → axis kind."""

_ASTRA_KEYS = ("topology", "npus_count", "bandwidth", "latency")
_OWN_KEYS = frozenset(
    {
        "format",
        "name",
        "spec",
        "npus",
        "links",
        "bandwidth_gb_per_s",
        "latency_ns",
        "bidirectional",
        "fail_npus",
        "fail_links",
    }
)
_LINK_KEYS = frozenset({"src", "dst", "bandwidth_gb_per_s", "latency_ns", "bidirectional"})


class AstraNetwork(NamedTuple):
    """An analytical network config: the topology and its dimensions."""

    topology: Topology
    """Directed links between NPUs (NPU id = Σ coordinate_d · stride_d, dimension 0 fastest)."""
    kinds: tuple[str, ...]
    """ASTRA-sim topology kind per dimension (``Ring``, ``FullyConnected``, ``Switch``)."""
    dims: tuple[int, ...]
    """NPUs per dimension."""


# ------------------------------------------------------------------ entry points
def parse_topology(
    spec: str | Path,
    *,
    bandwidth_gb_per_s: Values = DEFAULT_BANDWIDTH_GB_PER_S,
    latency_ns: Values = DEFAULT_LATENCY_NS,
) -> Topology:
    """A topology from a spec (see :meth:`Topology.from_spec`) or, if ``spec`` names a file, from that file.

    A string ending in ``.yml``, ``.yaml`` or ``.json``, or any existing path, is read
    with :func:`read_topology`; anything else is parsed as a spec.

    Raises
    ------
    TopologyError
        As :meth:`Topology.from_spec` or :func:`read_topology`.
    """
    text = str(spec)
    if isinstance(spec, Path) or text.lower().endswith((".yml", ".yaml", ".json")) or Path(text).is_file():
        return read_topology(text, bandwidth_gb_per_s=bandwidth_gb_per_s, latency_ns=latency_ns)
    return Topology.from_spec(text, bandwidth_gb_per_s=bandwidth_gb_per_s, latency_ns=latency_ns)


def read_topology(
    path: str | Path,
    *,
    bandwidth_gb_per_s: Values = DEFAULT_BANDWIDTH_GB_PER_S,
    latency_ns: Values = DEFAULT_LATENCY_NS,
) -> Topology:
    """Read a topology file: etstore's YAML/JSON or ASTRA-sim's analytical network YAML.

    ASTRA-sim files have ``topology: [Ring|FullyConnected|Switch, ...]`` with
    ``npus_count``, ``bandwidth`` (GB/s) and ``latency`` (ns) lists, one entry per
    dimension (see :func:`read_network_config`); the topology is named by its
    canonical spec. etstore files have either ``spec:`` or ``npus:`` plus
    ``links:`` (see ``docs/topology.md``), and optionally ``fail_npus`` /
    ``fail_links``.

    Raises
    ------
    TopologyError
        If the file is missing, not YAML/JSON, lacks a key, has a bad value (the
        message names the file and the key), or describes a disconnected topology.

    Notes
    -----
    O(E) after parsing.
    """
    path = Path(path)
    data = _load_mapping(path)
    if "topology" in data and "npus_count" in data:
        topo = _astra_network(data, path).topology
        return topo.renamed(dims_spec(topo.dims))
    try:
        return _from_own(data, path, bandwidth_gb_per_s, latency_ns)
    except TopologyError as exc:
        raise _in_file(path, exc) from exc


def read_network_config(path: str | Path) -> AstraNetwork:
    """Read an ASTRA-sim analytical network YAML into a :class:`Topology` and its dimensions.

    Each dimension ``d`` of ``n_d`` NPUs becomes links between NPUs that differ only
    in coordinate ``d`` (:meth:`Topology.compose`): ``Ring`` links each NPU to its
    two ring neighbours, ``FullyConnected`` links every pair, and ``Switch`` links
    every pair, unwound as :meth:`Topology.switch` (a message crosses two hops; the
    simulator gives it the full port bandwidth). A dimension of 1 NPU adds no links
    but keeps its place. The topology is named ``ring:8`` for one dimension, else
    ``astra-Ring-Switch:8x4``. Bandwidth is GB/s with GB = 2^30, latency ns.

    Raises
    ------
    TopologyError
        The file is missing, not YAML, lacks a key, its lists differ in length, or a
        kind, count or value is bad (the message names the file), or the network is
        disconnected.

    Notes
    -----
    O(Σ_d N · n_d) links for rings, O(N · Σ_d n_d) for fully connected dimensions.
    """
    path = Path(path)
    return _astra_network(_load_mapping(path), path)


def astra_topology(
    kinds: Sequence[str],
    dims: Sequence[int],
    bandwidth_gb_per_s: Sequence[float],
    latency_ns: Sequence[float],
    *,
    name: str | None = None,
) -> Topology:
    """The topology of an analytical network config (see :func:`read_network_config`).

    Parameters
    ----------
    kinds
        ASTRA-sim kind per dimension: ``Ring``, ``FullyConnected`` or ``Switch``
        (any case).
    dims
        NPUs per dimension (≥ 1), dimension 0 varying fastest in NPU ids.
    bandwidth_gb_per_s, latency_ns
        Per dimension; GB = 2^30 bytes.
    name
        Defaults to ``ring:8`` for one dimension, else ``astra-Ring-Switch:8x4``.

    Raises
    ------
    TopologyError
        Lists of different lengths, an unknown kind, or a dimension of no NPU.
    """
    if not (len(kinds) == len(dims) == len(bandwidth_gb_per_s) == len(latency_ns)):
        raise TopologyError(
            "topology, npus_count, bandwidth and latency must have one entry per dimension "
            f"(got {len(kinds)}, {len(dims)}, {len(bandwidth_gb_per_s)}, {len(latency_ns)})"
        )
    axes = []
    for kind, n, bw, lat in zip(kinds, dims, bandwidth_gb_per_s, latency_ns, strict=True):
        k = ASTRA_KINDS.get(str(kind).lower())
        if k is None:
            raise TopologyError(f"unknown topology {kind!r}; expected Ring, FullyConnected or Switch")
        axes.append(Dim(k, int(n), float(bw), float(lat)))
    if name is None:
        name = (
            f"{str(kinds[0]).lower()}:{int(dims[0])}"
            if len(dims) == 1
            else f"astra-{'-'.join(str(k) for k in kinds)}:{'x'.join(str(int(n)) for n in dims)}"
        )
    return Topology.compose(axes, name=name)


# ------------------------------------------------------------------ loading
_PEAK_PER_BYTE = {True: 16, False: 200}
"""Peak bytes per byte of a topology file while it is parsed, JSON (measured 13x) and YAML
(PyYAML builds a node graph first: measured 156x), rounded up."""


def _load_mapping(path: Path) -> dict[str, Any]:
    """The top-level mapping of a JSON (``.json``) or YAML file, its parsing checked against the
    memory budget from the file's size before it is read."""
    is_json = path.suffix.lower() == ".json"
    try:
        size = path.stat().st_size
        kind = "JSON" if is_json else "YAML"
        require_budget(size * _PEAK_PER_BYTE[is_json], f"{path}: parsing {format_bytes(size)} of {kind}")
        text = path.read_text()
    except OSError as exc:
        raise TopologyError(f"{path}: cannot read topology file ({exc.strerror})") from exc
    try:
        if is_json:
            data = json.loads(text)
        else:
            import yaml  # optional and slow to import; only YAML files need it

            data = yaml.safe_load(text)
    except Exception as exc:  # json.JSONDecodeError or yaml.YAMLError; they share no base
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TopologyError(f"{path}: not valid {'JSON' if is_json else 'YAML'}: {first}") from exc
    if not isinstance(data, dict):
        raise TopologyError(f"{path}: expected a mapping at the top level")
    return data


def _in_file(path: Path, exc: TopologyError) -> TopologyError:
    """``exc`` with its message prefixed by the file, unless it already names it."""
    msg = str(exc)
    return TopologyError(msg if msg.startswith(str(path)) else f"{path}: {msg}")


# -------------------------------------------------------------- ASTRA-sim
def _number_list(data: Mapping[str, Any], key: str, path: Path) -> list[float]:
    """``data[key]`` as a list of numbers (a scalar is a list of one)."""
    value = data[key]
    if not isinstance(value, list):
        value = [value]
    try:
        return [float(v) for v in value]
    except (TypeError, ValueError) as exc:
        raise TopologyError(f"{path}: {key} must be a list of numbers, got {value!r}") from exc


def _astra_network(data: Mapping[str, Any], path: Path) -> AstraNetwork:
    """The ASTRA-sim network a loaded file describes, checked and connected."""
    missing = [k for k in _ASTRA_KEYS if k not in data]
    if missing:
        raise TopologyError(f"{path}: missing key {missing[0]!r}")
    kinds = data["topology"] if isinstance(data["topology"], list) else [data["topology"]]
    counts = _number_list(data, "npus_count", path)
    bws = _number_list(data, "bandwidth", path)
    lats = _number_list(data, "latency", path)
    for count in counts:
        if count != int(count):
            raise TopologyError(f"{path}: npus_count {count!r} is not an integer")
    dims = tuple(int(c) for c in counts)
    try:
        topo = astra_topology(kinds, dims, bws, lats)
        topo.require_connected()
    except TopologyError as exc:
        raise _in_file(path, exc) from exc
    return AstraNetwork(topo, tuple(str(k) for k in kinds), dims)


# ---------------------------------------------------------------- etstore's own
def _from_own(data: Mapping[str, Any], path: Path, default_bw: Values, default_lat: Values) -> Topology:
    """etstore's format: ``spec`` or ``npus`` + ``links``, then failures and a name."""
    extra = sorted(set(data) - _OWN_KEYS)
    if extra:
        raise TopologyError(
            f"{path}: unknown key {extra[0]!r}; expected spec or npus + links (see docs/topology.md)"
        )
    bw = data.get("bandwidth_gb_per_s", default_bw)
    lat = data.get("latency_ns", default_lat)
    if "spec" in data:
        if "links" in data or "npus" in data:
            raise TopologyError(f"{path}: give either spec or npus + links, not both")
        topo = Topology.from_spec(str(data["spec"]), bandwidth_gb_per_s=bw, latency_ns=lat)
    elif "npus" in data and "links" in data:
        topo = _explicit_links(data, path, bw, lat)
    else:
        raise TopologyError(f"{path}: expected spec, or npus and links")
    fail_npus = data.get("fail_npus") or []
    fail_links = data.get("fail_links") or []
    if fail_npus or fail_links:
        try:
            pairs = [(int(a), int(b)) for a, b in fail_links]
            topo = topo.without(npus=[int(x) for x in fail_npus], links=pairs)
        except (TypeError, ValueError) as exc:
            raise TopologyError(f"{path}: fail_npus must list NPU ids and fail_links [a, b] pairs") from exc
    if "name" in data:
        topo = topo.renamed(str(data["name"]))
    elif "spec" not in data:
        topo = topo.renamed(path.stem)
    topo.require_connected()
    return topo


def _explicit_links(data: Mapping[str, Any], path: Path, bw: Any, lat: Any) -> Topology:
    """A topology from an explicit ``links`` list (pairs or mappings), both ways unless told."""
    try:
        n = int(data["npus"])
        bw0, lat0 = float(bw), float(lat)
    except (TypeError, ValueError) as exc:
        raise TopologyError(
            f"{path}: npus must be an integer and bandwidth_gb_per_s/latency_ns numbers"
        ) from exc
    both_default = bool(data.get("bidirectional", True))
    links = data["links"]
    if not isinstance(links, list):
        raise TopologyError(f"{path}: links must be a list")
    src: list[int] = []
    dst: list[int] = []
    lats: list[float] = []
    bws: list[float] = []
    for i, item in enumerate(links):
        a, b, lb, ll, both = _one_link(i, item, path, bw0, lat0, both_default)
        for x, y in ((a, b), (b, a)) if both else ((a, b),):
            src.append(x)
            dst.append(y)
            lats.append(ll)
            bws.append(lb)
    try:
        return Topology(
            n,
            np.array(src, dtype=np.int64),
            np.array(dst, dtype=np.int64),
            np.array(lats),
            np.array(bws),
            str(data.get("name", path.stem)),
        )
    except TopologyError as exc:
        raise TopologyError(f"{path}: {exc}") from exc


def _one_link(
    i: int, item: Any, path: Path, bw0: float, lat0: float, both_default: bool
) -> tuple[int, int, float, float, bool]:
    """``(src, dst, bandwidth, latency, bidirectional)`` of link entry ``i``."""
    try:
        if isinstance(item, dict):
            unknown = set(item) - _LINK_KEYS
            if unknown:
                raise TopologyError(f"{path}: link {i} has unknown key {sorted(unknown)[0]!r}")
            return (
                int(item["src"]),
                int(item["dst"]),
                float(item.get("bandwidth_gb_per_s", bw0)),
                float(item.get("latency_ns", lat0)),
                bool(item.get("bidirectional", both_default)),
            )
        if isinstance(item, list) and len(item) == 2:
            return int(item[0]), int(item[1]), bw0, lat0, both_default
    except (KeyError, TypeError, ValueError) as exc:
        raise TopologyError(f"{path}: link {i} ({item!r}) needs integer src/dst and numeric values") from exc
    raise TopologyError(f"{path}: link {i} must be [src, dst] or a mapping with src and dst")
