"""What-if perturbations of a trace and its network: stragglers, jitter, faster or slower op
classes, faster or slower links, degraded and failed links; and knobs that sweep one of them.

A perturbation is a pure function of a trace and a :class:`Perturbation` (:func:`perturb`: the
durations of its compute ops changed) and of a topology (:func:`perturb_network`: its links
changed), and is kept in ``params["perturbation"]`` so every run of it says what was changed.
Factor 1 changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.errors import OptionError, TopologyError
from etstore.model import Trace
from etstore.topology import Topology
from etstore.topology.axes import coordinates
from etstore.topology.spec import link_pair

__all__ = [
    "KNOBS",
    "LINK_SCALES",
    "OP_CLASSES",
    "Knob",
    "Perturbation",
    "op_class",
    "parse_knob",
    "parse_slow",
    "perturb",
    "perturb_network",
]

OP_CLASSES = ("cpu", "gpu")
"""Classes of compute ops ``Perturbation.scale`` takes: host ops, device activities."""
LINK_SCALES = ("bw", "lat")
"""What ``Perturbation.scale`` scales of every link: bandwidth, latency."""


@dataclass(frozen=True)
class Perturbation:
    """Changes to compute durations and to links.

    ``slow`` multiplies every compute op of a rank (a straggler: thermal throttling, a noisy
    neighbour); ``scale`` every compute op of a class (``cpu``, ``gpu``: a faster GPU, a slower
    host) or every link's bandwidth or latency (``bw``, ``lat``: a faster fabric); ``jitter``
    multiplies each op by ``exp(N(0, jitter))`` drawn with ``seed`` (run-to-run noise, median
    factor 1); ``degrade`` multiplies the bandwidth of links named as a topology spec's ``fail=``
    names them (``3-4`` both ways, ``3>4`` one) by a factor in (0, 1] (a link trained down, a
    flaky cable); ``fail`` removes links (traffic routes around them). Factors multiply.
    """

    slow: Mapping[int, float] = field(default_factory=dict)
    scale: Mapping[str, float] = field(default_factory=dict)
    jitter: float = 0.0
    seed: int = 0
    degrade: Mapping[str, float] = field(default_factory=dict)
    fail: Sequence[str] = ()

    def __post_init__(self) -> None:
        for what, factors in (("slowdown", self.slow), ("scale", self.scale)):
            for k, f in factors.items():
                if not f > 0:
                    raise OptionError(f"{what} factor for {k!r} must be positive, got {f}")
        for k in self.scale:
            if k not in OP_CLASSES + LINK_SCALES:
                known = f"{', '.join(OP_CLASSES)} (compute), {', '.join(LINK_SCALES)} (links)"
                raise OptionError(f"unknown op class {k!r} to scale; known: {known}")
        if self.jitter < 0:
            raise OptionError(f"jitter must be at least 0, got {self.jitter}")
        for link, f in self.degrade.items():
            _link(link, "--degrade")
            if not 0 < f <= 1:
                raise OptionError(f"--degrade {link}: the bandwidth factor must be in (0, 1], got {f}")
        for link in self.fail:
            _link(link, "--fail")

    @property
    def is_identity(self) -> bool:
        """Whether it changes nothing."""
        return not (self.changes_compute or self.changes_network)

    @property
    def changes_compute(self) -> bool:
        """Whether it changes a compute duration."""
        scale = (f for k, f in self.scale.items() if k in OP_CLASSES)
        return bool(self.jitter) or any(f != 1 for f in (*self.slow.values(), *scale))

    @property
    def changes_network(self) -> bool:
        """Whether it changes a link."""
        scale = (f for k, f in self.scale.items() if k in LINK_SCALES)
        return bool(self.fail) or any(f != 1 for f in (*self.degrade.values(), *scale))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, as the run's parameters keep it (``degrade`` and ``fail`` where given)."""
        out: dict[str, Any] = {
            "slow": {str(k): v for k, v in sorted(self.slow.items())},
            "scale": dict(sorted(self.scale.items())),
            "jitter": self.jitter,
            "seed": self.seed,
        }
        if self.degrade:
            out["degrade"] = dict(self.degrade)
        if self.fail:
            out["fail"] = list(self.fail)
        return out

    def describe(self) -> str:
        """One line for a command's output: ``rank 3 compute x1.5; link 3-4 bw x0.5; link 5-6 failed``.

        >>> Perturbation(slow={3: 1.5}, scale={"bw": 2.0}, fail=("5-6",)).describe()
        'rank 3 compute x1.5; links bw x2; link 5-6 failed'
        """
        parts = [f"rank {r} compute x{f:g}" for r, f in sorted(self.slow.items()) if f != 1]
        names = {"cpu": "cpu compute", "gpu": "gpu compute", "bw": "links bw", "lat": "links latency"}
        parts += [f"{names[k]} x{f:g}" for k, f in sorted(self.scale.items()) if f != 1]
        if self.jitter:
            parts.append(f"jitter {self.jitter:g} (seed {self.seed})")
        parts += [f"link {k} bw x{f:g}" for k, f in self.degrade.items() if f != 1]
        parts += [f"link {k} failed" for k in self.fail]
        return "; ".join(parts)


