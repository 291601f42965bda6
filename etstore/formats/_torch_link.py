"""Link a PyTorch execution trace with the Kineto trace of the same rank.

The execution trace (ET) knows what ran and on which tensors; the Kineto trace knows
when and for how long, and which GPU kernels each CPU op launched. Both name a CPU op by
its record-function id: the ET's ``rf_id``, Kineto's ``Record function id`` argument
(PyTorch ≥ 2.1). Older Kineto traces carry only ``External id``, which counts the same
record functions from a different origin (the profiler's own step annotation comes
first), so the offset between the two is found by a vote over the op names that occur
once in each file, and a pair is linked only when the names agree.

Kernels (and memcpy/memset) are joined to their launching runtime call by
``correlation``; the launching CPU op is the innermost linked op on the call's thread
whose interval contains the call (walked up the ET's parent links, O(depth)).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import orjson

from etstore.errors import TraceFormatError
from etstore.formats._kineto_events import check_event
from etstore.formats._torch_comm import ProcessGroup, process_groups
from etstore.formats._torch_sync import HostWaits, device_columns, device_waits, host_waits

__all__ = ["KernelOps", "LinkResult", "dumps", "link_rank", "recorded_window"]

# Kineto categories of host-side events that an ET node can correspond to
_CPU_CATS = frozenset({"cpu_op", "user_annotation", "operator", "Operator", "cpu_instant_event"})
# device-side activities that become ops of their own
_GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset", "mtia_ccp_events"})
# runtime calls that launch a device activity (joined by ``correlation``)
# how far past the last link an op's Kineto event may sit (ops the profiler numbered in between)
_WINDOW = 32
# a thread without unique names is placed by trying every event named like one of its first ops
_HEADS = 8
_RUNTIME_CATS = frozenset(
    {"cuda_runtime", "cuda_driver", "Runtime", "Driver", "hip_runtime", "privateuse1_runtime"}
)


def dumps(value: Any) -> bytes:
    """Compact JSON bytes of ``value`` (the raw source record kept per op)."""
    return orjson.dumps(value)


class KernelOps(NamedTuple):
    """Device activities that linked ET ops launched, in start-time order."""

    names: list[str]
    start_us: np.ndarray  # int64, Kineto ts rounded to µs
    dur_us: np.ndarray  # int64
    stream: np.ndarray  # int64 (the event's stream, else its tid)
    launcher: np.ndarray  # int64 row of the launching ET node, -1 if unknown
    raw: list[bytes]  # each event's JSON
    args: list[Mapping[str, Any]]  # each event's args
    held: tuple[np.ndarray, np.ndarray]  # (src, dst): dst waited on another stream for src


class LinkResult(NamedTuple):
    """What the Kineto trace adds to one rank's ET nodes (arrays indexed by ET row)."""

    linked: np.ndarray  # bool
    start_us: np.ndarray  # int64 (0 when unlinked)
    incl_us: np.ndarray  # int64 inclusive duration (0 when unlinked)
    self_us: np.ndarray  # int64 inclusive minus the linked children's inclusive, at least 0
    raw: list[bytes | None]  # the linked Kineto event's JSON
    num_linkable: int
    kernels: KernelOps  # the device activities the linked ops launched
    num_device_events: int  # all device activities in the file
    rank: int | None  # distributedInfo.rank
    world_size: int | None  # distributedInfo.world_size
    groups: dict[str, ProcessGroup]  # distributedInfo.pg_config
    waits: HostWaits  # blocking runtime calls inside linked ops, with what released them
    thread: np.ndarray  # int64 per ET row: the Kineto thread (pid, tid) it ran on, as a code; -1 unlinked
    steps: list[tuple[str, int, int]]  # ProfilerStep#N annotations: name, start, duration (µs)
    activity: tuple[np.ndarray, np.ndarray]  # every host event on a linked thread: thread code, start (µs)


def _events(doc: Any, path: Path) -> list[dict[str, Any]]:
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise TraceFormatError(f"{path}: not a Kineto trace (expected a 'traceEvents' list)")
    for i, e in enumerate(events):
        if isinstance(e, dict):
            check_event(e, i, path)
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]


def _us(value: Any) -> int:
    return round(float(value)) if isinstance(value, (int, float)) else 0


def _score(
    offset: int, rows: np.ndarray, names: Sequence[str], rf_ids: np.ndarray, by_key: Mapping[int, str]
) -> int:
    """How many of ``rows`` find an equal name at ``rf_id + offset``."""
    return sum(by_key.get(int(rf_ids[r]) + offset) == names[r] for r in rows.tolist())


