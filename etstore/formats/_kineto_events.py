"""Kineto events as columns, and what their layout says: nesting, communication calls, launches.

The structure of a Kineto trace is implicit: an event's parent is the event on the same
lane (``pid``, ``tid``: a CPU thread or a GPU stream) whose interval encloses it, a
communication call is a nest of CPU events whose names say communication, and a kernel's
launch is the runtime call sharing its ``correlation``. :mod:`etstore.formats.kineto`
turns what this module finds into ops and dependencies.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from etstore.errors import TraceFormatError
from etstore.formats._torch_comm import (
    CommArgs,
    CommKind,
    comm_args,
    comm_kind,
    comm_prefixed,
    dtype_size,
    parse_int_list,
)

__all__ = [
    "GPU_CATS",
    "KERNEL_CATS",
    "RPC",
    "Call",
    "Events",
    "calls",
    "check_event",
    "enclosing_call",
    "events",
    "is_kineto",
    "launches",
    "nesting",
]

# device-side categories (Kineto spells some differently across versions)
GPU_CATS = frozenset(
    {
        "kernel",
        "Kernel",
        "gpu_memcpy",
        "gpu_memset",
        "Memcpy",
        "Memset",
        "gpu_user_annotation",
        "mtia_ccp_events",
    }
)
KERNEL_CATS = frozenset({"kernel", "Kernel"})
_RUNTIME_CATS = frozenset(
    {"cuda_runtime", "cuda_driver", "Runtime", "Driver", "hip_runtime", "privateuse1_runtime"}
)
_SPAN_CATS = frozenset({"Trace"})  # the profiler's own span over the whole window: not an op
RPC = "record_param_comms"


def is_kineto(doc: Any) -> bool:
    """Whether a parsed JSON document is a Kineto / Chrome trace (a ``traceEvents`` list)."""
    return isinstance(doc, Mapping) and isinstance(doc.get("traceEvents"), list)


# ---------------------------------------------------------------- columns of one file


@dataclass
class Events:
    """One file's complete events as columns, in file order."""

    raw: list[dict[str, Any]]
    names: list[str]
    cats: list[str]
    args: list[Mapping[str, Any]]
    ts: np.ndarray  # float64 µs
    dur: np.ndarray  # float64 µs
    lane: np.ndarray  # int64: one code per (pid, tid)
    gpu: np.ndarray  # bool
    correlation: np.ndarray  # int64, -1 when absent
    other: list[Any]  # every non-op event, in file order


_SCALAR_FIELDS = ("name", "cat", "ph", "pid", "tid")
"""Fields every reader compares, hashes or groups by: a list or an object there is no Kineto."""


def check_event(e: dict[str, Any], i: int, path: Path) -> None:
    """Refuse an event whose ``name``, ``cat``, ``ph``, ``pid`` or ``tid`` is a list or an object.

    Why: Kineto writes each as a string or a number; the readers look them up in sets and
    dicts, where a list is unhashable (a TypeError traceback, not a message).

    Raises
    ------
    TraceFormatError
        Naming the file, the event's index and the field.
    """
    for key in _SCALAR_FIELDS:
        value = e.get(key)
        if isinstance(value, (list, dict)):
            raise TraceFormatError(
                f"{path}: traceEvents[{i}]: {key!r} must be a string or a number, got "
                f"{'a list' if isinstance(value, list) else 'an object'}"
            )


