"""Network models over a :class:`~etstore.topology.Topology`: routes and message times.

Routing is shortest-path with *dimension order* where the topology has dimensions:
next-hop tables are computed once per destination by a vectorised breadth-first
search over the link arrays, and among the shortest next hops a node prefers the
link that moves along the lowest dimension (X before Y before Z on a mesh or torus),
then the lowest link index. Without dimensions every link is dimension 0 and ties
break by link index, so routes are deterministic.

Two message models sit on the routes (FORMATS.md §3):

* congestion-unaware: ``Σ latency + size / min(bandwidth)`` over the route, i.e.
  ``hops × latency + size / bandwidth`` on uniform links; vectorised here
  (:meth:`Network.message_times_ns`). On a topology ASTRA-sim's analytical network
  can describe (intact ``ring`` / ``fc`` / ``switch`` axes) the time is instead
  ASTRA-sim's congestion-unaware closed form (its ``MultiDimTopology::send``): a
  message is charged as a transfer inside the *first* axis, lowest first, on which
  source and destination differ — that axis' hop count between their coordinates
  there (a ring's shorter way, 1 fully connected, 2 through a switch) times its
  latency, plus ``size / bandwidth`` of that axis; the other axes cost nothing. On one
  axis this is the route's time; across axes it is less (:meth:`Network.unaware_metrics`).
  The bytes still cross every link of the route (:meth:`Network.link_loads`), which is
  what the overload check measures.
* congestion-aware: each link a FIFO queue; the event loop in :mod:`etstore.sim._loop`
  walks messages hop by hop over :meth:`Network.hop_graph`, where a switch is a node
  of its own with an uplink and a downlink per NPU (ASTRA-sim's congestion-aware
  Switch; :mod:`etstore.sim._switches`). How a message crosses a multi-hop route is
  :attr:`Network.hops`: ``"store-and-forward"`` (the default, ASTRA-sim's: the whole
  message is received before it is sent on, ``latency + size / bandwidth`` per hop)
  or ``"cut-through"`` (the head moves on after ``latency``; a link stays busy until
  the tail has passed, so an uncongested route takes ``Σ latency + size / bandwidth``).
  It walks the full route on every topology, across axes too: ASTRA-sim's aware
  backend runs one-dimensional networks only, so there is no first-axis rule to
  follow there, and the bytes do queue on every link they cross.

Bandwidth is GB/s with GB = 2^30 bytes; times are ns.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import numpy as np

from etstore.errors import ConfigError, TopologyError
from etstore.sim._routes import ClosedRoutes
from etstore.sim._switches import HopGraph, hop_graph
from etstore.topology import GIB, Dim, Topology, dims_of, link_dimensions

__all__ = ["ASTRA_AXIS_KINDS", "HOP_MODES", "Network", "needs_route_table"]

HOP_MODES = ("store-and-forward", "cut-through")
"""How the congestion-aware model moves a message over a multi-hop route (the first is the default)."""

ASTRA_AXIS_KINDS = ("ring", "fc", "switch")
"""Axis kinds ASTRA-sim's analytical network has (``Ring``, ``FullyConnected``, ``Switch``)."""

log = logging.getLogger(__name__)