def _thread_offsets(
    names: Sequence[str],
    rf_ids: np.ndarray,
    tids: np.ndarray,
    rows: np.ndarray,
    cpu: list[dict[str, Any]],
    by_key: Mapping[int, int],
) -> dict[int, int]:
    """Kineto ``External id`` minus ET ``rf_id``, per ET thread.

    Kineto numbers each thread's events in a block of its own, so one offset per thread.
    Names that occur once in each file vote; a thread without such anchors tries every
    event named like the rarest of its first ops and keeps the offset that matches most names in a
    sample of its ops (at least half must match); ties go to the candidate nearest in
    time to the anchored threads.
    """
    name_of = {k: str(cpu[i].get("name")) for k, i in by_key.items()}
    k_count = Counter(name_of.values())
    k_unique = {n: k for k, n in name_of.items() if k_count[n] == 1}
    et_count = Counter(names[r] for r in rows.tolist())
    offsets: dict[int, int] = {}
    tied: dict[int, list[int]] = {}
    for tid in np.unique(tids[rows]).tolist():
        mine = rows[tids[rows] == tid]
        votes = Counter(
            k_unique[names[r]] - int(rf_ids[r])
            for r in mine.tolist()
            if et_count[names[r]] == 1 and names[r] in k_unique
        )
        if votes:
            offsets[tid] = votes.most_common(1)[0][0]
            continue
        heads = {names[r]: int(rf_ids[r]) for r in mine[:_HEADS][::-1].tolist() if k_count[names[r]]}
        if not heads:
            continue
        rarest = min(heads, key=lambda n: k_count[n])  # fewest candidates to score
        cands = sorted({k - heads[rarest] for k, n in name_of.items() if n == rarest})
        sample = mine[np.linspace(0, len(mine) - 1, min(len(mine), 200)).astype(np.int64)]
        scores = [_score(c, sample, names, rf_ids, name_of) for c in cands]
        if scores and 2 * max(scores) >= len(sample):  # below half: another run's trace, not linked
            best = max(scores)
            tied[tid] = [c for c, sc in zip(cands, scores, strict=True) if sc == best]
    window = [
        float(cpu[by_key[k]].get("ts", 0))
        for tid, off in offsets.items()
        for r in rows[tids[rows] == tid][:1].tolist() + rows[tids[rows] == tid][-1:].tolist()
        if (k := int(rf_ids[r]) + off) in by_key
    ]
    centre = float(np.mean(window)) if window else None
    for tid, cands in tied.items():
        if centre is None or len(cands) == 1:
            offsets[tid] = cands[0]
            continue
        first_row = int(rows[tids[rows] == tid][0])

        def distance(c: int, first_row: int = first_row) -> float:
            j = by_key.get(int(rf_ids[first_row]) + c)
            return abs(float(cpu[j].get("ts", 0)) - centre) if j is not None else float("inf")

        offsets[tid] = min(cands, key=distance)
    return offsets


def _match(
    cpu: list[dict[str, Any]],
    names: Sequence[str],
    rf_ids: np.ndarray,
    tids: np.ndarray,
    linkable: np.ndarray,
) -> np.ndarray:
    """Index into ``cpu`` of each ET row's Kineto event, -1 when unlinked."""
    has_rf = any("Record function id" in e.get("args", {}) for e in cpu)
    key_name = "Record function id" if has_rf else "External id"
    by_key: dict[int, int] = {}
    for i, e in enumerate(cpu):
        k = e.get("args", {}).get(key_name)
        if isinstance(k, int):
            by_key.setdefault(k, i)
    rows = np.flatnonzero(linkable & (rf_ids >= 0))
    found = np.full(len(names), -1, dtype=np.int64)
    if not len(rows) or not by_key:
        return found
    if has_rf:  # the same id on both sides
        for row in rows.tolist():
            j = by_key.get(int(rf_ids[row]))
            if j is not None and cpu[j].get("name") == names[row]:
                found[row] = j
        return found
    offsets = _thread_offsets(names, rf_ids, tids, rows, cpu, by_key)
    for tid, off in offsets.items():
        mine = rows[tids[rows] == tid]
        _align(mine[np.argsort(rf_ids[mine], kind="stable")], off, names, rf_ids, cpu, by_key, found)
    return found


def _align(
    rows: np.ndarray,
    offset: int,
    names: Sequence[str],
    rf_ids: np.ndarray,
    cpu: list[dict[str, Any]],
    by_key: Mapping[int, int],
    found: np.ndarray,
) -> None:
    """Walk one ET thread (rows in ``rf_id`` order) along its Kineto thread (events in
    ``External id`` order) from the offset's starting point, linking equal names.

    The offset drifts where the profiler numbered another thread's events in between,
    so each op is looked for in a short window after the last link instead of at a fixed
    offset; an op with no equal name in the window stays unlinked. O(rows · window).
    """
    hits = Counter(
        cpu[j].get("tid")
        for r in rows.tolist()
        if (j := by_key.get(int(rf_ids[r]) + offset)) is not None and cpu[j].get("name") == names[r]
    )
    if not hits:
        return
    ktid = hits.most_common(1)[0][0]
    keys = sorted(k for k, i in by_key.items() if cpu[i].get("tid") == ktid)
    seq = [by_key[k] for k in keys]
    seq_names = [cpu[i].get("name") for i in seq]
    j = int(np.searchsorted(np.asarray(keys, dtype=np.int64), int(rf_ids[rows[0]]) + offset))
    for r in rows.tolist():
        want = names[r]
        for step in range(_WINDOW):
            if j + step >= len(seq):
                break
            if seq_names[j + step] == want:
                found[r] = seq[j + step]
                j += step + 1
                break