def events(doc: Any, path: Path) -> Events:
    """Split a document's events into op columns and the rest (kept verbatim)."""
    if not is_kineto(doc):
        raise TraceFormatError(
            f"{path}: not a Kineto trace (expected a JSON object with a 'traceEvents' list)"
        )
    raw: list[dict[str, Any]] = []
    other: list[Any] = []
    for i, e in enumerate(doc["traceEvents"]):
        if not isinstance(e, dict):
            raise TraceFormatError(f"{path}: traceEvents[{i}] is not an object: {str(e)[:60]}")
        check_event(e, i, path)
        if e.get("ph") == "X" and e.get("cat") not in _SPAN_CATS:
            if _number(e.get("ts"), -1.0) < 0:
                raise TraceFormatError(
                    f"{path}: traceEvents[{i}] ({str(e.get('name'))[:60]!r}) has no numeric 'ts' "
                    f"in 0..2^63 µs, got {str(e.get('ts'))[:40]}"
                )
            raw.append(e)
        else:
            other.append(e)
    lanes: dict[tuple[str, str], int] = {}
    lane = np.fromiter(
        (lanes.setdefault((str(e.get("pid")), str(e.get("tid"))), len(lanes)) for e in raw),
        np.int64,
        len(raw),
    )
    cats = [str(e.get("cat", "")) for e in raw]
    args = [a if isinstance(a := e.get("args"), Mapping) else {} for e in raw]
    dur = np.fromiter((_number(e.get("dur")) for e in raw), np.float64, len(raw))
    return Events(
        raw=raw,
        names=[str(e.get("name", "")) for e in raw],
        cats=cats,
        args=args,
        ts=np.fromiter((_number(e["ts"]) for e in raw), np.float64, len(raw)),
        dur=np.maximum(dur, 0.0),
        lane=lane,
        gpu=np.fromiter((c in GPU_CATS for c in cats), bool, len(raw)),
        correlation=np.fromiter((_correlation(a) for a in args), np.int64, len(raw)),
        other=other,
    )


def _number(value: Any, default: float = 0.0) -> float:
    """A time in µs: a JSON number in 0..2^63, else ``default`` (the columns are unsigned 64-bit)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    try:
        number = float(value)
    except OverflowError:  # an integer past the float range
        return default
    return number if 0.0 <= number < 2.0**63 else default


def _correlation(args: Mapping[str, Any]) -> int:
    c = args.get("correlation")
    return c if isinstance(c, int) and not isinstance(c, bool) and 0 <= c < 2**63 else -1


# ---------------------------------------------------------------- nesting and order


def nesting(ev: Events) -> tuple[np.ndarray, np.ndarray]:
    """``(parent, prev)`` per event: the enclosing event on its lane and the event it waits for.

    Per lane, events sorted by start (longer first on ties) are pushed on a stack of open
    intervals; ``prev`` is the previous sibling at the same depth, or for a first child
    its parent's ``prev`` (it starts with its parent). -1 for none. O(n log n).
    """
    n = len(ev.ts)
    order = np.lexsort((np.arange(n), -ev.dur, ev.ts, ev.lane))
    ts, end = ev.ts.tolist(), (ev.ts + ev.dur).tolist()  # Python floats: no numpy scalars in the loop
    lanes = ev.lane.tolist()
    par, prv = [-1] * n, [-1] * n
    stack: list[int] = []  # open events (indices into ev)
    last_child: dict[int, int] = {}  # open event (or -1 - lane for the lane's top level) -> last child
    current_lane = None
    for i in order.tolist():
        lane = lanes[i]
        if lane != current_lane:
            current_lane, stack = lane, []
        t = ts[i]
        while stack and end[stack[-1]] <= t and not (end[stack[-1]] == t == ts[stack[-1]]):
            stack.pop()
        while stack and end[i] > end[stack[-1]] + 1e-9:  # overlaps without nesting: not a child
            stack.pop()
        holder = stack[-1] if stack else -1 - lane
        sibling = last_child.get(holder)
        if sibling is not None:
            prv[i] = sibling
        elif stack:
            prv[i] = prv[stack[-1]]
        if stack:
            par[i] = stack[-1]
        last_child[holder] = i
        stack.append(i)
    parent = np.array(par, dtype=np.int64)
    prev = np.array(prv, dtype=np.int64)
    return parent, prev


# ---------------------------------------------------------------- communication calls


@dataclass
class Call:
    """One communication call: its nest of CPU events and what they say."""

    members: list[int]
    kind: CommKind | None = None
    info: CommArgs | None = None  # from record_param_comms, when present
    size: int | None = None
    peer: int | None = None
    tag: int | None = None


def _comm_event_kind(name: str, args: Mapping[str, Any]) -> CommKind | None:
    """The kind a CPU event names, if it is part of a communication call."""
    if name == RPC:
        collective = args.get("Collective name")
        return comm_kind(str(collective)) if collective is not None else None
    if comm_prefixed(name):
        return comm_kind(name)
    return None


def calls(ev: Events, parent: np.ndarray) -> tuple[dict[int, Call], np.ndarray]:
    """Group communication events into calls; returns ``{root: call}`` and each event's root (-1)."""
    n = len(ev.names)
    root_of = np.full(n, -1, dtype=np.int64)
    is_comm = np.zeros(n, dtype=bool)
    kinds: dict[int, CommKind | None] = {}
    for i in range(n):
        if ev.gpu[i]:
            continue
        name = ev.names[i]
        if name == RPC or comm_prefixed(name):
            kinds[i] = _comm_event_kind(name, ev.args[i])
            is_comm[i] = kinds[i] is not None or name == RPC
    calls: dict[int, Call] = {}
    for i in sorted(kinds, key=lambda j: (ev.ts[j], -ev.dur[j], j)):
        if not is_comm[i]:
            continue
        p, root = int(parent[i]), i
        while p >= 0:
            if is_comm[p]:
                root = int(root_of[p]) if root_of[p] >= 0 else p
                break
            p = int(parent[p])
        root_of[i] = root
        calls.setdefault(root, Call(members=[])).members.append(i)
    for call in calls.values():
        _describe(call, ev, kinds)
    calls = {r: c for r, c in calls.items() if c.kind is not None}
    _pair_async(calls, ev, root_of)
    _borrow_dtypes(calls, ev)
    return calls, root_of