def _link(text: str, option: str) -> tuple[int, int, bool]:
    """The link ``A-B`` (both directions) or ``A>B`` (one) an option names."""
    pair = link_pair(text)
    if pair is None:
        raise OptionError(f"{option} {text!r}: expected a link A-B (both directions) or A>B (one)")
    return pair


_SLOW = re.compile(r"^\s*([\d,\s-]+)\s*=\s*([0-9.eE+-]+)\s*$")


def parse_slow(text: str) -> dict[int, float]:
    """``"1,3-5=1.5"`` → ranks 1, 3, 4, 5 slowed by ×1.5.

    >>> parse_slow("1,3-5=1.5")
    {1: 1.5, 3: 1.5, 4: 1.5, 5: 1.5}
    """
    m = _SLOW.match(text)
    if not m:
        raise OptionError(f"--slow {text!r}: expected RANKS=FACTOR, e.g. 3=1.5 or 0,4-7=2")
    ranks: list[int] = []
    for part in m[1].split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise OptionError(f"--slow {text!r}: {part!r} is not a rank or a range of ranks") from None
        if b < a:
            raise OptionError(f"--slow {text!r}: empty range {part!r}")
        ranks += range(a, b + 1)
    try:
        factor = float(m[2])
    except ValueError:
        raise OptionError(f"--slow {text!r}: {m[2]!r} is not a number") from None
    return dict.fromkeys(ranks, factor)


def op_class(is_cpu: Any) -> str:
    """``cpu`` for a host op, ``gpu`` for a device activity (``is_cpu_op`` false)."""
    return "gpu" if is_cpu is False else "cpu"


