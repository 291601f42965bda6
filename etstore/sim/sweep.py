"""Bus-bandwidth curves: one collective over sizes × algorithms × topologies.

Each point simulates a one-collective workload (one ``COMM_COLL_NODE`` per NPU of
the topology) with :func:`etstore.sim.simulate` and reports nccl-tests ``algbw``
and ``busbw`` (GB/s with GB = 10^9, as nccl-tests prints them, so a curve compares with
a measured log's directly; the topology's link bandwidths keep GB = 2^30).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

import numpy as np
import pyarrow as pa

from etstore.errors import SimulationError, UnsatisfiableError
from etstore.model import Trace, ops_table
from etstore.sim.config import SimConfig, collective_name
from etstore.sim.engine import simulate
from etstore.sim.result import busbw_factor, rate_gb_per_s
from etstore.topology import Topology, parse_topology
from etstore.units import parse_size

__all__ = ["SWEEP_SCHEMA", "collective_workload", "parse_sizes", "sweep"]

log = logging.getLogger(__name__)

AlgorithmFactory = Callable[[Topology, str], Trace]
SweepAlgorithm = Union[str, Trace, AlgorithmFactory]  # noqa: UP007 - a runtime alias

SWEEP_SCHEMA = pa.schema(
    [
        ("topology", pa.string()),
        ("num_npus", pa.int32()),
        ("collective", pa.string()),
        ("algorithm", pa.string()),
        ("congestion", pa.string()),
        ("size_bytes", pa.int64()),
        ("time_ns", pa.float64()),
        ("algbw_gb_per_s", pa.float64()),
        ("busbw_gb_per_s", pa.float64()),
        ("events", pa.int64()),
        ("wall_s", pa.float64()),
    ]
)


def collective_workload(collective: str, num_npus: int, size_bytes: int, *, name: str | None = None) -> Trace:
    """A workload of one ``COMM_COLL_NODE`` per rank: ``collective`` of nccl-tests size ``size_bytes``.

    ``size_bytes`` is nccl-tests' S (the whole array); for all-gather the node's
    ``comm_size`` is the per-rank share ``S / num_npus``, as ASTRA-sim reads it.
    """
    coll = collective_name(collective)
    comm_size = size_bytes // num_npus if coll == "ALL_GATHER" else size_bytes
    ops = ops_table(
        {
            "rank": np.arange(num_npus, dtype=np.int32),
            "id": np.ones(num_npus, dtype=np.uint64),
            "name": [f"{coll.lower()}_{size_bytes}"] * num_npus,
            "type": ["COMM_COLL_NODE"] * num_npus,
            "comm_type": [coll] * num_npus,
            "comm_size": np.full(num_npus, comm_size, dtype=np.int64),
        }
    )
    return Trace(ops=ops, name=name or f"{coll.lower()}-{num_npus}x{size_bytes}", kind="workload")


def parse_sizes(text: str) -> list[int]:
    """Sizes from ``"1KiB,64KiB,1MiB"`` or a geometric range ``"1KiB..1GiB"`` (×2 steps) /
    ``"1KiB..1GiB:4"`` (×4 steps); items may be mixed.

    Raises
    ------
    UnsatisfiableError
        An item is not a size, or a range is empty or has a factor below 2.

    Examples
    --------
    >>> parse_sizes("1KiB..8KiB")
    [1024, 2048, 4096, 8192]
    >>> parse_sizes("1MiB, 1KiB..16KiB:4")
    [1024, 4096, 16384, 1048576]
    """
    out: set[int] = set()
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if ".." not in item:
            size = parse_size(item)
            if size <= 0:
                raise UnsatisfiableError(f"size {item!r}: a collective needs at least one byte")
            out.add(size)
            continue
        lo_text, hi_text = item.split("..", 1)
        factor = 2
        if ":" in hi_text:
            hi_text, f_text = hi_text.split(":", 1)
            if not f_text.strip().isdigit() or int(f_text) < 2:
                raise UnsatisfiableError(f"size range {item!r}: the step factor must be an integer >= 2")
            factor = int(f_text)
        lo, hi = parse_size(lo_text), parse_size(hi_text)
        if lo <= 0 or hi < lo:
            raise UnsatisfiableError(f"size range {item!r}: expected 0 < start <= end")
        size = lo
        while size <= hi:
            out.add(size)
            size *= factor
    if not out:
        raise UnsatisfiableError(f"no sizes in {text!r}")
    return sorted(out)


def _topology(spec: Topology | str) -> Topology:
    """A topology as given, or parsed from its spec."""
    return spec if isinstance(spec, Topology) else parse_topology(spec)


def _label(spec: SweepAlgorithm) -> str:
    """How the sweep table names an algorithm."""
    if isinstance(spec, str):
        return spec
    if isinstance(spec, Trace):
        return spec.name
    return getattr(spec, "__name__", "custom")


def sweep(
    sizes_bytes: Sequence[int],
    algorithms: Sequence[SweepAlgorithm] | Mapping[str, SweepAlgorithm],
    topologies: Sequence[Topology | str],
    *,
    collective: str = "allreduce",
    config: SimConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> pa.Table:
    """Simulate one collective for every (topology, algorithm, size) and tabulate bandwidth.

    Parameters
    ----------
    sizes_bytes
        nccl-tests sizes S (bytes).
    algorithms
        Names (``"native"``, ``"ring"``, ``"direct"``...), algorithm traces, or
        factories ``f(topology, collective) -> Trace`` (a synthesizer), optionally as
        a ``{label: algorithm}`` mapping. Factories run once per topology.
    topologies
        :class:`Topology` objects or specs (``"mesh2d:8x8,bw=50,lat=500"``).
    collective
        ``allreduce``, ``allgather``, ``reducescatter``, ``alltoall``...
    config
        Simulator parameters; ``config.congestion`` picks the network model.
    progress
        Called with (points done, points total) after each point.

    Returns
    -------
    pyarrow.Table
        :data:`SWEEP_SCHEMA`: topology, num_npus, collective, algorithm, congestion,
        size_bytes, time_ns, algbw_gb_per_s and busbw_gb_per_s (GB = 10^9, as nccl-tests),
        events, wall_s.

    Raises
    ------
    SimulationError
        An algorithm cannot run this collective on a topology.
    TopologyError
        A topology spec cannot be parsed.

    Notes
    -----
    O(T · A · S) simulations; each is O(events log events) (see :func:`simulate`).
    """
    cfg = config or SimConfig()
    coll = collective_name(collective)
    items = (
        list(algorithms.items()) if isinstance(algorithms, Mapping) else [(_label(a), a) for a in algorithms]
    )
    topos = [_topology(t) for t in topologies]
    rows: dict[str, list[Any]] = {f.name: [] for f in SWEEP_SCHEMA}
    total = len(topos) * len(items) * len(sizes_bytes)
    done = 0
    for topo in topos:
        n = topo.num_npus
        for label, spec in items:
            algo: str | Trace
            if isinstance(spec, (str, Trace)):
                algo = spec
            else:
                t0 = time.perf_counter()
                algo = spec(topo, coll)
                log.debug("algorithm %s for %s built in %.3f s", label, topo.name, time.perf_counter() - t0)
            for size in sizes_bytes:
                work = collective_workload(coll, n, int(size))
                t0 = time.perf_counter()
                try:
                    res = simulate(work, topo, config=cfg, algorithms={coll: algo})
                except SimulationError as exc:
                    raise SimulationError(
                        f"sweep point {topo.name} / {label} / {size} B: {exc}", exc.stuck
                    ) from exc
                wall = time.perf_counter() - t0
                t = res.total_ns
                algbw = rate_gb_per_s(int(size), t)
                for key, value in (
                    ("topology", topo.name),
                    ("num_npus", n),
                    ("collective", coll),
                    ("algorithm", label),
                    ("congestion", cfg.congestion),
                    ("size_bytes", int(size)),
                    ("time_ns", t),
                    ("algbw_gb_per_s", algbw),
                    ("busbw_gb_per_s", algbw * busbw_factor(coll, n)),
                    ("events", res.events),
                    ("wall_s", wall),
                ):
                    rows[key].append(value)
                done += 1
                if progress is not None:
                    progress(done, total)
    return pa.Table.from_pydict(rows, schema=SWEEP_SCHEMA)
