"""An MSCCL++ execution plan (JSON) checked and parsed as the executor reads it.

Why a module of its own: the reader (:mod:`etstore.formats.mscclpp_plan`) and the writer
(:mod:`etstore.formats.mscclpp_writer`, which reads its own output back through here)
must agree with MSCCL++'s parser (``src/core/executor/execution_plan.cc``) on every
field name, enum and table. What the executor would refuse, misread or index out of
range is refused here in one line naming the gpu, threadblock and op.

Tables resolved as the executor builds them: a GPU's memory (port) channels are the
``connected_to`` peers of its ``channels`` entries of that type, in order; a switch
channel adds one entry per ``rank_groups`` group. A threadblock's ``channels`` list maps
its local channel ids to those, per type; its ``remote_buffer_refs`` map local buffer ids
to the GPU's ``remote_buffers``, per access channel type. Op ``channel_ids``,
``buffer_id`` and ``switch_channel_id`` are threadblock-local.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from etstore.errors import TraceFormatError
from etstore.formats._mscclpp_operands import LOCAL, REMOTE, SHAPES, SWITCH, Entry, shape_problem

__all__ = ["LOCAL", "OP_NAMES", "REMOTE", "SWITCH", "Entry", "Gpu", "Op", "Plan", "Tb", "parse_plan"]

OP_NAMES: tuple[str, ...] = (
    "nop",
    "barrier",
    "put",
    "pws",
    "pwsf",
    "get",
    "copy",
    "signal",
    "wait",
    "flush",
    "re",
    "res",
    "rre",
    "rres",
    "ppkt",
    "rppkt",
    "respkt",
    "cpkt",
    "upkt",
    "repkt",
    "recpkt",
    "recspkt",
    "glres",
    "gstore",
    "gstorepkt",
    "rlxsignal",
    "rlxwait",
    "pipeline",
    "sem_acquire",
    "sem_release",
)
"""Every operation name the executor's parser accepts (``getOpType``); any other is refused."""

BUFFER_LETTERS = ("i", "o", "s")
CHANNEL_TYPES = ("memory", "port", "switch", "none")
_CHUNK_KEYS = {"i": "input_chunks", "o": "output_chunks", "s": "scratch_chunks"}


@dataclass(frozen=True)
class Op:
    """One operation; ``at`` is (gpu, threadblock, op, inner op of a pipeline or -1)."""

    name: str
    src: tuple[Entry, ...]
    dst: tuple[Entry, ...]
    channel_type: str
    channels: tuple[tuple[int, int], ...]  # per channel id: (peer, GPU-level channel index)
    tbg: tuple[int, int]
    at: tuple[int, int, int, int]
    raw: dict[str, Any]
    inner: tuple[Op, ...] = ()

    @property
    def place(self) -> str:
        g, t, k, m = self.at
        return f"gpu {g} threadblock {t} op {k}{'' if m < 0 else f'.{m}'} ({self.name})"


@dataclass(frozen=True)
class Tb:
    """A threadblock: its ops and the raw channel / remote-buffer tables."""

    id: int
    ops: tuple[Op, ...]
    raw: dict[str, Any]


@dataclass(frozen=True)
class Gpu:
    """One GPU: chunk counts, channel tables (peers per GPU-level index) and threadblocks."""

    id: int
    chunks: dict[str, int]
    mem_peers: tuple[int, ...]
    port_peers: tuple[int, ...]
    switch: tuple[tuple[tuple[int, ...], str], ...]
    remote: tuple[tuple[int, str, frozenset[str]], ...]
    sem_init: tuple[int, ...]
    tbs: tuple[Tb, ...]
    raw: dict[str, Any]


@dataclass(frozen=True)
class Plan:
    """A whole plan: its top-level fields (``header``, in document order) and its GPUs."""

    name: str
    collective: str
    protocol: str
    inplace: bool
    header: list[tuple[str, Any]]
    gpus: tuple[Gpu, ...]
    split: int = 1


