"""The links the congestion-aware loop walks: the topology's, plus a node and two ports per switch.

A switch axis of a built-in topology is, for synthesis and for the congestion-unaware
model, unwound into pairwise NPU links. ASTRA-sim's congestion-aware backend instead
gives every switch a device of its own and connects each NPU to it by one link each
way, so all of an NPU's sends on that axis share its uplink and all messages to an NPU
share its downlink, and a message is serialised once per link (NPU → switch, switch →
NPU). :func:`hop_graph` builds that graph as arrays: the topology's links keep their
indices (the pairwise switch links stay, unused by the routes), port links follow.

Node ids: NPUs ``0 .. N-1``, then one node per switch instance, axis by axis; the
instance of NPU ``u`` on axis ``k`` is its coordinates on every other axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from etstore.topology import GIB, Dim

__all__ = ["HopGraph", "hop_graph"]


@dataclass(frozen=True, eq=False)
class HopGraph:
    """Nodes and links of the congestion-aware loop; times in ns, bandwidth in bytes/ns."""

    num_nodes: int
    """NPUs plus switch nodes."""
    dst: np.ndarray
    """int64 per link: the node it leads to (topology links first, then ports)."""
    latency_ns: np.ndarray
    bytes_per_ns: np.ndarray
    next_link: np.ndarray
    """int32 ``[dst, node]``, ``num_nodes`` square: the link a message for NPU ``dst`` takes
    from ``node`` (-1: none; rows of switch nodes are all -1, a switch is never a destination)."""
    replaced: np.ndarray
    """bool per topology link: a pairwise switch link whose messages take the ports instead."""


def _strides(axes: Sequence[Dim]) -> list[int]:
    """NPU-id stride of each axis (axis 0 varies fastest)."""
    out, s = [], 1
    for d in axes:
        out.append(s)
        s *= int(d.size)
    return out


def hop_graph(
    num_npus: int,
    axes: Sequence[Dim],
    label: np.ndarray,
    next_link: np.ndarray,
    dst: np.ndarray,
    latency_ns: np.ndarray,
    bytes_per_ns: np.ndarray,
) -> HopGraph:
    """The congestion-aware graph of a topology whose axes are ``axes``.

    Parameters
    ----------
    num_npus
        NPUs of the topology (the product of the axis sizes).
    axes
        The topology's axes; every ``switch`` axis of two or more NPUs gets switch nodes.
    label
        Per topology link, the axis it moves along.
    next_link
        The topology's ``[dst, src]`` next-link table (int32, every row built).
    dst, latency_ns, bytes_per_ns
        The topology's links (destination NPU, ns, bytes/ns).

    Returns
    -------
    HopGraph
        The same routes, each pairwise switch hop ``u → v`` replaced by ``u``'s uplink
        to the switch and the switch's downlink to ``v``; without switch axes the
        topology's own links and table.

    Notes
    -----
    O(V² + E) time and an int32 table of V² for V = NPUs + switch nodes.
    """
    n = num_npus
    nl = len(dst)
    switch_axes = [k for k, d in enumerate(axes) if d.kind == "switch" and d.size > 1]
    if not switch_axes:
        return HopGraph(n, dst, latency_ns, bytes_per_ns, next_link, np.zeros(nl, dtype=bool))
    strides = _strides(axes)
    npu = np.arange(n, dtype=np.int64)
    dsts, lats, bws = [dst], [latency_ns], [bytes_per_ns]
    nodes, links = n, nl
    ports: list[tuple[int, int, int, int]] = []  # (axis, first switch node, first uplink, instances)
    for k in switch_axes:
        d = axes[k]
        size, stride = int(d.size), strides[k]
        instances = n // size
        switch = nodes + npu % stride + (npu // (stride * size)) * stride
        dsts += [switch, npu]  # uplinks u -> its switch, then downlinks switch -> u
        lats.append(np.full(2 * n, float(d.latency_ns)))
        bws.append(np.full(2 * n, float(d.bandwidth_gb_per_s) * GIB / 1e9))
        ports.append((k, nodes, links, instances))
        nodes += instances
        links += 2 * n
    table = np.full((nodes, nodes), -1, dtype=np.int32)
    table[:n, :n] = next_link
    own = table[:n, :n]
    axis_of = np.full(own.shape, -1, dtype=np.int16)  # the axis of each first hop (-1: none)
    routed = own >= 0
    axis_of[routed] = label[own[routed]]
    for k, first_node, first_up, instances in ports:
        # an NPU's pairwise hop on axis k becomes its uplink ...
        hit = axis_of == k
        own[hit] = (first_up + np.broadcast_to(npu, own.shape)[hit]).astype(np.int32)
        # ... and the switch sends a message for d down to its member with d's coordinate on k
        size, stride = int(axes[k].size), strides[k]
        inst = np.arange(instances, dtype=np.int64)
        base = inst % stride + (inst // stride) * stride * size  # member with coordinate 0
        coord = (npu // stride) % size
        member = base[None, :] + coord[:, None] * stride  # [d, instance]
        table[:n, first_node : first_node + instances] = (first_up + n + member).astype(np.int32)
    replaced = np.isin(label, switch_axes)
    return HopGraph(
        nodes,
        np.concatenate(dsts).astype(np.int64),
        np.concatenate(lats).astype(np.float64),
        np.concatenate(bws).astype(np.float64),
        table,
        replaced,
    )