class Network:
    """Routes and message times over one topology (built once per simulation).

    Parameters
    ----------
    topo
        The links.
    dims
        Dimensions for dimension-order routing by this model's own BFS; by default
        :func:`~etstore.topology.dims_of`, with the topology's own routes
        (:meth:`~etstore.topology.Topology.next_link`).
    hops
        How the congestion-aware model forwards a message at an intermediate node
        (a switch, or an NPU on a multi-hop route): one of :data:`HOP_MODES`;
        ``None`` is ``"store-and-forward"``, ASTRA-sim's congestion-aware semantics.
        The congestion-unaware model is ASTRA-sim's closed form whatever this is.

    Raises
    ------
    ConfigError
        ``hops`` is not one of :data:`HOP_MODES`.

    Notes
    -----
    On an intact built-in shape routed as the topology routes, next links come from
    coordinates (:class:`~etstore.sim._routes.ClosedRoutes`, O(N · axes) memory) and no
    table is made unless the congestion-aware graph needs one. Otherwise the next-hop
    table is the topology's, or built lazily per destination, each row by a BFS of
    O(D · E) numpy work (D = diameter, E = links); memory O(N²) int32 for the table
    (O((N + S)²) for the congestion-aware graph with S switch nodes), checked against
    the memory budget before it is made.
    """

    def __init__(self, topo: Topology, dims: Sequence[int] | None = None, hops: str | None = None) -> None:
        if hops is not None and hops not in HOP_MODES:
            raise ConfigError(f"hop model must be one of {', '.join(HOP_MODES)}, not {hops!r}")
        self.hops = hops or HOP_MODES[0]
        self.topo = topo
        self.num_nodes = topo.num_npus
        self.dims = tuple(dims) if dims is not None else dims_of(topo)
        self.src = np.asarray(topo.src, dtype=np.int64)
        self.dst = np.asarray(topo.dst, dtype=np.int64)
        self.latency_ns = np.asarray(topo.latency_ns, dtype=np.float64)
        self.bytes_per_ns = np.asarray(topo.bandwidth_gb_per_s, dtype=np.float64) * GIB / 1e9
        self.label = link_dimensions(topo, self.dims)
        self._axes = self._full_axes()
        self._astra_axes = self._first_axis_rule()
        self._axis_values = bool(self._astra_axes) and topo.is_regular()  # no link degraded or scaled
        self._switch_ports()
        self._graph: HopGraph | None = None
        # route exactly as the topology does: without explicit dimensions by definition;
        # with dimensions whose order agrees with the link ids, because the per-destination
        # BFS's tie-break (lowest dimension, then lowest link id) then picks the same link
        self._shared = dims is None or self._labels_follow_link_ids()
        # the topology's rule from coordinates where it has one: no N x N table (_routes)
        self._closed = ClosedRoutes.of(topo) if self._shared else None
        self._table: np.ndarray | None = None  # [dst, src] -> link; -2 unknown, -1 none
        self._rows: np.ndarray | None = None  # destinations whose row of the table is built

    @property
    def _nh(self) -> np.ndarray:
        """The ``[dst, src]`` next-link table, made on first use (N × N int32).

        Its memory is checked against the budget first (:meth:`Topology.require_routes`);
        routes the closed rule answers (:class:`ClosedRoutes`) never make it.
        """
        if self._table is None:
            self.topo.require_routes()  # it grows with NPUs squared: the budget first
            n = self.num_nodes
            if self._shared:
                self._table = self._shared_routes(self.topo)
                self._rows = np.ones(n, dtype=bool)
            else:
                self._table = np.full((n, n), -2, dtype=np.int32)
                self._rows = np.zeros(n, dtype=bool)
        return self._table

    @property
    def _done(self) -> np.ndarray:
        """Per destination NPU: its row of :attr:`_nh` is built."""
        self._nh  # noqa: B018 - made with the table
        assert self._rows is not None
        return self._rows

    def _labels_follow_link_ids(self) -> bool:
        """Whether every NPU's links, in link-id order, have non-decreasing dimension labels."""
        if not len(self.src):
            return True
        order = np.lexsort((np.arange(len(self.src)), self.src))
        s, lab = self.src[order], self.label[order]
        same = s[1:] == s[:-1]
        return bool((lab[1:][same] >= lab[:-1][same]).all())

    def _full_axes(self) -> tuple[Dim, ...]:
        """The topology's axes when its links are still exactly theirs, else ``()``.

        Only full, unfailed built-in shapes whose axes are the routing dimensions carry
        them (a degraded link keeps them); on any other topology a switch is its pairwise links.
        """
        axes = self.topo.dims
        if not axes or not self.topo.is_intact():
            return ()
        if tuple(int(d.size) for d in axes) != self.dims:
            return ()
        return tuple(axes)

    def _first_axis_rule(self) -> tuple[Dim, ...]:
        """The axes when the unaware model charges ASTRA-sim's first-differing-axis time, else ``()``.

        Only an intact topology whose axes of two or more NPUs are all ASTRA-sim
        building blocks (:data:`ASTRA_AXIS_KINDS`) is one ASTRA-sim's network file can
        describe; a mesh line, a unidirectional ring, a hypercube or a topology with
        failures keeps the time of its full route (there is no reference to agree with).
        A degraded link keeps the rule, timed over the links the message crosses on its first
        axis (:meth:`unaware_metrics`).
        """
        axes = self._axes
        if not axes:
            return ()
        if any(d.kind not in ASTRA_AXIS_KINDS for d in axes if d.size > 1):
            return ()
        return axes

    def _switch_ports(self) -> None:
        """Give switch links their port bandwidth back.

        The topology unwinds a switch of ``n`` NPUs into pairwise links of ``bw / (n-1)``
        (a port shared fairly, what synthesis plans with); a message through the switch
        moves at the full port bandwidth over two hops, as ASTRA-sim's analytical
        network times it.
        """
        for k, d in enumerate(self._axes):
            if d.kind == "switch" and d.size > 2:
                self.bytes_per_ns[self.label == k] *= d.size - 1

    @staticmethod
    def _shared_routes(topo: Topology) -> np.ndarray:
        """The topology's own next-link table, as ``[dst, src]``.

        ``Topology.next_link()`` (fewest hops, lowest link id, dimension-ordered for
        built-in shapes) is used as is so the simulator and the synthesizer route alike.
        """
        return np.ascontiguousarray(topo.next_link().T)

    # ------------------------------------------------------------ routing

    def _bfs_to(self, d: int) -> None:
        """Fill the next-hop row of destination ``d`` (one vectorised BFS)."""
        n = self.num_nodes
        row = np.full(n, -1, dtype=np.int32)
        seen = np.zeros(n, dtype=bool)
        seen[d] = True
        frontier = np.zeros(n, dtype=bool)
        frontier[d] = True
        src, dst, label = self.src, self.dst, self.label
        while True:
            cand = np.flatnonzero(frontier[dst] & ~seen[src])
            if cand.size == 0:
                break
            order = np.lexsort((cand, label[cand], src[cand]))
            c = cand[order]
            s = src[c]
            first = np.ones(len(c), dtype=bool)
            first[1:] = s[1:] != s[:-1]
            c, s = c[first], s[first]
            row[s] = c
            seen[s] = True
            frontier[:] = False
            frontier[s] = True
        self._nh[d] = row
        self._done[d] = True

    def prepare(self, destinations: np.ndarray) -> None:
        """Build next-hop rows for these destinations (no-op for ones already built, and where
        the topology's closed rule routes without a table)."""
        uniq = np.unique(np.asarray(destinations, dtype=np.int64))
        self._check_npus(uniq)
        if self._closed is not None and self._table is None:
            return
        done = self._done
        for d in uniq.tolist():
            if not done[d]:
                self._bfs_to(d)

    def _next_links(self, cur: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """First link of each (cur, dst) pair (-1: none), by the closed rule or the table (rows prepared)."""
        if self._closed is not None:
            return self._closed.next_links(cur, dst)
        return self._nh[dst, cur].astype(np.int64)

    def next_hop(self, src: int, dst: int) -> int:
        """Link index of the first hop from ``src`` toward ``dst`` (-1 if ``src == dst``)."""
        self.prepare(np.array([dst]))
        if src == dst:
            return -1
        link = int(self._next_links(np.array([src]), np.array([dst]))[0])
        if link < 0:
            raise TopologyError(f"topology {self.topo.name}: NPU {dst} is unreachable from NPU {src}")
        return link

    def route(self, src: int, dst: int) -> list[int]:
        """Link indices of the route from ``src`` to ``dst`` (empty when equal)."""
        out = []
        cur = src
        while cur != dst:
            link = self.next_hop(cur, dst)
            out.append(link)
            cur = int(self.dst[link])
        return out

    def _walk(self, src: np.ndarray, dst: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield (message positions, link indices) hop by hop for many messages at once."""
        self.prepare(dst)
        cur = np.asarray(src, dtype=np.int64).copy()
        self._check_npus(cur)  # a negative id would index the table from its end
        dst = np.asarray(dst, dtype=np.int64)
        active = np.flatnonzero(cur != dst)
        for _ in range(self.num_nodes + 1):
            if active.size == 0:
                return
            links = self._next_links(cur[active], dst[active])
            bad = links < 0
            if bad.any():
                i = active[np.argmax(bad)]
                raise TopologyError(
                    f"topology {self.topo.name}: NPU {int(dst[i])} is unreachable from NPU {int(src[i])}"
                )
            yield active, links
            cur[active] = self.dst[links]
            active = active[cur[active] != dst[active]]
        raise TopologyError(f"topology {self.topo.name}: routing loop")  # pragma: no cover

    def route_metrics(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per (src, dst): hops, summed latency (ns) and bottleneck bandwidth (bytes/ns).

        Notes
        -----
        O(P · D) numpy work for P pairs and route length D.
        """
        m = len(src)
        hops = np.zeros(m, dtype=np.int64)
        lat = np.zeros(m, dtype=np.float64)
        bw = np.full(m, np.inf)
        for pos, links in self._walk(src, dst):
            hops[pos] += 1
            lat[pos] += self.latency_ns[links]
            bw[pos] = np.minimum(bw[pos], self.bytes_per_ns[links])
        return hops, lat, bw

    def _check_npus(self, npus: np.ndarray) -> None:
        """Raise :class:`TopologyError` naming the first NPU id outside the topology."""
        bad = (npus < 0) | (npus >= self.num_nodes)
        if bad.any():
            d = int(npus[np.argmax(bad)])
            raise TopologyError(
                f"topology {self.topo.name}: NPU {d} is outside 0..{self.num_nodes - 1}; "
                "the trace has more ranks than the topology has NPUs"
            )

    def unaware_metrics(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per (src, dst): hops, latency (ns) and bandwidth (bytes/ns) the congestion-unaware model charges.

        On a topology ASTRA-sim's analytical network can describe (intact axes, all
        ``ring``, ``fc`` or ``switch``), ASTRA-sim's congestion-unaware rule: the first
        axis ``k`` (axis 0 first) on which the two NPUs' coordinates differ carries the
        whole message, over ``h`` hops between those two coordinates — a ring's shorter
        way round, 1 on a fully connected axis, 2 through a switch — so the latency is
        ``h × latency_k`` and the bandwidth ``bandwidth_k`` (a switch's full port);
        the differences on later axes add nothing. Where a link's values differ from its
        axis's (a degraded link), the same rule sums the latency and takes the least bandwidth
        of the links the route crosses on that axis: equal to the closed form on intact links.
        Otherwise :meth:`route_metrics`.

        Parameters
        ----------
        src, dst
            NPU ids, one pair per entry.

        Returns
        -------
        tuple of numpy.ndarray
            ``(hops, latency_ns, bytes_per_ns)``; a pair with ``src == dst`` has 0 hops,
            0 ns and infinite bandwidth.

        Raises
        ------
        TopologyError
            An NPU id outside the topology, or (full routes) an unreachable destination.

        Notes
        -----
        O(P · axes) numpy work for P pairs under the first-axis rule; see
        :meth:`route_metrics` otherwise.
        """
        if not self._astra_axes:
            return self.route_metrics(src, dst)
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        self._check_npus(np.concatenate([src, dst]))
        if not self._axis_values:
            return self._first_axis_links(src, dst)
        hops = np.zeros(len(src), dtype=np.int64)
        lat = np.zeros(len(src), dtype=np.float64)
        bw = np.full(len(src), np.inf)
        open_ = src != dst
        stride = 1
        for d in self._astra_axes:
            size = int(d.size)
            a = (src // stride) % size
            b = (dst // stride) % size
            here = open_ & (a != b)
            stride *= size
            if not here.any():
                continue
            if d.kind == "ring":
                ahead = (b[here] - a[here]) % size
                h = np.minimum(ahead, size - ahead)
            else:  # fc: one hop; switch: NPU -> switch -> NPU
                h = np.full(int(here.sum()), 1 if d.kind == "fc" else 2, dtype=np.int64)
            hops[here] = h
            lat[here] = h * float(d.latency_ns)
            bw[here] = float(d.bandwidth_gb_per_s) * GIB / 1e9
            open_ &= ~here
        return hops, lat, bw

    def _first_axis_links(
        self, src: np.ndarray, dst: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """ASTRA-sim's first-axis rule over the route's own links on that axis (some link degraded).

        O(P · D) numpy work for P pairs and route length D.
        """
        sizes = np.asarray([int(d.size) for d in self._astra_axes], dtype=np.int64)
        strides = np.concatenate([[1], np.cumprod(sizes)[:-1]])
        differ = (src[:, None] // strides) % sizes != (dst[:, None] // strides) % sizes
        first = np.where(differ.any(axis=1), np.argmax(differ, axis=1), -1)
        hops = np.zeros(len(src), dtype=np.int64)
        lat = np.zeros(len(src), dtype=np.float64)
        bw = np.full(len(src), np.inf)
        for pos, links in self._walk(src, dst):
            on = self.label[links] == first[pos]
            hops[pos] += on
            lat[pos] += np.where(on, self.latency_ns[links], 0.0)
            bw[pos] = np.minimum(bw[pos], np.where(on, self.bytes_per_ns[links], np.inf))
        return hops, lat, bw

    # ------------------------------------------------------------ models

    def message_times_ns(
        self,
        src: np.ndarray,
        dst: np.ndarray,
        size_bytes: np.ndarray,
        *,
        integer_ns: bool = True,
        overhead_ns: float = 0.0,
    ) -> np.ndarray:
        """Congestion-unaware delivery time of each message: ``latency + size / bandwidth``.

        Latency and bandwidth are :meth:`unaware_metrics`': ASTRA-sim's first
        differing axis on the topologies it can describe, else the route's summed
        latency and bottleneck bandwidth. A message to itself takes ``overhead_ns``.
        With ``integer_ns`` the time is truncated to whole ns (ASTRA-sim's clock).

        Notes
        -----
        O(M + P · D): metrics are computed once per distinct (src, dst) pair.
        """
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        size = np.asarray(size_bytes, dtype=np.float64)
        if len(src) == 0:
            return np.zeros(0)
        self._check_npus(np.concatenate([src, dst]))  # before pairs are packed into one key
        n = max(self.num_nodes, 1)
        key = src * n + dst
        uniq, inv = np.unique(key, return_inverse=True)
        hops, lat, bw = self.unaware_metrics(uniq // n, uniq % n)
        lat_m, bw_m, hops_m = lat[inv], bw[inv], hops[inv]
        t = np.where(hops_m > 0, lat_m + size / np.where(np.isinf(bw_m), 1.0, bw_m), 0.0)
        if integer_ns:
            t = np.floor(t)
        return t + overhead_ns

    def link_loads(
        self, src: np.ndarray, dst: np.ndarray, size_bytes: np.ndarray, count: np.ndarray | None = None
    ) -> tuple[np.ndarray, ...]:
        """Per link: bytes carried, messages carried and busy time (ns, ``bytes / bandwidth``).

        ``count``, when given, says how many messages each row stands for (``size_bytes``
        then being their total): the simulator sums messages per NPU pair.

        What the congestion-unaware model puts on each link (no queueing). The bytes
        follow the full route even where :meth:`unaware_metrics` charges only the first
        differing axis: they still have to cross the other axes' links, so a slower
        link there can be offered more than its bandwidth by one message alone.
        """
        nl = self.topo.num_links
        nbytes = np.zeros(nl)
        msgs = np.zeros(nl, dtype=np.int64)
        size = np.asarray(size_bytes, dtype=np.float64)
        cnt = np.ones(len(size), dtype=np.int64) if count is None else np.asarray(count, dtype=np.int64)
        for pos, links in self._walk(np.asarray(src), np.asarray(dst)):
            np.add.at(nbytes, links, size[pos])
            np.add.at(msgs, links, cnt[pos])
        return nbytes, msgs, nbytes / self.bytes_per_ns if nl else nbytes

    def link_windows(
        self, src: np.ndarray, dst: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per link: the earliest start and latest end (ns) of the messages routed over it.

        Links no message crosses get ``(inf, -inf)``. With :meth:`link_loads` this gives
        the load a link is offered while it is in use (bytes over that window).

        Notes
        -----
        O(M · D) numpy work for M messages and route length D.
        """
        nl = self.topo.num_links
        lo = np.full(nl, np.inf)
        hi = np.full(nl, -np.inf)
        t0 = np.asarray(start_ns, dtype=np.float64)
        t1 = np.asarray(end_ns, dtype=np.float64)
        for pos, links in self._walk(np.asarray(src), np.asarray(dst)):
            np.minimum.at(lo, links, t0[pos])
            np.maximum.at(hi, links, t1[pos])
        return lo, hi

    # ------------------------------------------------------------ congestion-aware graph

    def hop_graph(self) -> HopGraph:
        """The nodes and links the congestion-aware loop walks (built once).

        Without a switch axis, the topology's links and this model's next-link array
        (rows filled by :meth:`prepare`); with one, a switch node per switch instance
        and an uplink and a downlink per NPU and switch axis, routes as the topology's
        with each pairwise switch hop taken through the switch (every row built).
        """
        if self._graph is None:
            n = self.num_nodes
            has_switch = any(d.kind == "switch" and d.size > 1 for d in self._axes)
            if has_switch:
                self.prepare(np.arange(n))
            self._graph = hop_graph(
                n,
                self._axes if has_switch else (),
                self.label,
                self._nh,
                self.dst,
                self.latency_ns,
                self.bytes_per_ns,
            )
        return self._graph

    def prepare_hops(self, destinations: np.ndarray) -> HopGraph:
        """:meth:`hop_graph` with the rows of these destinations built."""
        self.prepare(destinations)
        return self.hop_graph()

    def hop_table(self, destinations: np.ndarray) -> list[list[int] | None]:
        """Per destination NPU, the next link from every node of :meth:`hop_graph` (None if unused)."""
        graph = self.prepare_hops(destinations)
        out: list[list[int] | None] = [None] * graph.num_nodes
        for d in np.unique(np.asarray(destinations, dtype=np.int64)):
            out[int(d)] = graph.next_link[int(d)].tolist()
        return out

    def link_counters(
        self,
        busy: np.ndarray,
        nbytes: np.ndarray,
        msgs: np.ndarray,
        msg_src: np.ndarray,
        msg_dst: np.ndarray,
        size_bytes: np.ndarray,
        count: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The congestion-aware loop's per-link counters, per topology link: (busy ns, bytes, messages).

        Links of the :meth:`hop_graph` that are the topology's keep their counters. A
        pairwise switch link, which the loop does not use, is given the messages whose
        route crosses it, their bytes and busy ``bytes / port bandwidth`` (what they
        occupy a port for); the switch ports themselves are not topology links.

        Notes
        -----
        O(L) without a switch; O(M · D) for M messages of route length D with one.
        """
        nl = self.topo.num_links
        busy = np.asarray(busy, dtype=np.float64)[:nl].copy()
        nbytes = np.asarray(nbytes, dtype=np.float64)[:nl].copy()
        msgs = np.asarray(msgs, dtype=np.int64)[:nl].copy()
        replaced = self.hop_graph().replaced
        if replaced.any():
            b, m, t = self.link_loads(msg_src, msg_dst, size_bytes, count)
            nbytes[replaced], msgs[replaced], busy[replaced] = b[replaced], m[replaced], t[replaced]
        return busy, nbytes, msgs


def needs_route_table(topo: Topology, congestion: str = "unaware") -> bool:
    """Whether simulating over ``topo`` builds its N × N route table, which grows with NPUs
    squared: the congestion-aware model does; the unaware one only where the topology has no
    closed routing rule (a failed link, a custom layout: :class:`~etstore.sim._routes.ClosedRoutes`).

    >>> from etstore.topology import parse_topology
    >>> needs_route_table(parse_topology("ring:8")), needs_route_table(parse_topology("ring:8"), "aware")
    (False, True)
    """
    return congestion == "aware" or ClosedRoutes.of(topo) is None