def perturb(trace: Trace, p: Perturbation) -> Trace:
    """``trace`` with its compute durations changed by ``p`` (see :class:`Perturbation`).

    Raises
    ------
    OptionError
        ``p`` slows a rank the trace does not have.

    Examples
    --------
    >>> from etstore.model import Trace, ops_table
    >>> ops = ops_table({"rank": [0, 1], "id": [1, 1], "name": ["mm", "mm"], "type": ["COMP_NODE"] * 2,
    ...                  "duration_micros": [100, 100]})
    >>> t = Trace(ops=ops, name="t")
    >>> perturb(t, Perturbation(slow={1: 1.5})).ops["duration_micros"].to_pylist()
    [100, 150]
    >>> perturb(t, Perturbation()).ops.equals(t.ops)
    True
    """
    missing = sorted(set(p.slow) - set(trace.ranks))
    if missing:
        raise OptionError(f"--slow names rank {missing[0]}, but trace {trace.name!r} has ranks {trace.ranks}")
    ops = trace.ops
    comp = pc.equal(ops["type"], "COMP_NODE").to_numpy(zero_copy_only=False)
    factor = np.ones(ops.num_rows)
    rank = ops["rank"].to_numpy()
    for r, f in p.slow.items():
        factor[rank == r] *= f
    if p.scale:
        gpu = pc.equal(pc.fill_null(ops["is_cpu_op"], True), False).to_numpy(zero_copy_only=False)
        factor[gpu] *= p.scale.get("gpu", 1.0)
        factor[~gpu] *= p.scale.get("cpu", 1.0)
    if p.jitter:
        factor *= np.exp(np.random.default_rng(p.seed).normal(0.0, p.jitter, ops.num_rows))
    factor[~comp] = 1.0
    dur = ops["duration_micros"].to_numpy(zero_copy_only=False).astype(np.float64)
    new = np.rint(dur * factor).astype(np.uint64)
    col = ops.schema.get_field_index("duration_micros")
    out = ops.set_column(col, ops.schema.field(col), pa.array(new, ops.schema.field(col).type))
    params = dict(trace.params or {})
    params["perturbation"] = p.to_dict()
    return trace.replace(ops=out, params=params)


def perturb_network(topo: Topology, p: Perturbation) -> Topology:
    """``topo`` with the links ``p`` changes: every bandwidth and latency scaled, links degraded,
    links failed (in that order); ``topo`` itself where ``p`` changes no link.

    A degraded link keeps the shape: routes, hop counts and the collectives' axes stay, and
    what crosses the link is slower. A failed link keeps the axes too (they number the NPUs and
    shape native collectives), while routes go the long way round it. NPUs are named as the
    simulation numbers them (rank ``r`` on NPU ``r``).

    Raises
    ------
    OptionError
        A link is not in the topology; a failure leaves two NPUs without a path between them
        (the message names them); a degraded or failed link on a switch axis, whose ports are
        not links of their own.

    Examples
    --------
    >>> ring = Topology.from_spec("ring:4,bw=50,lat=500")
    >>> t = perturb_network(ring, Perturbation(fail=("0-1",)))
    >>> [int(t.dst[i]) for i in t.route(0, 1)]  # the long way round
    [3, 2, 1]
    >>> perturb_network(ring, Perturbation(degrade={"0-1": 1.0})) is ring
    True
    """
    if not (p.changes_network or p.degrade):
        return topo
    out = topo.scaled(bandwidth=p.scale.get("bw", 1.0), latency=p.scale.get("lat", 1.0))
    degrade = {_link(k, "--degrade"): f for k, f in p.degrade.items()}
    if degrade:
        with _naming(f"--degrade {k}" for k in p.degrade):
            for pair in degrade:
                _refuse_switch(out, pair, "--degrade")
            changed = out.degraded(degrade)  # every link named must be one, at factor 1 too
            out = changed if any(f != 1 for f in degrade.values()) else out
    if p.fail:
        pairs = [_link(k, "--fail") for k in p.fail]
        with _naming(f"--fail {k}" for k in p.fail):
            for pair in pairs:
                _refuse_switch(out, pair, "--fail")
            out = out.without(
                links=[q[:2] for q in pairs if q[2]],
                directed_links=[q[:2] for q in pairs if not q[2]],
                keep_axes=bool(out.dims) and out.labels is None,
            )
            out.require_connected()
    return out


@contextmanager
def _naming(options: Iterable[str]) -> Iterator[None]:
    """A :class:`TopologyError` in the block as an :class:`OptionError` naming the options asked."""
    try:
        yield
    except TopologyError as exc:
        raise OptionError(f"{', '.join(options)}: {exc}") from exc


