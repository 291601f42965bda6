"""What-if perturbations of a trace's compute: stragglers, jitter, faster or slower op classes.

A perturbation is a pure function of a trace and a :class:`Perturbation`: the same trace with
the durations of its compute ops changed (communication is the network's: change the topology
for that), and the perturbation kept in ``params["perturbation"]`` so every run of it says what
was changed. Factor 1 changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.errors import OptionError
from etstore.model import Trace

__all__ = ["OP_CLASSES", "Perturbation", "op_class", "parse_slow", "perturb"]

OP_CLASSES = ("cpu", "gpu")
"""Classes of compute ops ``Perturbation.scale`` takes: host ops, device activities."""


@dataclass(frozen=True)
class Perturbation:
    """Changes to compute durations: per-rank slowdown factors, a class factor, jitter.

    ``slow`` multiplies every compute op of a rank (a straggler: thermal throttling, a noisy
    neighbour); ``scale`` every compute op of a class (``cpu``, ``gpu``: a faster GPU, a slower
    host); ``jitter`` multiplies each op by ``exp(N(0, jitter))`` drawn with ``seed`` (run-to-run
    noise, median factor 1). Factors multiply.
    """

    slow: Mapping[int, float] = field(default_factory=dict)
    scale: Mapping[str, float] = field(default_factory=dict)
    jitter: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for what, factors in (("slowdown", self.slow), ("scale", self.scale)):
            for k, f in factors.items():
                if not f > 0:
                    raise OptionError(f"{what} factor for {k!r} must be positive, got {f}")
        for k in self.scale:
            if k not in OP_CLASSES:
                raise OptionError(f"unknown op class {k!r} to scale; known: {', '.join(OP_CLASSES)}")
        if self.jitter < 0:
            raise OptionError(f"jitter must be at least 0, got {self.jitter}")

    @property
    def is_identity(self) -> bool:
        """Whether it changes nothing."""
        return (
            all(f == 1 for f in self.slow.values())
            and all(f == 1 for f in self.scale.values())
            and not self.jitter
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, as the run's parameters keep it."""
        return {
            "slow": {str(k): v for k, v in sorted(self.slow.items())},
            "scale": dict(sorted(self.scale.items())),
            "jitter": self.jitter,
            "seed": self.seed,
        }


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