class _Where:
    """Builds one-line errors that start with the source and the place in the plan."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, place: str, what: str) -> TraceFormatError:
        return TraceFormatError(f"{self.source}: {place}: {what}" if place else f"{self.source}: {what}")


def _int(obj: dict[str, Any], key: str, w: _Where, place: str, *, low: int = 0, default: Any = None) -> int:
    value = obj.get(key, default)
    if value is None:
        raise w.fail(place, f"missing {key!r}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise w.fail(place, f"{key}={value!r} is not an integer")
    if value < low:
        raise w.fail(place, f"{key}={value} is below {low}")
    return value


def _list(obj: dict[str, Any], key: str, w: _Where, place: str, *, optional: bool = False) -> list[Any]:
    value = obj.get(key)
    if value is None and optional:
        return []
    if not isinstance(value, list):
        raise w.fail(place, f"missing list {key!r}" if value is None else f"{key!r} is not a list")
    return value


def _obj(value: Any, w: _Where, place: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise w.fail(place, f"expected a JSON object, found {type(value).__name__}")
    return value


def _letter(value: Any, w: _Where, place: str, key: str) -> str:
    if value not in BUFFER_LETTERS:
        raise w.fail(place, f"{key}={value!r} is not a buffer (expected i, o or s)")
    return str(value)


def _channel_type(value: Any, w: _Where, place: str) -> str:
    if value not in CHANNEL_TYPES:
        raise w.fail(place, f"channel_type={value!r} (expected one of {', '.join(CHANNEL_TYPES)})")
    return str(value)


def parse_plan(doc: Any, source: str) -> Plan:
    """Check ``doc`` (decoded JSON) as the executor reads a plan and resolve its tables.

    Raises
    ------
    TraceFormatError
        One line, ``source: gpu G threadblock T op K (name): what``: a missing or mistyped
        field, an unknown op, buffer or channel type, an id out of its table, a buffer range
        past what the GPU declares, an op whose operands the executor does not read so.
    """
    w = _Where(source)
    top = _obj(doc, w, "")
    for key in ("name", "collective", "protocol"):
        if not isinstance(top.get(key), str):
            raise w.fail(
                "",
                f"missing string {key!r} (an MSCCL++ execution plan has name, collective, "
                "protocol, inplace and gpus)",
            )
    if not isinstance(top.get("inplace"), bool):
        raise w.fail("", "'inplace' must be true or false")
    gpus_raw = _list(top, "gpus", w, "")
    if not gpus_raw:
        raise w.fail("", "'gpus' is empty")
    n = len(gpus_raw)
    header = [(k, v) for k, v in top.items()]
    shells = [_gpu_shell(_obj(g, w, f"gpus[{i}]"), i, n, w) for i, g in enumerate(gpus_raw)]
    gpus = tuple(_gpu(shell, shells, w) for shell in shells)
    splits = {op.tbg[1] for g in gpus for t in g.tbs for op in _walk(t.ops)}
    split = 1
    for s in splits:
        split = split * s // _gcd(split, s)
    return Plan(
        name=top["name"],
        collective=top["collective"],
        protocol=top["protocol"],
        inplace=top["inplace"],
        header=header,
        gpus=gpus,
        split=split,
    )


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def _walk(ops: tuple[Op, ...]) -> list[Op]:
    out: list[Op] = []
    for op in ops:
        out.append(op)
        out.extend(op.inner)
    return out


@dataclass
class _Shell:
    """A GPU's tables, resolved before any op is (ops look at their peers' tables)."""

    id: int
    raw: dict[str, Any]
    chunks: dict[str, int]
    mem_peers: list[int]
    port_peers: list[int]
    switch: list[tuple[tuple[int, ...], str]]
    remote: list[tuple[int, str, frozenset[str]]]
    sem_init: list[int]


def _gpu_shell(g: dict[str, Any], i: int, n: int, w: _Where) -> _Shell:
    place = f"gpu {i}"
    gid = _int(g, "id", w, f"gpus[{i}]")
    if gid != i:  # the executor reads gpus[rank] and checks its id
        raise w.fail(f"gpus[{i}]", f"id {gid} must equal its position {i} (the executor reads gpus[rank])")
    chunks = {b: _int(g, key, w, place) for b, key in _CHUNK_KEYS.items()}
    if chunks["i"] == 0 and chunks["o"] == 0:
        raise w.fail(place, "input_chunks and output_chunks are both 0 (the executor needs one)")
    mem: list[int] = []
    port: list[int] = []
    switch: list[tuple[tuple[int, ...], str]] = []
    for c, ch in enumerate(_list(g, "channels", w, place)):
        cp = f"{place} channels[{c}]"
        ch = _obj(ch, w, cp)
        ctype = _channel_type(ch.get("channel_type"), w, cp)
        if ctype == "switch":
            # "buff" is the spelling of older plans (MSCCL++'s own allreduce_pipeline.json)
            letter = _letter(ch.get("buffer_type", ch.get("buff")), w, cp, "buffer_type")
            for k, group in enumerate(_list(ch, "rank_groups", w, cp)):
                gp = f"{cp} rank_groups[{k}]"
                group = _obj(group, w, gp)
                _int(group, "size", w, gp)
                ranks = tuple(_rank(r, n, w, gp) for r in _list(group, "ranks", w, gp))
                if i not in ranks:
                    raise w.fail(gp, f"gpu {i} is not in its own switch group {list(ranks)}")
                switch.append((ranks, letter))
        elif ctype in ("memory", "port"):
            for peer in _list(ch, "connected_to", w, cp):
                p = _rank(peer, n, w, cp)
                if p == i:
                    raise w.fail(cp, f"a {ctype} channel from gpu {i} to itself")
                (mem if ctype == "memory" else port).append(p)
        else:
            raise w.fail(cp, "a GPU channel of type 'none'")
    remote: list[tuple[int, str, frozenset[str]]] = []
    for k, rb in enumerate(_list(g, "remote_buffers", w, place)):
        rp = f"{place} remote_buffers[{k}]"
        rb = _obj(rb, w, rp)
        peer = _rank(rb.get("rank"), n, w, rp)
        if peer == i:
            raise w.fail(rp, f"a remote buffer of gpu {i} itself")
        letter = _letter(rb.get("type"), w, rp, "type")
        access = frozenset(_channel_type(a, w, rp) for a in _list(rb, "access_channel_types", w, rp))
        remote.append((peer, letter, access))
    sems = [
        _int(_obj(s, w, f"{place} semaphores[{k}]"), "init_value", w, f"{place} semaphores[{k}]")
        for k, s in enumerate(_list(g, "semaphores", w, place, optional=True))
    ]
    return _Shell(i, g, chunks, mem, port, switch, remote, sems)


def _rank(value: Any, n: int, w: _Where, place: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
        raise w.fail(place, f"rank {value!r} is not a gpu of this plan (0..{n - 1})")
    return value


@dataclass
class _TbTables:
    """A threadblock's local ids resolved: channels per type, remote buffers per access type."""

    mem: list[int]
    port: list[int]
    switch: list[int]
    refs: dict[str, list[int]]


