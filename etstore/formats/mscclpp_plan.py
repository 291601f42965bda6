"""MSCCL++ execution plans (JSON) → algorithm :class:`~etstore.model.Trace`.

An execution plan is what MSCCL++'s executor runs (``mscclpp.ExecutionPlan``): per GPU,
threadblocks of one-sided operations on memory, port and switch (NVLS) channels. The
reader checks it as the executor's parser does (:mod:`etstore.formats._mscclpp_schema`),
runs it abstractly to learn what each operation moves and what orders it
(:mod:`etstore.formats._mscclpp_exec`), and lays the result out as the algorithm trace
every etstore consumer reads (``docs/algorithms.md``): sends, receives, copies and
reductions with chunk columns, buffers in ``attrs``, dependencies within each rank.

Mapping (details and what is approximated: ``docs/algorithms.md``, "MSCCL++ execution
plans"): a put is a message whose receive lands in the target's memory; a get, a message
sent from the peer's memory when its signal said the data was ready; reductions are
``rrc``/``re`` steps, fused ops their parts in order; signals, waits, barriers, device
semaphores and LL packet flags become dependencies; an NVLS load-reduce-store is read as
loads from the group, reductions on the issuing rank and stores to the group.

The writer lives in :mod:`etstore.formats.mscclpp_writer`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from etstore.collective import ALGORITHM_COLLECTIVES, short_name
from etstore.errors import TraceFormatError
from etstore.formats._frames import ReadCost, check_json_depth, load_json
from etstore.formats._mscclpp_exec import Graph, run_plan
from etstore.formats._mscclpp_schema import Plan, parse_plan
from etstore.ir import RECV, SEND
from etstore.model import DEPS_SCHEMA, OPS_SCHEMA, Trace, encode_attrs

__all__ = ["MSCCLPP_PLAN_COST", "parse_mscclpp_plan", "read_mscclpp_plan"]

MSCCLPP_PLAN_COST = ReadCost("MSCCL++ execution plan", 40)
"""Peak bytes per byte of plan: the decoded JSON (≈ 10x), the frame kept in ``params``, and
the nodes, each a Python object until the columns are built."""

_KIND_TYPE = ("COMM_SEND_NODE", "COMM_RECV_NODE", "COMP_NODE", "COMP_NODE")
_STRIPPED = ("type", "index", "size")
_INT64_MAX = (1 << 63) - 1  # what the trace holds of an operand; the rest stays in the frame


def _collective(name: str) -> str:
    """etstore's name for a collective MSCCL++ names (``allreduce`` ...), else the name as written."""
    low = name.strip().lower()
    if low in ALGORITHM_COLLECTIVES:
        return low
    short = short_name(low)
    return short if short in ALGORITHM_COLLECTIVES else name


def parse_mscclpp_plan(doc: Any, *, name: str = "algorithm", source: str = "<memory>") -> Trace:
    """An MSCCL++ execution plan (decoded JSON, or its text) as an algorithm trace.

    Parameters
    ----------
    doc
        The plan: a decoded JSON object, or JSON text (``str``/``bytes``).
    name
        Trace name.
    source
        Used in error messages in place of a file name.

    Returns
    -------
    Trace
        As :func:`read_mscclpp_plan`.

    Raises
    ------
    TraceFormatError
        As :func:`read_mscclpp_plan`.

    Notes
    -----
    O(size of the plan + V·K) for V nodes and K lanes a threadblock learns of through
    its waits (usually a handful).

    Examples
    --------
    >>> plan = {"name": "swap", "collective": "custom", "protocol": "Simple", "inplace": False,
    ...     "gpus": [{"id": g, "input_chunks": 1, "output_chunks": 1, "scratch_chunks": 0,
    ...               "channels": [{"channel_type": "memory", "connected_to": [1 - g]}],
    ...               "remote_buffers": [{"rank": 1 - g, "type": "o", "access_channel_types": ["memory"]}],
    ...               "threadblocks": [{"id": 0, "channels": [{"channel_type": "memory", "channel_ids": [0]}],
    ...                   "remote_buffer_refs": [{"access_channel_type": "memory", "remote_buffer_ids": [0]}],
    ...                   "ops": [{"name": "put", "src_buff": [{"type": "i", "index": 0, "size": 1}],
    ...                            "dst_buff": [{"buffer_id": 0, "index": 0, "size": 1}],
    ...                            "channel_type": "memory"},
    ...                           {"name": "signal", "channel_ids": [0], "channel_type": "memory"},
    ...                           {"name": "wait", "channel_ids": [0], "channel_type": "memory"}]}]}
    ...              for g in (0, 1)]}
    >>> t = parse_mscclpp_plan(plan, name="swap")
    >>> t.params["collective"], t.num_ranks
    ('custom', 2)
    >>> [n for r, n in zip(t.ops["rank"].to_pylist(), t.ops["name"].to_pylist()) if r == 1]
    ['recv_put_g0_tb0_op0', 'send_put_g1_tb0_op0']
    """
    if isinstance(doc, str | bytes | bytearray):
        raw = doc.encode() if isinstance(doc, str) else bytes(doc)
        check_json_depth(raw, source)
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise TraceFormatError(f"{source}: not valid JSON (truncated or corrupt): {exc}") from exc
    plan = parse_plan(doc, source)
    graph = run_plan(plan, source)
    return _trace(plan, graph, name=name, source=source)


