"""The topology spec grammar: ``mesh2d:8x8``, ``ring:4+switch:8,bw=50/400,fail=3``.

``shape[,option...]``: ``shape`` is ``kind:sizes`` joined by ``+`` (axis 0 first);
options ``bw=`` (GB/s, GB = 2^30 B) and ``lat=`` (ns), one value or one per axis
separated by ``/``, and ``fail=`` with failed NPUs (``5``) and links in both
directions (``5-6``) or one (``5>6``). ``docs/topology.md`` has the full table.

:func:`parse_spec` only reads the text into axes, failures and the canonical name;
:meth:`etstore.topology.Topology.from_spec` builds the links from that.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, NamedTuple

from etstore.errors import TopologyError
from etstore.topology.axes import Dim, Values, check_axes, dim_spec, per_axis, values_spec

if TYPE_CHECKING:  # only for the annotation; the topology layer does not need pyarrow
    from etstore.model import Trace

__all__ = ["KINDS", "ParsedSpec", "default_topology", "link_pair", "link_text", "parse_spec"]

log = logging.getLogger(__name__)

KINDS: dict[str, tuple[str, int]] = {
    "ring": ("ring", 1),
    "uniring": ("uniring", 1),
    "fc": ("fc", 1),
    "fullyconnected": ("fc", 1),
    "switch": ("switch", 1),
    "mesh": ("mesh", 0),
    "mesh1d": ("mesh", 1),
    "mesh2d": ("mesh", 2),
    "mesh3d": ("mesh", 3),
    "torus": ("torus", 0),
    "torus1d": ("torus", 1),
    "torus2d": ("torus", 2),
    "torus3d": ("torus", 3),
    "hypercube": ("hypercube", 1),
}
"""Spec kind → (canonical kind, number of sizes it takes; 0 = any)."""

_NUMBER = r"[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?"
_SINGLE_SIZE = ("ring", "uniring", "fc", "switch")


class ParsedSpec(NamedTuple):
    """What a spec says, before any link is built."""

    dims: tuple[Dim, ...]
    """The axes, axis 0 first, with bandwidth and latency resolved."""
    name: str
    """The canonical spec (values written out, failures last)."""
    fail_npus: tuple[int, ...]
    """Failed NPUs."""
    fail_links: tuple[tuple[int, int], ...]
    """Failed links, both directions."""
    fail_directed: tuple[tuple[int, int], ...]
    """Failed links, ``a → b`` only."""


class _Options(NamedTuple):
    bw: list[float] | None
    lat: list[float] | None
    fail_npus: list[int]
    fail_links: list[tuple[int, int]]
    fail_directed: list[tuple[int, int]]


def parse_spec(spec: str, default_bw: Values, default_lat: Values) -> ParsedSpec:
    """Read a topology spec into axes, failures and its canonical name.

    Parameters
    ----------
    spec
        The spec text (spaces ignored, kinds and option keys case-insensitive).
    default_bw, default_lat
        Bandwidth (GB/s) and latency (ns) of axes the spec gives no ``bw=``/``lat=``
        for: one value, or one per axis.

    Raises
    ------
    TopologyError
        On an empty or malformed spec, an unknown kind or option, a wrong number of
        sizes or values, an axis of fewer than 2 NPUs, or a bad bandwidth or latency.
        The message starts with the spec.

    Notes
    -----
    O(len(spec) + axes).
    """
    text = spec.strip().replace(" ", "")
    if not text:
        raise TopologyError("topology spec is empty; try e.g. mesh2d:8x8 or ring:16")
    shape, *options = text.split(",")
    groups, shape_parts = _read_shape(spec, shape)
    opts = _read_options(spec, options)
    axes = _expand_groups(spec, groups)
    where = f"topology spec {spec!r}"
    bws = per_axis(opts.bw if opts.bw is not None else default_bw, len(axes), "bw", where)
    lats = per_axis(opts.lat if opts.lat is not None else default_lat, len(axes), "lat", where)
    dims = [Dim(k, s, b, la) for (k, s), b, la in zip(axes, bws, lats, strict=True)]
    for d in dims:
        if d.size < 2 and len(dims) > 1:  # one NPU alone is a topology (no link); an axis of one is not
            raise TopologyError(
                f"{where}: topology {dim_spec(d)}: an axis needs at least 2 NPUs, got {d.size}"
            )
    try:
        check_axes(dims)
    except TopologyError as exc:
        raise TopologyError(f"{where}: {exc}") from exc
    name = f"{'+'.join(shape_parts)},{values_spec(dims)}"
    items = [str(x) for x in opts.fail_npus] + [link_text(a, b, True) for a, b in opts.fail_links]
    items += [link_text(a, b, False) for a, b in opts.fail_directed]
    if items:
        name = f"{name},fail={'/'.join(items)}"
    return ParsedSpec(
        tuple(dims), name, tuple(opts.fail_npus), tuple(opts.fail_links), tuple(opts.fail_directed)
    )


def _read_shape(spec: str, shape: str) -> tuple[list[tuple[str, list[int]]], list[str]]:
    """``(canonical kind, sizes)`` per ``+``-joined part, and the parts as written."""
    groups: list[tuple[str, list[int]]] = []
    shape_parts: list[str] = []
    for part in shape.split("+"):
        m = re.fullmatch(r"([a-zA-Z0-9]+?):([0-9]+(?:x[0-9]+)*)", part)
        if not m:
            raise TopologyError(
                f"topology spec {spec!r}: cannot read {part!r}; expected kind:sizes like mesh2d:8x8"
            )
        raw_kind = m.group(1).lower()
        if raw_kind not in KINDS:
            kinds = ", ".join(sorted(KINDS))
            raise TopologyError(f"topology spec {spec!r}: unknown kind {m.group(1)!r}; expected {kinds}")
        kind, arity = KINDS[raw_kind]
        sizes = [int(x) for x in m.group(2).split("x")]
        if arity and len(sizes) != arity:
            raise TopologyError(
                f"topology spec {spec!r}: {raw_kind} takes {arity} size(s), got {m.group(2)!r}"
            )
        if kind in _SINGLE_SIZE and len(sizes) != 1:
            raise TopologyError(f"topology spec {spec!r}: {raw_kind} takes one size")
        groups.append((kind, sizes))
        shape_parts.append(f"{raw_kind}:{m.group(2)}")
    return groups, shape_parts


def _read_options(spec: str, options: list[str]) -> _Options:
    """The ``bw=``, ``lat=`` and ``fail=`` options, each at most once."""
    opts = _Options(None, None, [], [], [])
    seen: set[str] = set()
    for opt in options:
        key, eq, value = opt.partition("=")
        key = key.lower()
        if not eq or key not in ("bw", "lat", "fail"):
            raise TopologyError(
                f"topology spec {spec!r}: unknown option {opt!r}; expected bw=, lat= or fail="
            )
        if key in seen:
            raise TopologyError(f"topology spec {spec!r}: option {key}= given twice")
        seen.add(key)
        if key == "fail":
            _read_failures(spec, value, opts)
            continue
        if not re.fullmatch(rf"{_NUMBER}(?:/{_NUMBER})*", value):
            raise TopologyError(
                f"topology spec {spec!r}: {key}={value!r} is not a number or numbers joined by /"
            )
        vals = [float(v) for v in value.split("/")]
        opts = opts._replace(bw=vals) if key == "bw" else opts._replace(lat=vals)
    return opts


def link_pair(text: str) -> tuple[int, int, bool] | None:
    """``"5-6"`` → ``(5, 6, True)`` (both directions), ``"5>6"`` → ``(5, 6, False)``; else None.

    The one way links are named: ``fail=`` here, ``--fail`` and ``--degrade`` of a simulation.

    >>> link_pair("5-6"), link_pair("5>6"), link_pair("5")
    ((5, 6, True), (5, 6, False), None)
    """
    m = re.fullmatch(r"([0-9]+)([->])([0-9]+)", text.strip())
    return None if m is None else (int(m.group(1)), int(m.group(3)), m.group(2) == "-")


def link_text(a: int, b: int, both: bool) -> str:
    """The inverse of :func:`link_pair`: ``A-B`` or ``A>B``."""
    return f"{a}{'-' if both else '>'}{b}"


def _read_failures(spec: str, value: str, opts: _Options) -> None:
    """Append the ``/``-separated failures of ``fail=value`` to ``opts``' lists."""
    for item in value.split("/"):
        pair = link_pair(item)
        if re.fullmatch(r"[0-9]+", item):
            opts.fail_npus.append(int(item))
        elif pair is not None:
            (opts.fail_links if pair[2] else opts.fail_directed).append(pair[:2])
        else:
            raise TopologyError(
                f"topology spec {spec!r}: cannot read failure {item!r}; expected NPU, A-B or A>B"
            )


def _expand_groups(spec: str, groups: list[tuple[str, list[int]]]) -> list[tuple[str, int]]:
    """Axes ``(axis kind, size)`` of the shape: meshes are lines, tori rings, hypercubes 2-lines."""
    axes: list[tuple[str, int]] = []
    for kind, sizes in groups:
        if kind == "hypercube":
            n = sizes[0]
            if n < 2 or n & (n - 1):
                raise TopologyError(
                    f"topology spec {spec!r}: hypercube needs a power-of-two NPU count, got {n}"
                )
            axes += [("line", 2)] * (n.bit_length() - 1)
        elif kind == "mesh":
            axes += [("line", s) for s in sizes]
        elif kind == "torus":
            axes += [("ring", s) for s in sizes]
        else:
            axes.append((kind, sizes[0]))
    return axes


def default_topology(trace: Trace) -> str:
    """The topology spec used when none is given: a ring over the trace's ranks (≥ 2).

    Its links take the defaults, 50 GB/s and 500 ns (ASTRA-sim's regression-case
    network).
    """
    ranks = trace.ranks
    return f"ring:{max(2, (max(ranks) + 1) if ranks else 2)}"