def _gpu(s: _Shell, shells: list[_Shell], w: _Where) -> Gpu:
    place = f"gpu {s.id}"
    tbs_raw = _list(s.raw, "threadblocks", w, place)
    tbs: list[Tb] = []
    for t, tb in enumerate(tbs_raw):
        tp = f"{place} threadblock {t}"
        tb = _obj(tb, w, tp)
        tid = _int(tb, "id", w, tp)
        if tid != t:  # ops are kept by position, channels by id: both must agree
            raise w.fail(
                tp, f"id {tid} must equal its position {t} (the executor indexes threadblocks both ways)"
            )
        tables = _tb_tables(tb, s, w, tp)
        ops = tuple(
            _op(_obj(o, w, f"{tp} op {k}"), s, shells, tables, (s.id, t, k, -1), w)
            for k, o in enumerate(_list(tb, "ops", w, tp))
        )
        tbs.append(Tb(t, ops, tb))
    return Gpu(
        s.id,
        s.chunks,
        tuple(s.mem_peers),
        tuple(s.port_peers),
        tuple(s.switch),
        tuple(s.remote),
        tuple(s.sem_init),
        tuple(tbs),
        s.raw,
    )


def _tb_tables(tb: dict[str, Any], s: _Shell, w: _Where, place: str) -> _TbTables:
    out = _TbTables([], [], [], {"memory": [], "port": []})
    sizes = {"memory": len(s.mem_peers), "port": len(s.port_peers), "switch": len(s.switch)}
    for c, ch in enumerate(_list(tb, "channels", w, place)):
        cp = f"{place} channels[{c}]"
        ch = _obj(ch, w, cp)
        ctype = _channel_type(ch.get("channel_type"), w, cp)
        if "buff" in ch:
            _letter(ch["buff"], w, cp, "buff")
        for cid in _list(ch, "channel_ids", w, cp):
            if (
                ctype == "none"
                or isinstance(cid, bool)
                or not isinstance(cid, int)
                or not 0 <= cid < sizes[ctype]
            ):
                raise w.fail(cp, f"{ctype} channel {cid!r} is not one of the gpu's {sizes.get(ctype, 0)}")
            {"memory": out.mem, "port": out.port, "switch": out.switch}[ctype].append(cid)
    for k, ref in enumerate(_list(tb, "remote_buffer_refs", w, place, optional=True)):
        rp = f"{place} remote_buffer_refs[{k}]"
        ref = _obj(ref, w, rp)
        ctype = _channel_type(ref.get("access_channel_type"), w, rp)
        if ctype not in ("memory", "port"):
            raise w.fail(rp, f"remote buffers are reached through memory or port channels, not {ctype}")
        for bid in _list(ref, "remote_buffer_ids", w, rp):
            if isinstance(bid, bool) or not isinstance(bid, int) or not 0 <= bid < len(s.remote):
                raise w.fail(rp, f"remote buffer {bid!r} is not one of the gpu's {len(s.remote)}")
            if ctype not in s.remote[bid][2]:
                raise w.fail(rp, f"remote buffer {bid} does not list {ctype} among its access_channel_types")
            out.refs[ctype].append(bid)
    return out