def _refuse_switch(topo: Topology, pair: tuple[int, int, bool], option: str) -> None:
    """Refuse a link of a switch axis: ASTRA-sim's switch is ports, not links between NPUs.

    A failure anywhere on a topology with a switch axis is refused too: the switch's ports are
    modelled on the intact shape only.
    """
    switches = [k for k, d in enumerate(topo.dims) if d.kind == "switch" and d.size > 2]
    if not switches or not 0 <= min(pair[:2]) <= max(pair[:2]) < topo.num_npus:
        return
    c = coordinates(topo.num_npus, [d.size for d in topo.dims])
    differ = np.flatnonzero(c[pair[0]] != c[pair[1]])
    on_switch = len(differ) == 1 and int(differ[0]) in switches
    if on_switch:
        axis = topo.dims[int(differ[0])]
        raise TopologyError(
            f"NPUs {pair[0]} and {pair[1]} meet through a switch (switch:{axis.size}): its ports are "
            "not links of their own; degrade links of other axes"
        )
    if option == "--fail":
        raise TopologyError(
            f"the topology has a switch axis (switch:{topo.dims[switches[0]].size}), whose ports the "
            "simulator models on the intact topology only; fail links where there is no switch"
        )


KNOBS = ("slow", "scale", "degrade", "jitter")
"""What a :class:`Knob` turns: the factor of ``--slow RANKS``, ``--scale CLASS``, ``--degrade LINK``,
or the sigma of ``--jitter``."""


@dataclass(frozen=True)
class Knob:
    """One perturbation option with its value left open: ``slow:3``, ``scale:bw``, ``degrade:3-4``,
    ``jitter``; :meth:`at` gives the perturbation at a value, so a sweep over values is a list of
    runs each as ``sim --slow 3=VALUE`` would make it.
    """

    kind: str
    target: str = ""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KNOBS:
            raise OptionError(f"unknown knob {self.kind!r}; known: {', '.join(KNOBS)}")
        if (self.kind == "jitter") != (not self.target):
            form = "jitter" if self.kind == "jitter" else f"{self.kind}:TARGET"
            raise OptionError(f"knob {self.name!r}: write it as {form}")
        self.at(1.0 if self.kind != "jitter" else 0.0)  # the target is checked once, here

    @property
    def name(self) -> str:
        """``slow:3``, ``jitter``: how runs and figures name the knob."""
        return f"{self.kind}:{self.target}" if self.target else self.kind

    def at(self, value: float) -> Perturbation:
        """The perturbation with the knob at ``value``.

        >>> Knob("slow", "0,2").at(1.5).slow
        {0: 1.5, 2: 1.5}
        """
        if self.kind == "slow":
            return Perturbation(slow=parse_slow(f"{self.target}={value}"))
        if self.kind == "scale":
            return Perturbation(scale={self.target: value})
        if self.kind == "degrade":
            return Perturbation(degrade={self.target: value})
        return Perturbation(jitter=value, seed=self.seed)


def parse_knob(text: str, *, seed: int = 0) -> tuple[Knob, list[float]]:
    """``"KNOB=V1,V2,..."`` → the knob and its values, in the order given.

    >>> parse_knob("slow:0,4-7=1,1.5,2")
    (Knob(kind='slow', target='0,4-7', seed=0), [1.0, 1.5, 2.0])
    >>> parse_knob("scale:bw=0.5,1")[0].name
    'scale:bw'
    """
    name, eq, values = text.strip().rpartition("=")
    if not eq or not name:
        raise OptionError(
            f"--knob {text!r}: expected KNOB=V1,V2,..., e.g. slow:3=1,1.5,2 or scale:bw=0.5,1,2"
        )
    kind, _, target = name.partition(":")
    try:
        vals = [float(v) for v in values.split(",") if v.strip()]
    except ValueError:
        raise OptionError(f"--knob {text!r}: the values must be numbers separated by commas") from None
    if not vals:
        raise OptionError(f"--knob {text!r}: no values")
    knob = Knob(kind.strip(), target.strip(), seed)
    for v in vals:
        knob.at(v)  # every value checked before any run
    return knob, vals
