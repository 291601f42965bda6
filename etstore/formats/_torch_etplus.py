"""ET+ files: execution traces that Chakra's trace linker (``chakra_trace_link``) merged with
their Kineto traces.

The linker adds to every host node its Kineto ``ts``, ``inclusive_dur`` and
``exclusive_dur``, and adds each GPU kernel, memcpy and memset as a node of its own: a copy of
the CPU op that launched it (same attributes and tensors) with the activity's name, ``cat``,
``ts``, duration and ``stream``, whose ``ctrl_deps`` is that op. It renumbers the nodes.

So an ET+ reads as Chakra's converter reads it: the device nodes are taken out of the ET's
nodes (they are no ops of the program, and their copied tensors are no data flow) and become
the rank's device activities, launched by their ``ctrl_deps`` op, on their streams
(cross-stream waits inferred from idle gaps); a host op lasts its ``exclusive_dur`` and chains
by its ET thread. It is no recorded execution to replay: the linker drops the runtime calls
(blocking synchronizes, stream waits, launch times) and the Kineto threads (gloo's worker) that
the execution model of an ET + Kineto pair reads, so a wait is the waiting op's time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from etstore.formats._torch_comm import process_groups
from etstore.formats._torch_et_nodes import ROOT, EtNodes
from etstore.formats._torch_link import KernelOps, LinkResult, dumps
from etstore.formats._torch_sync import HostWaits, device_columns, device_waits

__all__ = ["DEVICE_CATS", "et_plus_link", "split_device_nodes"]

DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


def _us(value: Any) -> int:
    return round(float(value)) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _on_device(node: Any) -> bool:
    """Whether an ET+ node is a device activity (its ``cat``, when a string, says so)."""
    cat = node.get("cat") if isinstance(node, dict) else None
    return isinstance(cat, str) and cat in DEVICE_CATS


def split_device_nodes(doc: Any) -> tuple[Any, list[dict[str, Any]] | None]:
    """``doc`` without its device nodes, and those nodes; ``None`` when ``doc`` is no ET+ (its
    nodes carry no Kineto ``ts``)."""
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    if not isinstance(nodes, list) or not any(isinstance(n, dict) and "ts" in n for n in nodes):
        return doc, None
    device = [n for n in nodes if _on_device(n)]
    host = [n for n in nodes if not _on_device(n)]
    return {**doc, "nodes": host}, device


def et_plus_link(nodes: EtNodes, raw_nodes: list[dict[str, Any]], device: list[dict[str, Any]]) -> LinkResult:
    """What the ET+ fields say about ``nodes`` (its host nodes, parsed; ``raw_nodes`` the same
    nodes as JSON, by id) and its ``device`` nodes, as :func:`~._torch_link.link_rank` would
    from a Kineto trace."""
    by_id = {n.get("id"): n for n in raw_nodes}
    rows = [by_id.get(int(i), {}) for i in nodes.ids.tolist()]
    is_root = np.asarray([bool(ROOT.match(x)) for x in nodes.names])
    has = np.asarray(["ts" in r and "inclusive_dur" in r for r in rows]) & ~is_root
    start = np.asarray([_us(r.get("ts")) if h else 0 for r, h in zip(rows, has, strict=True)], dtype=np.int64)
    incl = np.asarray(
        [_us(r.get("inclusive_dur")) if h else 0 for r, h in zip(rows, has, strict=True)], np.int64
    )
    self_us = np.asarray(
        [_us(r.get("exclusive_dur")) if h else 0 for r, h in zip(rows, has, strict=True)], dtype=np.int64
    )
    codes: dict[int, int] = {}
    thread = np.asarray(
        [
            codes.setdefault(int(t), len(codes)) if h else -1
            for t, h in zip(nodes.tids.tolist(), has, strict=True)
        ],
        dtype=np.int64,
    )
    device = sorted(device, key=lambda d: _us(d.get("ts")))
    parent = np.asarray([d.get("ctrl_deps", -1) for d in device], dtype=object)
    pos = np.searchsorted(nodes.ids, np.asarray([p if isinstance(p, int) else -1 for p in parent], np.int64))
    pos_c = np.minimum(pos, len(nodes.ids) - 1)
    launcher = np.where(nodes.ids[pos_c] == [p if isinstance(p, int) else -1 for p in parent], pos_c, -1)
    events = [
        {
            "name": d.get("name", ""),
            "ts": d.get("ts"),
            "dur": d.get("inclusive_dur"),
            "args": {"stream": d.get("stream")},
        }
        for d in device
    ]
    launches = [
        {"ts": int(start[r]), "dur": int(incl[r]), "tid": int(thread[r])} if r >= 0 and has[r] else None
        for r in launcher.tolist()
    ]
    cols = device_columns(events, launches)
    kernels = KernelOps(
        names=[str(e["name"]) for e in events],
        start_us=cols.start,
        dur_us=cols.end - cols.start,
        stream=cols.stream,
        launcher=launcher.astype(np.int64),
        raw=[dumps(d) for d in device],
        args=[{} for _ in device],
        held=device_waits(cols),
    )
    empty = np.zeros(0, dtype=np.int64)
    act = np.flatnonzero(has)
    order = np.lexsort((start[act], thread[act]))
    steps = sorted(
        (nodes.names[i], int(start[i]), int(incl[i]))
        for i in act.tolist()
        if nodes.names[i].startswith("ProfilerStep#")
    )
    return LinkResult(
        linked=has,
        start_us=start,
        incl_us=incl,
        self_us=self_us,
        raw=[dumps(_kineto_view(r)) if h else None for r, h in zip(rows, has, strict=True)],
        num_linkable=int((~is_root).sum()),
        kernels=kernels,
        num_device_events=len(device),
        rank=None,
        world_size=None,
        groups=process_groups(None),
        waits=HostWaits([], empty, empty, empty, empty, empty, []),
        thread=thread,
        steps=steps,
        activity=(thread[act][order], start[act][order]),
    )


def _kineto_view(node: Mapping[str, Any]) -> dict[str, Any]:
    """The Kineto fields the linker put on a host node (what ``kineto_event`` keeps)."""
    keys = ("ts", "inclusive_dur", "exclusive_dur", "inter_thread_dep", "sync_dep")
    return {k: node[k] for k in keys if k in node}
