"""Algorithm :class:`~etstore.model.Trace` → an MSCCL++ execution plan the executor runs.

Two ways, one result checked the same:

* a trace read from an MSCCL++ plan (``params["mscclpp"]`` holds the plan's frame: header,
  channels, remote buffers, semaphores and every op without its chunk ranges) is written
  back from that frame with each operand's range taken from the node that holds it (the
  ``mscclpp_entries`` attribute), provided reading the result back gives the trace itself
  (its content hash); so plan → trace → plan is the plan, and a trace changed since is
  never written from a stale frame;
* any other algorithm trace (MSCCL-IR, generated, synthesized, or an MSCCL++ trace changed
  since it was read) is lowered by :mod:`etstore.formats._mscclpp_lower`: each message
  a ``put`` into a scratch range of its own on the receiver and a ``signal``/``wait`` pair,
  local steps ``copy``/``re``/``res``, cross-threadblock dependencies device semaphores.

Before anything is written, :func:`plan_problems` reads the plan back as MSCCL++'s
parser does (``execution_plan.cc``: field names, enums, tables, ids, buffer ranges),
runs it abstractly to completion, and holds it to the executor's limits
(``execution_common.hpp``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from etstore.digest import content_hash
from etstore.errors import TraceFormatError, UnsatisfiableError
from etstore.formats._mscclpp_exec import run_plan
from etstore.formats._mscclpp_lower import MAX_CHANNEL, MAX_OPERATION, lower
from etstore.formats._mscclpp_schema import parse_plan
from etstore.formats.mscclpp_plan import parse_mscclpp_plan
from etstore.model import Trace, decode_attrs

__all__ = ["plan_problems", "to_mscclpp_plan", "write_mscclpp_plan"]

MAX_CHANNEL_PER_OPERATION = 8
MAX_BUFFERS_PER_OPERATION = 10  # MAX_LOCAL_BUFFER_PER_OPERATION + MAX_CHANNEL_PER_OPERATION
MAX_DEVICE_SYNCERS = 16
MAX_DEVICE_SEMAPHORES = 16  # semaphore ids per operation
_UINT64 = (1 << 64) - 1


def to_mscclpp_plan(trace: Trace, *, name: str | None = None) -> dict[str, Any]:
    """The MSCCL++ plan of an algorithm trace as a JSON-able dict (see :func:`write_mscclpp_plan`)."""
    plan = _from_frame(trace, name)
    if plan is None:
        plan = lower(trace, name=name)
    problems = plan_problems(plan, source=f"the plan of {trace.name!r}")
    if problems:
        raise UnsatisfiableError(f"cannot write {trace.name!r} as an MSCCL++ plan: {problems[0]}")
    return plan


def write_mscclpp_plan(trace: Trace, path: str | Path, *, name: str | None = None) -> Path:
    """Write an algorithm trace as an MSCCL++ execution plan (JSON) for ``mscclpp.ExecutionPlan``.

    Parameters
    ----------
    trace
        An algorithm trace: read from an MSCCL++ plan (written back from its frame), or
        from MSCCL-IR, generated or synthesized (lowered to puts, signals and waits).
    path
        Output file.
    name
        The plan's ``name`` (default: the name it was read with, else the trace's).

    Returns
    -------
    Path
        The file written (JSON, indented as MSCCL++'s DSL writes it).

    Raises
    ------
    UnsatisfiableError
        The trace cannot run to completion (in the words of ``etstore check``), has a node
        that is no send, receive, reduction or copy, or needs more of a threadblock than
        the executor holds (16 channels or remote buffers of a type); or the plan fails
        :func:`plan_problems` (never expected: it is a bug).

    Notes
    -----
    O(V + E) for the lowering, plus one read of the result back (the check); a frame
    is tried first, at the cost of one more read.

    Examples
    --------
    >>> from etstore.algorithms import generate
    >>> plan = to_mscclpp_plan(generate("ring", coll="allreduce", ranks=4))
    >>> ops = plan["gpus"][0]["threadblocks"][0]["ops"]
    >>> plan["collective"], len(plan["gpus"]), sorted({op["name"] for op in ops})
    ('allreduce', 4, ['copy', 'nop', 'put', 'res', 'signal', 'wait'])
    """
    plan = to_mscclpp_plan(trace, name=name)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(plan, indent=2) + "\n", encoding="utf-8")
    return p


def plan_problems(doc: Any, *, source: str = "<plan>") -> list[str]:
    """What would stop MSCCL++'s executor from loading and running ``doc``, one line each.

    The parser's checks (as :func:`~etstore.formats.mscclpp_plan.read_mscclpp_plan` makes
    them: required fields and their types, op names, buffer and channel types, every id
    inside its table, operand ranges inside the declared buffers), a run to completion
    (every wait signalled, every barrier full, every semaphore released, every packet
    written), then the executor's limits per threadblock: 64 operations, 16 channels of
    a type, 16 remote buffers of a type; per operation 8 channels, 10 operands and 16
    semaphores; 16 barriers per GPU. An empty list: it runs.

    Examples
    --------
    >>> plan_problems({"name": "x", "collective": "allreduce", "protocol": "Simple", "gpus": []})
    ["<plan>: 'inplace' must be true or false"]
    """
    try:
        plan = parse_plan(doc, source)
        run_plan(plan, source)
    except TraceFormatError as exc:
        return [str(exc)]
    out: list[str] = []
    for key, kind in (("num_threads_per_block", int), ("buffer_alignment", int)):
        value = doc.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kind) or value <= 0):
            out.append(f"{source}: {key}={value!r} is not a positive integer")
    if isinstance(doc.get("num_threads_per_block"), int) and doc["num_threads_per_block"] > 1024:
        out.append(f"{source}: num_threads_per_block={doc['num_threads_per_block']} exceeds 1024")
    for key in ("min_message_size", "max_message_size"):
        value = doc.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _UINT64
        ):
            out.append(f"{source}: {key}={value!r} is not an unsigned 64-bit integer")
    for key in ("reuse_resources", "use_double_scratch_buffer"):
        if key in doc and not isinstance(doc[key], bool):
            out.append(f"{source}: {key} must be true or false")
    for g in plan.gpus:
        barriers = set()
        for t in g.tbs:
            where = f"{source}: gpu {g.id} threadblock {t.id}"
            n_ops = sum(1 + len(op.inner) for op in t.ops)
            if n_ops > MAX_OPERATION:
                out.append(
                    f"{where}: {n_ops} operations; the executor runs at most {MAX_OPERATION} a threadblock"
                )
            counts: dict[str, int] = {}
            for ch in t.raw.get("channels", []):
                counts[ch["channel_type"]] = counts.get(ch["channel_type"], 0) + len(ch["channel_ids"])
            for ref in t.raw.get("remote_buffer_refs") or []:
                key = f"{ref['access_channel_type']} remote buffer"
                counts[key] = counts.get(key, 0) + len(ref["remote_buffer_ids"])
            for what, count in counts.items():
                if count > MAX_CHANNEL:
                    out.append(f"{where}: {count} {what}s; the executor holds {MAX_CHANNEL} a threadblock")
            for op in (x for o in t.ops for x in (o, *o.inner)):
                raw = op.raw
                if len(raw.get("channel_ids", [])) > MAX_CHANNEL_PER_OPERATION:
                    out.append(f"{source}: {op.place}: more than {MAX_CHANNEL_PER_OPERATION} channels")
                if max(len(op.src), len(op.dst)) > MAX_BUFFERS_PER_OPERATION:
                    out.append(f"{source}: {op.place}: more than {MAX_BUFFERS_PER_OPERATION} operands")
                if len(raw.get("semaphore_ids", [])) > MAX_DEVICE_SEMAPHORES:
                    out.append(f"{source}: {op.place}: more than {MAX_DEVICE_SEMAPHORES} semaphores")
                if op.name == "barrier":
                    barriers.add(raw["barrier_id"])
        if any(b >= MAX_DEVICE_SYNCERS for b in barriers):
            out.append(
                f"{source}: gpu {g.id}: barrier ids reach {max(barriers)}; the executor has "
                f"{MAX_DEVICE_SYNCERS}"
            )
    return out


# ---------------------------------------------------------------- from the frame


def _from_frame(trace: Trace, name: str | None) -> dict[str, Any] | None:
    """The plan rebuilt from ``params["mscclpp"]`` and the trace's operand ranges, or None when
    there is no frame or the result would not read back as this very trace."""
    frame = trace.params.get("mscclpp")
    if not isinstance(frame, dict) or not isinstance(frame.get("gpus"), list):
        return None
    split = int(frame.get("split") or 1)
    ranges = _operand_ranges(trace)
    try:
        gpus = [_gpu(g, gi, ranges, split) for gi, g in enumerate(frame["gpus"])]
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    doc: dict[str, Any] = {}
    for key, value in frame.get("header") or []:
        doc[key] = gpus if key == "gpus" else value
    if "gpus" not in doc:
        return None
    if name:
        doc["name"] = name
    try:
        again = parse_mscclpp_plan(doc, name=trace.name, source="<frame>")
    except TraceFormatError:
        return None
    return doc if content_hash(again) == content_hash(trace) else None


def _operand_ranges(trace: Trace) -> dict[tuple[int, ...], tuple[str, int, int]]:
    """(gpu, tb, op, inner, side, index) → (buffer, offset, chunks) of each operand some node holds."""
    ops = trace.ops
    enc = pc.dictionary_encode(ops["attrs"]).combine_chunks()
    idx = pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    blobs = [decode_attrs(b) if b else {} for b in enc.dictionary.to_pylist()]
    cnt = pc.fill_null(ops["msg_chunk_cnt"], 0).to_numpy().astype(np.int64)
    out: dict[tuple[int, ...], tuple[str, int, int]] = {}
    for row, j in enumerate(idx.tolist()):
        a = blobs[j] if j >= 0 else {}
        at, entries = a.get("mscclpp_op"), a.get("mscclpp_entries")
        if not at or not entries:
            continue
        for side, k, fld in zip(entries[0::3], entries[1::3], entries[2::3], strict=True):
            key = (*at, side, k)
            if key not in out:
                pre = "src" if fld == 0 else "dst"
                out[key] = (str(a[f"{pre}buf"]), int(a[f"{pre}off"]), int(cnt[row]))
    return out


def _gpu(
    g: dict[str, Any], gi: int, ranges: dict[tuple[int, ...], tuple[str, int, int]], split: int
) -> dict[str, Any]:
    out = {k: v for k, v in g.items() if k != "threadblocks"}
    out["channels"] = [_current_channel(ch) for ch in g.get("channels", [])]
    tbs = []
    for ti, tb in enumerate(g["threadblocks"]):
        ops = [_op(o, (gi, ti, k, -1), ranges, split) for k, o in enumerate(tb["ops"])]
        tbs.append({**{k: v for k, v in tb.items() if k != "ops"}, "ops": ops})
    # the threadblocks where the plan had them
    keys = list(g)
    return {k: (tbs if k == "threadblocks" else out[k]) for k in keys}


def _current_channel(ch: Any) -> Any:
    """A switch channel as the executor reads it: older plans spell ``buffer_type`` ``buff``."""
    if (
        isinstance(ch, dict)
        and ch.get("channel_type") == "switch"
        and "buff" in ch
        and "buffer_type" not in ch
    ):
        return {("buffer_type" if k == "buff" else k): v for k, v in ch.items()}
    return ch


def _op(
    o: dict[str, Any],
    at: tuple[int, int, int, int],
    ranges: dict[tuple[int, ...], tuple[str, int, int]],
    split: int,
) -> dict[str, Any]:
    tbg = o.get("tbg_info") or {}
    m, size_of = int(tbg.get("tb_id", 0)), int(tbg.get("tbg_size", 1))
    out: dict[str, Any] = {}
    for key, value in o.items():
        if key == "ops":
            out[key] = [_op(x, (at[0], at[1], at[2], j), ranges, split) for j, x in enumerate(value)]
        elif key in ("src_buff", "dst_buff"):
            side = 0 if key == "src_buff" else 1
            entries = []
            for k, e in enumerate(value):
                buf, off, cnt = ranges[(at[0], at[1], at[2], at[3], side, k)]
                size, rest = divmod(cnt * size_of, split)
                index, rest2 = divmod(off - m * cnt, split)
                if rest or rest2 or size < 1 or index < 0:
                    raise ValueError("not a whole chunk")
                head = {"type": buf} if "buffer_id" not in e and "switch_channel_id" not in e else {}
                entries.append({**head, **e, "index": index, "size": size})
            out[key] = entries
        else:
            out[key] = value
    return out