def _is_c10d(name: str) -> bool:
    return name.startswith(("c10d::", "_c10d", "c10d_"))


def _pair_async(calls: dict[int, Call], ev: Events, root_of: np.ndarray) -> None:
    """Join each backend's asynchronous execution record to the ``c10d::`` call that issued it.

    gloo (and other CPU backends) run a collective on a worker thread: its
    ``gloo:all_reduce`` annotation is then no child of the ``c10d::allreduce_`` call. The
    k-th such lone execution belongs to the earliest waiting call that started before it
    (the worker runs calls in issue order), whatever collective it names: gloo runs a
    reduce-scatter as an all-reduce, and the call says what the program did. A joined call
    keeps the issuing call's root and kind and gains the execution's members, so it counts
    once. O(c log c).
    """
    issued: list[int] = []
    runs: list[int] = []
    for root, call in calls.items():
        if call.kind is None or call.info is not None:
            continue
        names = [ev.names[i] for i in call.members]
        if all(_is_c10d(n) for n in names):
            issued.append(root)
        elif not any(_is_c10d(n) for n in names):
            runs.append(root)
    if runs:
        waiting = sorted(issued, key=lambda r: ev.ts[r])
        at = 0
        for run in sorted(runs, key=lambda r: ev.ts[r]):
            if at < len(waiting) and ev.ts[waiting[at]] <= ev.ts[run]:
                issuer, joined = calls[waiting[at]], calls.pop(run)
                issuer.members.extend(joined.members)
                root_of[joined.members] = waiting[at]
                if joined.size is not None:  # the execution's tensor has the element type
                    issuer.size = joined.size
                at += 1