def _op(
    o: dict[str, Any],
    s: _Shell,
    shells: list[_Shell],
    tables: _TbTables,
    at: tuple[int, int, int, int],
    w: _Where,
) -> Op:
    g, t, k, m = at
    name = o.get("name")
    head = f"gpu {g} threadblock {t} op {k}{'' if m < 0 else f'.{m}'}"
    if name not in OP_NAMES:
        raise w.fail(head, f"unknown operation {name!r} (the executor reads {', '.join(OP_NAMES)})")
    place = f"{head} ({name})"
    ctype = _channel_type(o["channel_type"], w, place) if "channel_type" in o else ""
    tbg = (0, 1)
    if "tbg_info" in o:
        info = _obj(o["tbg_info"], w, place)
        size = _int(info, "tbg_size", w, place, low=1)
        tbg = (_int(info, "tb_id", w, place), size)
        if tbg[0] >= size:
            raise w.fail(place, f"tbg_info tb_id {tbg[0]} is not below tbg_size {size}")
    channels = _channels(o, ctype, s, shells, tables, w, place)
    src = tuple(
        _entry(e, ctype, s, shells, tables, w, f"{place} src_buff[{j}]")
        for j, e in enumerate(_list(o, "src_buff", w, place, optional=True))
    )
    dst = tuple(
        _entry(e, ctype, s, shells, tables, w, f"{place} dst_buff[{j}]")
        for j, e in enumerate(_list(o, "dst_buff", w, place, optional=True))
    )
    inner: tuple[Op, ...] = ()
    if name == "pipeline":
        if m >= 0:
            raise w.fail(place, "a pipeline inside a pipeline (the executor runs one level)")
        ctx = _obj(o.get("iter_context"), w, place)
        _int(ctx, "unit_size", w, place, low=1)
        _int(ctx, "num_chunks", w, place)
        inner = tuple(
            _op(_obj(x, w, f"{place} ops[{j}]"), s, shells, tables, (g, t, k, j), w)
            for j, x in enumerate(_list(o, "ops", w, place))
        )
    elif name in SHAPES:
        problem = shape_problem(name, src, dst, ctype, channels)
        if problem:
            raise w.fail(place, problem)
    elif name in ("signal", "wait", "rlxsignal", "rlxwait", "flush"):
        if ctype not in ("memory", "port") or not channels:
            raise w.fail(place, "needs channel_type memory or port and at least one channel id")
    elif name == "barrier":
        _int(o, "barrier_id", w, place)
        _int(o, "num_threadblocks", w, place, low=1)
    elif name in ("sem_acquire", "sem_release"):
        ids = _list(o, "semaphore_ids", w, place)
        for sid in ids:
            if isinstance(sid, bool) or not isinstance(sid, int) or not 0 <= sid < len(s.sem_init):
                raise w.fail(place, f"semaphore {sid!r} is not one of the gpu's {len(s.sem_init)}")
    return Op(name, src, dst, ctype, channels, tbg, at, o, inner)