def read_mscclpp_plan(path: str | Path, *, name: str | None = None) -> Trace:
    """Read an MSCCL++ execution plan file (JSON, plain or gzip) into an ``algorithm`` trace.

    Every op the executor reads is understood: ``put``/``pws``/``pwsf``/``get``,
    ``copy``, the reductions ``re``/``res``/``rre``/``rres``, the LL packet ops
    (``ppkt``, ``rppkt``, ``cpkt``, ``upkt``, ``repkt``, ``respkt``, ``recpkt``,
    ``recspkt``), the switch (NVLS) ops ``glres``/``gstore``/``gstorepkt``,
    ``signal``/``wait`` and their relaxed forms, ``flush``, ``barrier``, device
    semaphores (``sem_acquire``/``sem_release``), ``nop``, ``pipeline``, and thread-block
    groups (``tbg_info``). See ``docs/algorithms.md`` for the mapping.

    Parameters
    ----------
    path
        The ``.json`` file.
    name
        Trace name; defaults to the file's stem.

    Returns
    -------
    Trace
        ``kind="algorithm"``, one rank per GPU. ``params``: ``collective`` (etstore's
        name where it has one, else MSCCL++'s, checked without postcondition),
        ``ngpus``, ``nchunksperloop`` (the larger of input and output chunks, times
        ``params["mscclpp"]["split"]``), ``inplace``/``outofplace``, ``proto``,
        ``algo_name``, ``minBytes``/``maxBytes`` (the plan's message size range),
        ``gpu_chunks``, ``producer`` ``"mscclpp"``, and ``mscclpp``: the plan's frame
        (header, channels, remote buffers, semaphores, and every op without its chunk
        ranges), from which :func:`~etstore.formats.mscclpp_writer.write_mscclpp_plan`
        writes the plan back with the ranges the trace holds.

    Raises
    ------
    TraceFormatError
        One line starting with the file (and ``gpu G threadblock T op K (name)``): not
        JSON, a field missing or of the wrong type, an unknown op, buffer or channel
        type, an id outside its table, an operand range past the GPU's buffer, operands
        the executor does not read so, or a plan that cannot run to completion (a wait
        whose signal never comes, a barrier short of threadblocks, a semaphore never
        released, an LL packet never written).

    Notes
    -----
    Cost as :func:`parse_mscclpp_plan`; MSCCL++'s example plans read in milliseconds.
    """
    p = Path(path)
    try:
        doc = load_json(p, limit=MSCCLPP_PLAN_COST.byte_limit())
    except OSError as exc:
        raise TraceFormatError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    stem = p.name.removesuffix(".gz").removesuffix(".json")
    return parse_mscclpp_plan(doc, name=name or stem, source=str(p))


# ---------------------------------------------------------------- layout


def _tags(graph: Graph) -> list[int]:
    """A tag per message: messages between two ranks made by one threadblock share a stream
    (their sends and receives each form one chain), those of different threadblocks do not."""
    tag_of: dict[tuple[int, int, int, int], int] = {}
    count: dict[tuple[int, int], int] = {}
    out: list[int] = []
    nodes = graph.nodes
    for s, r in graph.messages:
        a, b = nodes[s].rank, nodes[r].rank
        key = (a, b, nodes[s].lane, nodes[r].lane)
        if key not in tag_of:
            tag_of[key] = count.get((a, b), 0)
            count[(a, b)] = tag_of[key] + 1
        out.append(tag_of[key])
    return out