def _borrow_dtypes(calls: dict[int, Call], ev: Events) -> None:
    """Sizes of calls whose records give a shape but no element type (``TensorList``).

    Another record of the same collective with the same shape names the type (a training
    loop repeats its collectives); O(c).
    """
    elem: dict[tuple[CommKind, str], int] = {}
    for call in calls.values():
        for i in call.members:
            shape, size = _first_shape(ev.args[i]), _input_bytes(ev.args[i])
            if call.kind is not None and shape is not None and size is not None:
                n = math.prod(shape)
                if n:
                    elem.setdefault((call.kind, str(shape)), size // n)
    for call in calls.values():
        if call.size is not None or call.kind is None:
            continue
        for i in call.members:
            shape = _first_shape(ev.args[i])
            if shape is not None and (call.kind, str(shape)) in elem:
                call.size = _fits(math.prod(shape) * elem[(call.kind, str(shape))])
                break


def enclosing_call(i: int, parent: np.ndarray, root_of: np.ndarray) -> int:
    """Root of the communication call whose nest holds event ``i`` (walking up its parents), or -1."""
    while i >= 0:
        if root_of[i] >= 0:
            return int(root_of[i])
        i = int(parent[i])
    return -1


def _describe(call: Call, ev: Events, kinds: Mapping[int, CommKind | None]) -> None:
    """Fill a call's kind, size, peer and tag from its members.

    ``record_param_comms`` arguments first (counts, dtype, group), then the backend
    annotation (``nccl:all_to_all``: its input tensor), then the ``c10d::`` op (whose
    first tensor may be the output buffer).
    """
    for i in call.members:
        if ev.names[i] == RPC and kinds.get(i) is not None:
            call.info = comm_args(ev.args[i])
            call.kind, call.size = call.info.kind, call.info.size_bytes
            break
    ranked = sorted(
        (i for i in call.members if kinds.get(i) is not None and ev.names[i] != RPC),
        key=lambda i: (_is_c10d(ev.names[i]), ev.ts[i]),
    )
    for i in ranked:
        if call.kind is None:
            call.kind = kinds[i]
        if call.size is None:
            call.size = _input_bytes(ev.args[i])
        peer, tag = _peer_and_tag(ev.args[i])
        call.peer = call.peer if call.peer is not None else peer
        call.tag = call.tag if call.tag is not None else tag
    if call.info is not None and call.peer is None:
        send = call.kind is not None and call.kind.node_type == "COMM_SEND_NODE"
        call.peer = call.info.dst_rank if send else call.info.src_rank


def _fits(size: int) -> int | None:
    """A byte count the int64 column holds, else None (the event's JSON keeps the shape)."""
    return size if 0 <= size < 2**63 else None


def _first_shape(args: Mapping[str, Any]) -> list[int] | None:
    """Shape of an event's first tensor input (the first of a tensor list), if recorded."""
    dims = args.get("Input Dims")
    if not isinstance(dims, list) or not dims:
        return None
    shape = dims[0]
    while isinstance(shape, list) and shape and isinstance(shape[0], list):
        shape = shape[0]
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        return None
    return shape


def _input_bytes(args: Mapping[str, Any]) -> int | None:
    """Bytes of an event's first tensor input (``Input Dims`` × ``Input type``), if recorded."""
    shape, types = _first_shape(args), args.get("Input type")
    if shape is None or not isinstance(types, list) or not types:
        return None
    elem = dtype_size(str(types[0]))
    return None if elem is None else int(np.prod(shape, dtype=np.int64)) * elem


def _peer_and_tag(args: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """Peer and tag of ``c10d::send``/``recv_`` from ``Concrete Inputs`` (tensors, pg, peer, tag)."""
    concrete = args.get("Concrete Inputs")
    if not isinstance(concrete, list) or len(concrete) < 4:
        return None, None
    values = parse_int_list(concrete[2:4])
    return (values[0], values[1]) if values else (None, None)


# ---------------------------------------------------------------- launches


def launches(ev: Events, flows: Sequence[Any]) -> np.ndarray:
    """Launching runtime event of each device event (-1): by ``correlation``, else the ac2g flow."""
    n = len(ev.names)
    launch = np.full(n, -1, dtype=np.int64)
    runtime = np.fromiter((c in _RUNTIME_CATS for c in ev.cats), bool, n)
    by_corr: dict[int, int] = {}
    for i in np.flatnonzero(runtime & (ev.correlation >= 0)).tolist():
        by_corr.setdefault(int(ev.correlation[i]), i)
    flow_corr = _flow_correlations(ev, flows)
    for i in np.flatnonzero(ev.gpu).tolist():
        c = int(ev.correlation[i])
        if c < 0:
            c = flow_corr.get(i, -1)
        launch[i] = by_corr.get(c, -1)
    return launch


def _flow_correlations(ev: Events, flows: Sequence[Any]) -> dict[int, int]:
    """``{device event: flow id}`` for ac2g flow ends bound to device events without correlation."""
    missing = np.flatnonzero(ev.gpu & (ev.correlation < 0))
    if len(missing) == 0:
        return {}
    at = {
        (str(ev.raw[i].get("pid")), str(ev.raw[i].get("tid")), float(ev.ts[i])): i for i in missing.tolist()
    }
    out: dict[int, int] = {}
    for f in flows:
        if (
            isinstance(f, dict)
            and f.get("ph") == "f"
            and f.get("cat") == "ac2g"
            and isinstance(f.get("id"), int)
        ):
            key = (str(f.get("pid")), str(f.get("tid")), _number(f.get("ts")))
            if key in at:
                out[at[key]] = f["id"]
    return out
