"""Axes of built-in topologies: the :class:`Dim` value, units, the product construction.

A built-in topology is a product of axes (a ring, a mesh line, a fully connected
group, a switch). NPU ``u`` has coordinate ``(u // stride_k) % size_k`` on axis k,
axis 0 varying fastest, and links join NPUs that differ in one coordinate. This
module builds those links as numpy arrays and writes an axis list back as a spec.

Bandwidth is in GB/s with GB = 2^30 bytes (ASTRA-sim's convention), latency in ns.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from etstore.errors import TopologyError
from etstore.units import budget_exceeded

__all__ = [
    "AXIS_KINDS",
    "DEFAULT_BANDWIDTH_GB_PER_S",
    "DEFAULT_LATENCY_NS",
    "GIB",
    "MAX_NPUS",
    "Dim",
    "Values",
    "axes_of",
    "check_axes",
    "compose_links",
    "composed_links",
    "coordinates",
    "dim_spec",
    "dims_spec",
    "link_values",
    "per_axis",
    "require_budget",
    "values_spec",
]

log = logging.getLogger(__name__)

GIB = float(1 << 30)  # ASTRA-sim's "GB" in GB/s is 2^30 bytes
DEFAULT_BANDWIDTH_GB_PER_S = 50.0
DEFAULT_LATENCY_NS = 500.0
MAX_NPUS = 1 << 20
# bytes per link the budget check charges a build; an upper bound since compose_links writes the links in
# place (measured peak 24 B/link, 42 with a mesh line's mask; the lexsort it replaced took 96)
_BUILD_BYTES_PER_LINK = 96
AXIS_KINDS = ("ring", "uniring", "line", "fc", "switch")

Values = float | Sequence[float]
"""One value for every axis, or one per axis."""


class Dim(NamedTuple):
    """One axis of a built-in topology (NPU ids vary fastest along axis 0)."""

    kind: str
    """``ring``, ``uniring``, ``line`` (a mesh axis), ``fc`` or ``switch``."""
    size: int
    """NPUs along this axis."""
    bandwidth_gb_per_s: float
    """Per-link bandwidth (GB/s, GB = 2^30 B); for a switch, per-NPU port bandwidth."""
    latency_ns: float
    """Per-link latency (ns); for a switch, per hop (a message takes two)."""


# ------------------------------------------------------------------ values
def per_axis(value: Values, axes: int, key: str, where: str) -> list[float]:
    """``value`` spread over ``axes`` axes (one value repeats); ``where`` prefixes the error."""
    if isinstance(value, (int, float)):
        return [float(value)] * axes
    vals = [float(v) for v in value]
    if len(vals) == 1:
        return vals * axes
    if len(vals) != axes:
        raise TopologyError(f"{where}: {key} has {len(vals)} values but the topology has {axes} axes")
    return vals


def axes_of(kind: str, sizes: Sequence[int], bw: Values, lat: Values) -> list[Dim]:
    """Axes of one kind with the given sizes and per-axis (or shared) bandwidth and latency."""
    sizes = list(sizes)
    bws = per_axis(bw, len(sizes), "bw", "topology")
    lats = per_axis(lat, len(sizes), "lat", "topology")
    return [Dim(kind, int(s), b, la) for s, b, la in zip(sizes, bws, lats, strict=True)]


def link_values(d: Dim) -> tuple[float, float]:
    """``(bandwidth_gb_per_s, latency_ns)`` of each link of axis ``d``.

    A switch of ``n`` NPUs is unwound to point-to-point links of ``bw / (n - 1)`` (a
    port shared fairly by its peers) and twice the latency (NPU → switch → NPU).
    """
    if d.kind == "switch" and d.size > 1:
        return d.bandwidth_gb_per_s / (d.size - 1), 2 * d.latency_ns
    return d.bandwidth_gb_per_s, d.latency_ns


# ------------------------------------------------------------------- specs
def dim_spec(d: Dim) -> str:
    """``kind:size`` of one axis."""
    return f"{d.kind}:{d.size}"


def _fmt(x: float) -> str:
    return f"{x:g}"


def dims_spec(dims: Sequence[Dim]) -> str:
    """Canonical spec of composed axes (mesh and torus axes written per axis)."""
    kind = {"line": "mesh", "ring": "ring", "uniring": "uniring", "fc": "fc", "switch": "switch"}
    shape = "+".join(f"{kind[d.kind]}:{d.size}" for d in dims)
    return f"{shape},{values_spec(dims)}"


def values_spec(dims: Sequence[Dim]) -> str:
    """``bw=...,lat=...`` with one value, or one per axis where they differ."""
    bws = [_fmt(d.bandwidth_gb_per_s) for d in dims]
    lats = [_fmt(d.latency_ns) for d in dims]
    bw = bws[0] if len(set(bws)) == 1 else "/".join(bws)
    lat = lats[0] if len(set(lats)) == 1 else "/".join(lats)
    return f"bw={bw},lat={lat}"


# ------------------------------------------------------------ construction
def check_axes(dims: Sequence[Dim]) -> list[Dim]:
    """The axes as :class:`Dim` values, validated.

    Raises
    ------
    TopologyError
        No axis, an unknown kind, an axis of no NPU, a bandwidth ≤ 0, a negative
        latency, more than :data:`MAX_NPUS` NPUs in all, or links whose arrays would
        not fit the memory budget (:func:`etstore.units.memory_budget`).
    """
    out = [Dim(*d) for d in dims]
    if not out:
        raise TopologyError("topology: needs at least one dimension")
    for d in out:
        if d.kind not in AXIS_KINDS:
            raise TopologyError(f"topology: unknown axis kind {d.kind!r}")
        if d.size < 1:
            raise TopologyError(f"topology {dim_spec(d)}: an axis needs at least 1 NPU, got {d.size}")
        if not (d.bandwidth_gb_per_s > 0 and d.latency_ns >= 0):
            raise TopologyError(f"topology {dim_spec(d)}: needs bandwidth > 0 and latency >= 0")
    n = math.prod(d.size for d in out)
    if n > MAX_NPUS:
        raise TopologyError(f"topology: {n} NPUs is more than the supported {MAX_NPUS}")
    links = composed_links(out)
    require_budget(links * _BUILD_BYTES_PER_LINK, f"topology {dims_spec(out)}: building its {links:,} links")
    return out


def require_budget(need: float, what: str) -> None:
    """Refuse upfront, before allocating, what would need more than the memory budget.

    Raises
    ------
    TopologyError
        ``need`` bytes exceed :func:`etstore.units.memory_budget`; the message names
        ``what``, the estimate, the budget and how to raise it.
    """
    message = budget_exceeded(need, what)
    if message is not None:
        raise TopologyError(message)


def coordinates(num: int, sizes: Sequence[int]) -> np.ndarray:
    """Coordinates (``num × len(sizes)``, int64) of NPU ids, axis 0 fastest."""
    ids = np.arange(num, dtype=np.int64)
    out = np.empty((num, len(sizes)), dtype=np.int64)
    stride = 1
    for k, n in enumerate(sizes):
        out[:, k] = (ids // stride) % n
        stride *= n
    return out


def composed_links(dims: Sequence[Dim]) -> int:
    """How many links :func:`compose_links` makes for these axes."""
    n = math.prod(d.size for d in dims)
    total = 0
    for d in dims:
        rest = n // d.size
        if d.size < 2:
            continue
        if d.kind == "line":
            total += 2 * (d.size - 1) * rest
        elif d.kind == "uniring" or (d.kind == "ring" and d.size == 2):
            total += d.size * rest
        elif d.kind == "ring":
            total += 2 * d.size * rest
        else:
            total += d.size * (d.size - 1) * rest
    return total


def _axis_columns(d: Dim) -> list[int]:
    """Steps of each link column of axis ``d`` (``+1``/``-1`` for neighbours, ``0`` for all pairs)."""
    if d.size < 2:
        return []
    if d.kind == "uniring" or (d.kind == "ring" and d.size == 2):
        return [1]
    if d.kind in ("line", "ring"):
        return [1, -1]
    return [0] * (d.size - 1)  # fc, switch: the other coordinates, ascending


def compose_links(dims: Sequence[Dim]) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The links of a product of axes: ``(num_npus, src, dst, latency_ns, bandwidth_gb_per_s)``.

    Links join NPUs that differ in one coordinate, as that axis's kind says:
    ``line`` (neighbours), ``ring`` (neighbours with wrap-around; one link each way
    for 2 NPUs), ``uniring`` (``+1`` only), ``fc`` (all pairs), ``switch`` (all
    pairs, values from :func:`link_values`). An axis of 1 NPU adds no link. Each
    NPU's links are listed axis 0 first, ``+`` before ``-``.

    Raises
    ------
    TopologyError
        As :func:`check_axes`.

    Notes
    -----
    O(E) numpy work, E = Σ_k N · (links per NPU on axis k). Every NPU has the same
    link columns (a mesh line's ends leave one out), so the links are written as an
    N × columns table in their final order, with no sort: 24 bytes per link at the
    peak (the result itself), 42 with a mesh line.
    """
    dims = check_axes(dims)
    n = math.prod(d.size for d in dims)
    u = np.arange(n, dtype=np.int32)
    steps = [_axis_columns(d) for d in dims]
    width = sum(len(c) for c in steps)
    dst = np.empty((n, width), dtype=np.int32)
    keep = np.ones((n, width), dtype=bool) if any(d.kind == "line" and d.size > 1 for d in dims) else None
    lat_col = np.empty(width)
    bw_col = np.empty(width)
    col, stride = 0, 1
    for d, cols in zip(dims, steps, strict=True):
        if cols:
            coord = (u // stride) % d.size
            base = u - coord * stride
            bw, lat = link_values(d)
            lat_col[col : col + len(cols)] = lat
            bw_col[col : col + len(cols)] = bw
            if cols[0] == 0:  # all pairs: column j goes to coordinate j, skipping the NPU's own
                j = np.arange(d.size - 1, dtype=np.int32)
                block = dst[:, col : col + len(cols)]
                np.greater_equal(j[None, :], coord[:, None], out=block)
                block += j[None, :]
                block *= stride
                block += base[:, None]
            else:
                for i, step in enumerate(cols):
                    other = coord + step
                    if d.kind == "line":
                        assert keep is not None
                        keep[:, col + i] = (other >= 0) & (other < d.size)
                        np.clip(other, 0, d.size - 1, out=other)
                    else:
                        other %= d.size
                    dst[:, col + i] = base + other * stride
            col += len(cols)
        stride *= d.size
    if keep is None:
        src = np.repeat(u, width)
        return n, src, dst.ravel(), np.tile(lat_col, n), np.tile(bw_col, n)
    mask = keep.ravel()
    return (
        n,
        np.repeat(u, width)[mask],
        dst.ravel()[mask],
        np.tile(lat_col, n)[mask],
        np.tile(bw_col, n)[mask],
    )