def _layout(graph: Graph, tags: list[int]) -> tuple[list[int], list[int], list[int], list[int]]:
    """Per node: its comm tag (-1), threadblock and step index in the trace, and its id on its rank.

    A trace threadblock holds one lane's steps that send to one peer on one tag, or receive
    from one, or do local work: one peer and one channel per threadblock, as MSCCL-IR has it.
    """
    nodes = graph.nodes
    n = len(nodes)
    tag = [-1] * n
    for (s, r), t in zip(graph.messages, tags, strict=True):
        tag[s] = tag[r] = t
    step_key: dict[int, tuple[Any, ...]] = {}
    for i, nd in enumerate(nodes):
        if nd.kind in (SEND, RECV):
            step_key[nd.step] = ("s" if nd.kind == SEND else "r", nd.peer, tag[i])
        else:
            step_key.setdefault(nd.step, ("l", nd.lane))
    tb_no: dict[tuple[int, tuple[Any, ...]], int] = {}
    per_rank: dict[int, int] = {}
    steps_in: dict[tuple[int, int], dict[int, int]] = {}
    tb = [0] * n
    lts = [0] * n
    for i, nd in enumerate(nodes):
        key = (nd.rank, step_key[nd.step])
        if key not in tb_no:
            tb_no[key] = per_rank.get(nd.rank, 0)
            per_rank[nd.rank] = tb_no[key] + 1
        tb[i] = tb_no[key]
        seen = steps_in.setdefault((nd.rank, tb[i]), {})
        lts[i] = seen.setdefault(nd.step, len(seen))
    order = sorted(range(n), key=lambda i: (nodes[i].rank, tb[i], lts[i], i))
    ids = [0] * n
    next_id: dict[int, int] = {}
    for i in order:
        r = nodes[i].rank
        ids[i] = next_id.get(r, 0)
        next_id[r] = ids[i] + 1
    return tag, tb, lts, ids


def _trace(plan: Plan, graph: Graph, *, name: str, source: str) -> Trace:
    nodes = graph.nodes
    tags = _tags(graph)
    tag, tb, lts, ids = _layout(graph, tags)
    split = plan.split
    nchunks = max(max(g.chunks["i"], g.chunks["o"]) for g in plan.gpus) * split
    order = sorted(range(len(nodes)), key=lambda i: (nodes[i].rank, ids[i]))
    blobs: dict[tuple[Any, ...], bytes] = {}
    attrs: list[bytes] = []
    cols: dict[str, list[Any]] = {k: [] for k in ("rank", "id", "name", "type", "src", "dst", "tag")}
    chunk: dict[str, list[int]] = {k: [] for k in ("cnt", "idx", "off", "tb", "lts")}
    for i in order:
        nd = nodes[i]
        key = (nd.stype, nd.src[1:3], nd.dst[1:3], nd.at, tuple(nd.entries))
        blob = blobs.get(key)
        if blob is None:
            blob = blobs[key] = encode_attrs(
                [
                    ("msccl_type", "string_val", nd.stype),
                    ("srcbuf", "string_val", nd.src[1]),
                    ("srcoff", "int64_val", nd.src[2]),
                    ("dstbuf", "string_val", nd.dst[1]),
                    ("dstoff", "int64_val", nd.dst[2]),
                    ("mscclpp_op", "int64_list", list(nd.at)),
                    *([("mscclpp_entries", "int64_list", nd.entries)] if nd.entries else []),
                ]
            )
        attrs.append(blob)
        cols["rank"].append(nd.rank)
        cols["id"].append(ids[i])
        cols["name"].append(nd.name)
        cols["type"].append(_KIND_TYPE[nd.kind])
        cols["src"].append(nd.peer if nd.kind == RECV else None)
        cols["dst"].append(nd.peer if nd.kind == SEND else None)
        cols["tag"].append(tag[i] if nd.kind in (SEND, RECV) else None)
        chunk["cnt"].append(nd.src[3])
        chunk["idx"].append(nd.src[2])
        chunk["off"].append(nd.src[2] if nd.kind == SEND else nd.dst[2])
        chunk["tb"].append(tb[i])
        chunk["lts"].append(lts[i])
    total = len(order)
    table = {
        "rank": pa.array(cols["rank"], pa.int32()),
        "id": pa.array(cols["id"], pa.uint64()),
        "name": pa.array(cols["name"], pa.string()),
        "type": pa.array(cols["type"], pa.string()),
        "duration_micros": pa.array(np.zeros(total, np.uint64)),
        "start_time_micros": pa.array(np.zeros(total, np.uint64)),
        "is_cpu_op": pa.nulls(total, pa.bool_()),
        "comm_type": pa.nulls(total, pa.string()),
        "comm_size": pa.nulls(total, pa.int64()),
        "comm_src": pa.array(cols["src"], pa.int32()),
        "comm_dst": pa.array(cols["dst"], pa.int32()),
        "comm_tag": pa.array(cols["tag"], pa.int32()),
        "pg_name": pa.nulls(total, pa.string()),
        "msg_chunk_cnt": pa.array(chunk["cnt"], pa.int64()),
        "msg_chunk_idx": pa.array(chunk["idx"], pa.int64()),
        "total_chunk_cnt": pa.array(np.full(total, nchunks, np.int64)),
        "chunk_offset": pa.array(chunk["off"], pa.int64()),
        "tb_id": pa.array(chunk["tb"], pa.int64()),
        "local_time_step": pa.array(chunk["lts"], pa.int64()),
        "attrs": pa.array(attrs, pa.binary()),
        "attr_order": pa.nulls(total, pa.string()),
    }
    ops = pa.Table.from_arrays([table[f.name] for f in OPS_SCHEMA], schema=OPS_SCHEMA)
    edges = sorted({(nodes[d].rank, ids[d], ids[s]) for s, d in graph.deps})
    pos: list[int] = []
    for j, (r, d, _) in enumerate(edges):
        pos.append(pos[-1] + 1 if j and edges[j - 1][:2] == (r, d) else 0)
    deps = pa.Table.from_arrays(
        [
            pa.array([e[0] for e in edges], pa.int32()),
            pa.array([e[2] for e in edges], pa.uint64()),
            pa.array([e[1] for e in edges], pa.uint64()),
            pa.array(["data"] * len(edges), pa.string()),
            pa.array(pos, pa.int32()),
        ],
        schema=DEPS_SCHEMA,
    )
    return Trace(
        ops=ops, deps=deps, name=name, kind="algorithm", source=source, params=_params(plan, graph, tags)
    )