def _channels(
    o: dict[str, Any],
    ctype: str,
    s: _Shell,
    shells: list[_Shell],
    tables: _TbTables,
    w: _Where,
    place: str,
) -> tuple[tuple[int, int], ...]:
    """(peer, GPU-level index) of each of the op's channel ids; the peer is -1 for switch channels."""
    ids = _list(o, "channel_ids", w, place, optional=True)
    local = {"memory": tables.mem, "port": tables.port, "switch": tables.switch}.get(ctype)
    out: list[tuple[int, int]] = []
    for cid in ids:
        if local is None or isinstance(cid, bool) or not isinstance(cid, int) or not 0 <= cid < len(local):
            n = len(local) if local is not None else 0
            raise w.fail(
                place, f"{ctype or 'untyped'} channel id {cid!r} is not one of the threadblock's {n}"
            )
        gidx = local[cid]
        peer = {"memory": s.mem_peers, "port": s.port_peers}.get(ctype)
        out.append((peer[gidx] if peer is not None else -1, gidx))
    return tuple(out)


def _entry(
    e: Any, ctype: str, s: _Shell, shells: list[_Shell], tables: _TbTables, w: _Where, place: str
) -> Entry:
    e = _obj(e, w, place)
    keys = [key for key in ("type", "buffer_id", "switch_channel_id") if key in e]
    if len(keys) != 1:
        raise w.fail(place, "needs exactly one of 'type', 'buffer_id', 'switch_channel_id'")
    index = _int(e, "index", w, place)
    size = _int(e, "size", w, place, low=1)
    if keys[0] == "type":
        letter = _letter(e["type"], w, place, "type")
        entry = Entry(LOCAL, letter, s.id, -1, index, size)
        holder = s
    elif keys[0] == "buffer_id":
        refs = tables.refs.get(ctype)
        bid = e["buffer_id"]
        if refs is None or isinstance(bid, bool) or not isinstance(bid, int) or not 0 <= bid < len(refs):
            n = len(refs) if refs is not None else 0
            raise w.fail(
                place,
                f"buffer_id {bid!r} is not one of the threadblock's {n} {ctype or 'untyped'} "
                "remote buffers (a remote operand needs the op's channel_type memory or port)",
            )
        peer, letter, _ = s.remote[refs[bid]]
        entry = Entry(REMOTE, letter, peer, bid, index, size)
        holder = shells[peer]
    else:
        sid = e["switch_channel_id"]
        if isinstance(sid, bool) or not isinstance(sid, int) or not 0 <= sid < len(tables.switch):
            raise w.fail(
                place,
                f"switch_channel_id {sid!r} is not one of the threadblock's "
                f"{len(tables.switch)} switch channels",
            )
        ranks, letter = s.switch[tables.switch[sid]]
        for r in ranks:  # every member binds a buffer of its own to the group
            if not any(gr == ranks for gr, _ in shells[r].switch):
                raise w.fail(place, f"gpu {r} declares no switch channel for the group {list(ranks)}")
        entry = Entry(SWITCH, letter, -1, sid, index, size, ranks)
        for r in ranks:
            _in_range(entry, shells[r], w, place)
        return entry
    _in_range(entry, holder, w, place)
    return entry


def _in_range(e: Entry, holder: _Shell, w: _Where, place: str) -> None:
    have = holder.chunks[e.buf]
    if e.index + e.size > have:
        where = f"gpu {holder.id}'s"
        raise w.fail(
            place,
            f"{e.buf}[{e.index}:{e.index + e.size}] is past the {have} chunk(s) of {where} "
            f"{_CHUNK_KEYS[e.buf]}",
        )