class _Innermost:
    """The innermost linked ET row whose interval holds a time on a thread (walked up the
    ET's parent links, O(depth) per question)."""

    def __init__(
        self,
        tid_of_row: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
        linked: np.ndarray,
        parent_row: np.ndarray,
    ) -> None:
        self.start, self.end, self.linked, self.parent_row = start, end, linked, parent_row
        self.per_tid: dict[Any, tuple[np.ndarray, np.ndarray]] = {}
        rows = np.flatnonzero(linked)
        for tid in {tid_of_row[r] for r in rows.tolist()}:
            mine = rows[[tid_of_row[r] == tid for r in rows.tolist()]]
            order = np.lexsort((-(end[mine] - start[mine]), start[mine]))  # outer op first on equal start
            self.per_tid[tid] = (mine[order], start[mine][order])

    def __call__(self, tid: Any, t: int) -> int:
        if tid not in self.per_tid:
            return -1
        cand_rows, cand_start = self.per_tid[tid]
        i = int(np.searchsorted(cand_start, t, side="right")) - 1
        row = int(cand_rows[i]) if i >= 0 else -1
        while row >= 0 and not (self.linked[row] and self.start[row] <= t <= self.end[row]):
            row = int(self.parent_row[row])
        return row


def _by_correlation(runtime: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Runtime calls by their ``correlation`` (what joins a call to the device event it launched)."""
    out = {}
    for e in runtime:
        c = e.get("args", {}).get("correlation")
        if isinstance(c, int):
            out[c] = e
    return out


def _launch_calls(
    gpu: list[dict[str, Any]], by_corr: Mapping[int, dict[str, Any]]
) -> list[dict[str, Any] | None]:
    """The runtime call that launched each device event, or None."""
    out: list[dict[str, Any] | None] = []
    for e in gpu:
        c = e.get("args", {}).get("correlation")
        out.append(by_corr.get(c) if isinstance(c, int) else None)
    return out


def _launchers(calls: list[dict[str, Any] | None], innermost: _Innermost) -> np.ndarray:
    """ET row of the op that launched each device event (-1 if no linked op contains the call)."""
    out = np.full(len(calls), -1, dtype=np.int64)
    for k, c in enumerate(calls):
        if c is not None:
            out[k] = innermost(c.get("tid"), _us(c.get("ts")))
    return out


def _thread_codes(
    tid_of_row: np.ndarray, start: np.ndarray, runtime: Sequence[Mapping[str, Any]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's Kineto thread as a small integer (-1 where unlinked), and the thread code and
    start of every linked op and runtime call (``tid`` keyed as ``(pid, tid)``) on one of those
    threads, by thread then start."""
    codes: dict[Any, int] = {}
    rows = np.asarray(
        [-1 if t is None else codes.setdefault(t, len(codes)) for t in tid_of_row.tolist()], dtype=np.int64
    )
    code = np.fromiter((codes.get(e["tid"], -1) for e in runtime), np.int64, len(runtime))
    ts = np.fromiter((_us(e.get("ts")) for e in runtime), np.int64, len(runtime))
    code, ts = np.r_[rows[rows >= 0], code[code >= 0]], np.r_[start[rows >= 0], ts[code >= 0]]
    order = np.lexsort((ts, code))
    return rows, code[order], ts[order]


def _steps(events: list[dict[str, Any]]) -> list[tuple[str, int, int]]:
    """The profiler's step annotations (``ProfilerStep#N``): name, start and duration (µs)."""
    out = [
        (str(e.get("name")), _us(e.get("ts")), _us(e.get("dur")))
        for e in events
        if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"
    ]
    return sorted(out, key=lambda s: s[1])


def link_rank(
    doc: Any,
    path: Path,
    names: Sequence[str],
    rf_ids: np.ndarray,
    tids: np.ndarray,
    parent_row: np.ndarray,
    linkable: np.ndarray,
) -> LinkResult:
    """Link one rank's ET nodes to the Kineto trace in ``path``.

    Parameters
    ----------
    doc, path
        The decoded Kineto trace (Chrome-trace JSON, as :func:`~etstore.formats._frames.load_json` reads it)
        and its file.
    names, rf_ids, tids
        Each ET node's name, record-function id (-1 when absent) and thread.
    parent_row
        Row of each node's parent (-1 for none).
    linkable
        Nodes a Kineto event can stand for (not the ET's root and metadata nodes).

    Returns
    -------
    LinkResult
        Times in µs per ET row, the device activities launched by linked ops (others, e.g.
        of iterations the ET did not record, are counted but left out) with their
        launchers, and the ``distributedInfo`` rank and process groups.

    Raises
    ------
    TraceFormatError
        The document has no ``traceEvents`` list.

    Notes
    -----
    O(E + V log V) for E Kineto events and V ET nodes, plus O(depth) per kernel.
    """
    events = _events(doc, path)
    cpu = [e for e in events if e.get("cat") in _CPU_CATS]
    gpu = sorted((e for e in events if e.get("cat") in _GPU_CATS), key=lambda e: _us(e.get("ts")))
    runtime = [e for e in events if e.get("cat") in _RUNTIME_CATS]
    n = len(names)
    found = _match(cpu, names, rf_ids, tids, linkable)
    linked = found >= 0
    start = np.zeros(n, dtype=np.int64)
    incl = np.zeros(n, dtype=np.int64)
    tid_of_row = np.full(n, None, dtype=object)
    raw: list[bytes | None] = [None] * n
    for row in np.flatnonzero(linked).tolist():
        e = cpu[found[row]]
        start[row] = _us(e.get("ts"))
        incl[row] = _us(e.get("dur"))
        tid_of_row[row] = (e.get("pid"), e.get("tid"))
        raw[row] = dumps(e)
    children = np.zeros(n, dtype=np.int64)
    has_parent = linked & (parent_row >= 0)
    np.add.at(children, parent_row[has_parent], incl[has_parent])
    self_us = np.where(linked, np.maximum(incl - children, 0), 0)
    runtime_keyed = [dict(e, tid=(e.get("pid"), e.get("tid"))) for e in runtime]
    innermost = _Innermost(tid_of_row, start, start + incl, linked, parent_row)
    by_corr = _by_correlation(runtime_keyed)
    calls = _launch_calls(gpu, by_corr)
    launcher = _launchers(calls, innermost)
    num_device = len(gpu)
    # what the ET's ops launched (a Kineto trace often spans more iterations than the ET), and
    # what was launched before them but still ran once they began (the previous step's tail)
    first = int(start[linked].min()) if linked.any() else 0
    g_end = np.asarray([_us(e.get("ts")) + _us(e.get("dur")) for e in gpu], dtype=np.int64)
    own_launch = np.asarray([c is None or _us(c.get("ts")) < first for c in calls], dtype=bool)
    keep = np.flatnonzero((launcher >= 0) | (own_launch & (g_end > first)))
    gpu = [gpu[i] for i in keep.tolist()]
    calls = [calls[i] for i in keep.tolist()]
    launcher = launcher[keep]
    device = device_columns(gpu, calls)
    cuda_sync = [e for e in events if e.get("cat") == "cuda_sync"]
    kernels = KernelOps(
        names=[str(e.get("name", "")) for e in gpu],
        start_us=device.start,
        dur_us=device.end - device.start,
        stream=device.stream,
        launcher=launcher,
        raw=[dumps(e) for e in gpu],
        args=[e.get("args", {}) for e in gpu],
        held=device_waits(device, cuda_sync, by_corr),
    )
    info = doc.get("distributedInfo") if isinstance(doc, dict) else None
    rank = info.get("rank") if isinstance(info, dict) else None
    thread, act_code, act_ts = _thread_codes(tid_of_row, start, runtime_keyed)
    return LinkResult(
        linked=linked,
        start_us=start,
        incl_us=incl,
        self_us=self_us,
        raw=raw,
        num_linkable=int(linkable.sum()),
        kernels=kernels,
        num_device_events=num_device,
        rank=rank if isinstance(rank, int) else None,
        world_size=world if isinstance(world := (info or {}).get("world_size"), int) else None,
        groups=process_groups(info if isinstance(info, dict) else None),
        waits=host_waits(runtime_keyed, device, innermost),
        thread=thread,
        steps=_steps(cpu),
        activity=(act_code, act_ts),
    )


def recorded_window(link: LinkResult) -> list[int]:
    """First start and last end (µs) of a rank's recorded ops: linked ET ops, device activities
    and blocking calls, as Kineto timed them."""
    k, w, on = link.kernels, link.waits, link.linked
    starts = np.concatenate([link.start_us[on], k.start_us, w.start_us])
    ends = np.concatenate([(link.start_us + link.incl_us)[on], k.start_us + k.dur_us, w.start_us + w.dur_us])
    return [int(starts.min()), int(ends.max())] if len(starts) else [0, 0]