def _params(plan: Plan, graph: Graph, tags: list[int]) -> dict[str, Any]:
    split = plan.split
    top = dict(plan.header)
    chunks = {b: [g.chunks[b] * split for g in plan.gpus] for b in ("i", "o", "s")}
    return {
        "collective": _collective(plan.collective),
        "ngpus": len(plan.gpus),
        "nchunksperloop": max(max(chunks["i"]), max(chunks["o"])),
        "inplace": plan.inplace,
        "outofplace": not plan.inplace,
        "producer": "mscclpp",
        "algo_name": plan.name,
        "proto": plan.protocol,
        "nchannels": max(tags, default=-1) + 1,
        # MSCCL-IR's byte range is signed 64-bit; MSCCL++'s "no limit" is 2^64 - 1
        "minBytes": min(_uint(top.get("min_message_size"), 0), _INT64_MAX),
        "maxBytes": min(_uint(top.get("max_message_size"), 0), _INT64_MAX),
        "gpu_chunks": chunks,
        "mscclpp": frame(plan, graph.notes),
    }


def _uint(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def frame(plan: Plan, notes: list[str]) -> dict[str, Any]:
    """The plan without its operands' chunk ranges: what the trace does not hold, kept in
    ``params`` so the writer can give the plan back (channels, buffer references, sync ops)."""
    gpus = []
    for g in plan.gpus:
        tbs = []
        for t in g.tbs:
            tbs.append(
                {**{k: v for k, v in t.raw.items() if k != "ops"}, "ops": [_skeleton(o.raw) for o in t.ops]}
            )
        gpus.append({**{k: v for k, v in g.raw.items() if k != "threadblocks"}, "threadblocks": tbs})
    return {
        "split": plan.split,
        "header": [[k, None if k == "gpus" else v] for k, v in plan.header],
        "gpus": gpus,
        "notes": list(notes),
    }


def _skeleton(op: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in op.items():
        if k in ("src_buff", "dst_buff") and isinstance(v, list):
            out[k] = [{kk: vv for kk, vv in e.items() if kk not in _STRIPPED} for e in v]
        elif k == "ops" and isinstance(v, list):
            out[k] = [_skeleton(x) for x in v]
        else:
            out[k] = v
    return out
