"""MSCCL-IR XML (MSCCLang, TACCL, TACOS, RCCL) → algorithm :class:`~etstore.model.Trace`.

Two parsers produce the same steps:

* a one-pass C scanner (``_xmlscan.c``) for the shape every producer emits:
  ``<algo>/<gpu>/<tb>/<step/>`` with the known attributes in any order, comments and
  an XML declaration; it hands back int64 columns of the step attributes and
  declines (rather than misreads) anything else;
* the standard library's expat parser for everything the scanner declines
  (``<op>`` elements, entities, unknown elements or attributes) and for every
  error, so messages carry the line number.

Documents with a ``<!DOCTYPE`` or ``<!ENTITY`` are refused before parsing: MSCCL-IR
never needs them, and refusing them makes entity-expansion bombs fail at once.

The writer lives in :mod:`etstore.formats.msccl_writer` and is re-exported here.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from xml.parsers import expat

import numpy as np

from etstore.collective import ALGORITHM_COLLECTIVES, short_name
from etstore.errors import TraceFormatError
from etstore.formats._frames import MSCCL_XML_COST, read_within_budget
from etstore.ir import BUF_CODE, BUFFERS, STEP_TYPES, TYPE_CODE, StepTable, build_trace
from etstore.model import Trace

__all__ = ["MAX_CHUNKS_PER_LOOP", "MAX_NGPUS", "parse_msccl_xml", "read_msccl_xml"]

log = logging.getLogger(__name__)

MAX_NGPUS = 65_536
"""Default upper limit on a document's declared ``ngpus`` (keyword ``max_ngpus`` raises it):
the reader allocates per declared GPU before it sees a step, so an 890-byte file
declaring 2^31 GPUs would otherwise ask for gigabytes."""
MAX_CHUNKS_PER_LOOP = 1 << 20
"""Default upper limit on ``nchunksperloop`` and on each ``<gpu>``'s ``i_chunks``, ``o_chunks``
and ``s_chunks`` (keyword ``max_chunks_per_loop`` raises it): what checks and simulates the
algorithm allocates per declared chunk."""
_INT64 = (-(1 << 63), (1 << 63) - 1)

# Collective names besides etstore's own that are read without a word: those RCCL's runtime
# also accepts, and msccl-tools' "custom" (a collective defined by its program, such as
# alltonext). Any other name is read too (with a warning: a typo reads the same way);
# the checker proves no postcondition for these, only matched messages and no deadlock.
_XML_COLLECTIVES = frozenset(
    (*ALGORITHM_COLLECTIVES, "gather", "scatter", "send", "recv", "alltoallv", "custom")
)


def _collective(coll: str) -> str | None:
    """The collective's name for ``params["collective"]``: etstore's short name for one it knows
    (``all_reduce`` → ``allreduce``), else the name as written; None for an empty name."""
    name = coll.strip()
    if not name:
        return None
    low = name.lower()
    if low in _XML_COLLECTIVES:
        return low
    short = short_name(low) if "_" in low else None  # all_reduce, reduce_scatter, ...
    return short if short in _XML_COLLECTIVES else name


class _Fallback(Exception):
    """The scanner met something it does not handle; use expat."""


@dataclass
class _Parsed:
    """What either parser extracts: raw attributes of algo/gpu/tb, step columns."""

    algo: dict[str, str]
    gpus: list[dict[str, str]] = field(default_factory=list)
    tbs: list[dict[str, str]] = field(default_factory=list)
    tb_gpu: list[int] = field(default_factory=list)
    steps: dict[str, np.ndarray] = field(default_factory=dict)
    step_tb: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # where each element sits: byte offsets (fast path) or line numbers (expat)
    algo_at: int = 0
    gpu_at: list[int] = field(default_factory=list)
    tb_at: list[int] = field(default_factory=list)
    step_at: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    at_is_line: bool = False


# ---------------------------------------------------------------- native path

_ATTR_RE = re.compile(rb"""([A-Za-z_][\w.:-]*)\s*=\s*("[^"<]*"|'[^'<]*')""")
_ATTR_WS = bytes.maketrans(b"\t\n\r", b"   ")  # XML normalises these in attribute values


def _tag_attrs(buf: bytes | bytearray, start: int, end: int) -> dict[str, str]:
    """Attributes of the start tag at ``buf[start:end + 1]``, which the scanner checked."""
    pairs = _ATTR_RE.findall(buf, start, end + 1)
    try:
        out = {k.decode(): v[1:-1].translate(_ATTR_WS).decode() for k, v in pairs}
    except UnicodeDecodeError:
        raise _Fallback from None  # expat reports the bad byte with its line
    if len(out) != len(pairs):
        raise _Fallback  # duplicate attribute: let expat report it
    return out


try:  # the optional C scanner: one pass, any attribute order (built by `pip install -e .`)
    from etstore.formats import _xmlscan  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - built in every supported install
    _xmlscan = None

_SCAN_TYPES = tuple(t.encode() for t in STEP_TYPES)  # scanner codes are these positions
_SCAN_BUFS = tuple(b.encode() for b in BUFFERS)
_SCAN_COLS = ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps")


def _native(data: bytes | bytearray) -> _Parsed:
    """The C scanner's parse; raises _Fallback where it stops (expat then decides)."""
    got = _xmlscan.scan(data, _SCAN_TYPES, _SCAN_BUFS)
    if got is None:
        raise _Fallback
    elements, steps, at, tb, n = got
    el = np.frombuffer(elements, dtype=np.int64).reshape(-1, 3)
    depth, lt, gt = el[:, 0], el[:, 1], el[:, 2]
    parsed = _Parsed(algo=_tag_attrs(data, int(lt[0]), int(gt[0])), algo_at=int(lt[0]))
    for d, a, b in zip(depth[1:].tolist(), lt[1:].tolist(), gt[1:].tolist(), strict=True):
        attrs = _tag_attrs(data, a, b)
        if d == 1:
            parsed.gpus.append(attrs)
            parsed.gpu_at.append(a)
        else:
            parsed.tbs.append(attrs)
            parsed.tb_at.append(a)
            parsed.tb_gpu.append(len(parsed.gpus) - 1)
    cols = np.frombuffer(steps, dtype=np.int64).reshape(len(_SCAN_COLS), n)
    parsed.steps = dict(zip(_SCAN_COLS, cols, strict=True))
    parsed.step_at = np.frombuffer(at, dtype=np.int64)
    parsed.step_tb = np.frombuffer(tb, dtype=np.int64)
    return parsed


# ---------------------------------------------------------------- expat path


def _expat(data: bytes, source: str) -> _Parsed:
    """General parse with the standard library's expat; every message carries a line."""
    parser = expat.ParserCreate()
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parsed: _Parsed | None = None
    stack: list[str] = []
    ignored = 0
    rows: list[tuple[str, dict[str, str], int, int]] = []  # (element, attrs, tb index, line)

    def refuse(*_: Any) -> None:
        raise TraceFormatError(
            f"{source}:{parser.CurrentLineNumber}: DOCTYPE/ENTITY declarations are not allowed in "
            "MSCCL-IR XML (refusing to expand entities)"
        )

    def start(tag: str, attrs: dict[str, str]) -> None:
        nonlocal parsed, ignored
        line = parser.CurrentLineNumber
        depth = len(stack)
        stack.append(tag)
        if ignored:
            ignored += 1
            return
        if depth == 0:
            if tag != "algo":
                raise TraceFormatError(f"{source}:{line}: root element must be <algo>, found <{tag}>")
            parsed = _Parsed(algo=dict(attrs), algo_at=line, at_is_line=True)
            return
        assert parsed is not None
        if depth == 1 and tag == "gpu":
            parsed.gpus.append(dict(attrs))
            parsed.gpu_at.append(line)
        elif depth == 2 and tag == "tb":
            parsed.tbs.append(dict(attrs))
            parsed.tb_at.append(line)
            parsed.tb_gpu.append(len(parsed.gpus) - 1)
        elif depth == 3 and tag in ("step", "op"):
            rows.append((tag, dict(attrs), len(parsed.tbs) - 1, line))
            ignored = 1  # children of a step carry nothing
        else:
            log.warning("%s:%d: ignoring unexpected element <%s> inside <%s>", source, line, tag, stack[-2])
            ignored = 1

    def end(tag: str) -> None:
        nonlocal ignored
        stack.pop()
        if ignored:
            ignored -= 1

    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    parser.StartElementHandler = start
    parser.EndElementHandler = end
    try:
        parser.Parse(data, True)
    except expat.ExpatError as exc:
        _refuse_bad_utf8(data, source)
        raise TraceFormatError(
            f"{source}:{exc.lineno}: not well-formed XML ({expat.ErrorString(exc.code)} at column "
            f"{exc.offset}); truncated file?"
        ) from exc
    if parsed is None:  # pragma: no cover - expat rejects documents without a root
        raise TraceFormatError(f"{source}: no <algo> element")
    _steps_from_rows(parsed, rows, source)
    return parsed


def _refuse_bad_utf8(data: bytes, source: str) -> None:
    """Name the first byte that is not UTF-8 (expat only says "invalid token")."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise TraceFormatError(
            f"{source}:{line}: byte 0x{data[exc.start]:02x} is not UTF-8 (MSCCL-IR XML is UTF-8 text)"
        ) from None


def _int(value: str | None, what: str, where: str | Callable[[], str]) -> int:
    try:
        if value is None:
            raise ValueError
        number = int(value.strip())
    except ValueError:
        place = where() if callable(where) else where
        if value is None:
            raise TraceFormatError(f"{place}: missing attribute {what!r}") from None
        raise TraceFormatError(f"{place}: attribute {what}={value!r} is not an integer") from None
    if not _INT64[0] <= number <= _INT64[1]:
        place = where() if callable(where) else where
        raise TraceFormatError(
            f"{place}: attribute {what}={value!r} is out of range (a signed 64-bit integer is expected)"
        )
    return number


def _limit(value: int, what: str, limit: int, option: str, where: Callable[[], str]) -> None:
    """Refuse a declared size above ``limit`` before anything is allocated for it."""
    if value > limit:
        raise TraceFormatError(
            f"{where()}: {what}={value} exceeds the reader's limit of {limit:,} "
            f"(raise it with the keyword argument {option})"
        )


def _steps_from_rows(parsed: _Parsed, rows: list[tuple[str, dict[str, str], int, int]], source: str) -> None:
    n = len(rows)
    cols = {
        k: np.zeros(n, dtype=np.int64)
        for k in ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps")
    }
    step_tb = np.zeros(n, dtype=np.int64)
    step_at = np.zeros(n, dtype=np.int64)
    for i, (tag, attrs, tb, line) in enumerate(rows):
        tba = parsed.tbs[tb]
        gpu = parsed.gpus[parsed.tb_gpu[tb]].get("id", "?")
        where = f"{source}:{line}: gpu {gpu} tb {tba.get('id', '?')}"
        if tag == "step":
            s = _int(attrs.get("s"), "s", where)
        else:
            s = _int(attrs.get("step", attrs.get("s")), "step", where)
        where = f"{where} step {s}"
        t = attrs.get("type")
        if t is None:
            raise TraceFormatError(f"{where}: missing attribute 'type'")
        if t not in TYPE_CODE:
            raise TraceFormatError(
                f"{where}: unknown step type {t!r} (expected one of {', '.join(STEP_TYPES)})"
            )
        if tag == "step" or "srcbuf" in attrs:
            sb, so, db, do = (
                attrs.get("srcbuf"),
                attrs.get("srcoff"),
                attrs.get("dstbuf"),
                attrs.get("dstoff"),
            )
            so_i, do_i = _int(so, "srcoff", where), _int(do, "dstoff", where)
            cnt = _int(attrs.get("cnt"), "cnt", where)
            depid = _int(attrs.get("depid"), "depid", where)
            deps = _int(attrs.get("deps"), "deps", where)
        else:
            # <op step type buf off [cnt] [depid deps] [hasdep]>: one buffer per op (the
            # source of sending ops, the destination of the others); we use it for both sides
            b = attrs.get("buf")
            off = _int(attrs.get("off", "-1"), "off", where)
            sb = db = b
            so_i = do_i = off
            cnt = _int(attrs.get("cnt", "1"), "cnt", where)
            depid = _int(attrs.get("depid", "-1"), "depid", where)
            deps = _int(attrs.get("deps", "-1"), "deps", where)
            if b is None and TYPE_CODE[t] < TYPE_CODE["nop"]:
                raise TraceFormatError(f"{where}: missing attribute 'buf'")
        for side, b in (("srcbuf", sb), ("dstbuf", db)):
            if b is None:
                raise TraceFormatError(f"{where}: missing attribute {side!r}")
            if b not in BUF_CODE:
                raise TraceFormatError(f"{where}: {side}={b!r} is not a buffer (expected i, o or s)")
        cols["s"][i] = s
        cols["type"][i] = TYPE_CODE[t]
        cols["srcbuf"][i] = BUF_CODE[sb]  # type: ignore[index]
        cols["dstbuf"][i] = BUF_CODE[db]  # type: ignore[index]
        cols["srcoff"][i] = so_i
        cols["dstoff"][i] = do_i
        cols["cnt"][i] = cnt
        cols["depid"][i] = depid
        cols["deps"][i] = deps
        step_tb[i] = tb
        step_at[i] = line
    parsed.steps = cols
    parsed.step_tb = step_tb
    parsed.step_at = step_at


# ---------------------------------------------------------------- assembly


@dataclass(frozen=True)
class _Limits:
    """Upper limits on declared sizes (see :data:`MAX_NGPUS`, :data:`MAX_CHUNKS_PER_LOOP`)."""

    ngpus: int = MAX_NGPUS
    chunks: int = MAX_CHUNKS_PER_LOOP


def _header(parsed: _Parsed, where: Callable[[], str], limits: _Limits) -> dict[str, Any]:
    a = parsed.algo
    h: dict[str, Any] = dict(a)
    coll = a.get("coll")
    if coll is None:
        raise TraceFormatError(f"{where()}: <algo> has no 'coll' attribute (the collective)")
    short = _collective(coll)
    if short is None:
        raise TraceFormatError(
            f"{where()}: <algo> coll is empty (expected a collective: allreduce, allgather, "
            "reducescatter, alltoall, broadcast, reduce, or custom)"
        )
    if short not in _XML_COLLECTIVES:
        log.warning(
            "%s: coll=%r is no collective etstore knows; read as a custom collective (checked for "
            "matched messages and deadlocks, not for what it computes)",
            where(),
            coll,
        )
    h["coll"] = short
    h["ngpus"] = _int(a.get("ngpus"), "ngpus", where)
    _limit(h["ngpus"], "ngpus", limits.ngpus, "max_ngpus", where)
    for key in ("nchannels", "nchunksperloop", "minBytes", "maxBytes"):
        if key in a:
            h[key] = _int(a[key], key, where)
    if "nchunksperloop" in h:
        _limit(h["nchunksperloop"], "nchunksperloop", limits.chunks, "max_chunks_per_loop", where)
    inplace = _int(a.get("inplace", "0"), "inplace", where)
    h["inplace"] = inplace
    h["outofplace"] = _int(a.get("outofplace", str(1 - min(inplace, 1))), "outofplace", where)
    h.setdefault("name", "")
    h.setdefault("proto", "Simple")
    return h


def _gpu_where(at: Callable[[str, int], str], i: int) -> str:
    return f"{at('gpu', i)}: <gpu>"


def _tb_where(at: Callable[[str, int], str], i: int, gpu: int) -> str:
    return f"{at('tb', i)}: gpu {gpu} <tb>"


def _assemble(
    parsed: _Parsed, source: str, data: bytes, limits: _Limits
) -> tuple[StepTable, dict[str, Any], Callable[[str, int], str]]:
    def at(kind: str, index: int) -> str:
        positions: dict[str, Any] = {
            "gpu": parsed.gpu_at,
            "tb": parsed.tb_at,
            "step": parsed.step_at,
            "algo": [parsed.algo_at],
        }
        pos = positions[kind][index]
        line = int(pos) if parsed.at_is_line else data.count(b"\n", 0, int(pos)) + 1
        return f"{source}:{line}"

    header = _header(parsed, lambda: at("algo", 0), limits)
    if not parsed.gpus:
        raise TraceFormatError(f"{at('algo', 0)}: <algo> has no <gpu> elements")
    g = len(parsed.gpus)
    gpu_cols = {k: np.zeros(g, dtype=np.int64) for k in ("id", "i_chunks", "o_chunks", "s_chunks")}
    for i, attrs in enumerate(parsed.gpus):
        for k, col in gpu_cols.items():
            col[i] = _int(attrs.get(k), k, partial(_gpu_where, at, i))
            if k != "id":
                _limit(int(col[i]), k, limits.chunks, "max_chunks_per_loop", partial(_gpu_where, at, i))
    t = len(parsed.tbs)
    tb_cols = {k: np.zeros(t, dtype=np.int64) for k in ("id", "send", "recv", "chan")}
    for i, attrs in enumerate(parsed.tbs):
        for k, col in tb_cols.items():
            col[i] = _int(
                attrs.get(k),
                k,
                partial(_tb_where, at, i, int(gpu_cols["id"][parsed.tb_gpu[i]])),
            )
    tb_rank = gpu_cols["id"][np.asarray(parsed.tb_gpu, dtype=np.int64)] if t else np.zeros(0, np.int64)
    steps = parsed.steps
    step_tb = parsed.step_tb
    rank = tb_rank[step_tb] if len(step_tb) else np.zeros(0, np.int64)
    order = None
    if len(rank) and (np.diff(rank) < 0).any():  # gpus listed out of order: group steps by gpu
        order = np.argsort(rank, kind="stable")
        rank = rank[order]
        step_tb = step_tb[order]
        steps = {k: v[order] for k, v in steps.items()}
        parsed.step_at = parsed.step_at[order]
    if "nchunksperloop" not in header:
        header["nchunksperloop"] = int(max(gpu_cols["i_chunks"].max(), gpu_cols["o_chunks"].max()))
    if "nchannels" not in header:
        header["nchannels"] = max(int(tb_cols["chan"].max()), 0) + 1 if t else 1  # chan=-1: no peers
    st = StepTable(
        rank=rank,
        tb=tb_cols["id"][step_tb] if len(step_tb) else np.zeros(0, np.int64),
        s=steps["s"],
        type=steps["type"],
        srcbuf=steps["srcbuf"],
        srcoff=steps["srcoff"],
        dstbuf=steps["dstbuf"],
        dstoff=steps["dstoff"],
        cnt=steps["cnt"],
        depid=steps["depid"],
        deps=steps["deps"],
        tb_rank=tb_rank,
        tb_id=tb_cols["id"],
        tb_send=tb_cols["send"],
        tb_recv=tb_cols["recv"],
        tb_chan=tb_cols["chan"],
        gpu_rank=gpu_cols["id"],
        i_chunks=gpu_cols["i_chunks"],
        o_chunks=gpu_cols["o_chunks"],
        s_chunks=gpu_cols["s_chunks"],
    )
    return st, header, at


def _refuse_dtd(data: bytes, source: str) -> None:
    if b"!" not in data:
        return
    for marker in (b"<!DOCTYPE", b"<!ENTITY"):
        i = data.find(marker)
        if i >= 0:
            line = data.count(b"\n", 0, i) + 1
            raise TraceFormatError(
                f"{source}:{line}: {marker[2:].decode()} declarations are not allowed in MSCCL-IR XML "
                "(refusing to expand entities)"
            )


def parse_msccl_xml(
    data: bytes | bytearray | str,
    *,
    name: str = "algorithm",
    source: str = "<memory>",
    max_ngpus: int = MAX_NGPUS,
    max_chunks_per_loop: int = MAX_CHUNKS_PER_LOOP,
) -> Trace:
    """Parse MSCCL-IR XML held in memory; see :func:`read_msccl_xml`.

    Parameters
    ----------
    data
        The document (``str`` is encoded as UTF-8).
    name
        Trace name.
    source
        Used in error messages in place of a file name.
    max_ngpus, max_chunks_per_loop
        As :func:`read_msccl_xml`.

    Returns
    -------
    Trace
        As :func:`read_msccl_xml`.

    Raises
    ------
    TraceFormatError
        As :func:`read_msccl_xml`; messages start with ``source:line``.

    Notes
    -----
    O(len(data) + S log S) for S steps.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    _refuse_dtd(raw, source)
    if not raw or raw.isspace():  # isspace stops at the first other byte; strip would copy
        raise TraceFormatError(f"{source}:1: empty file; an MSCCL-IR document starts with <algo ...>")
    try:
        if _xmlscan is None:  # pragma: no cover - built in every supported install
            raise _Fallback
        parsed = _native(raw)
    except _Fallback:
        parsed = _expat(raw, source)
    st, header, at = _assemble(parsed, source, raw, _Limits(max_ngpus, max_chunks_per_loop))
    # the <algo> attributes exactly as written, as [name, value] pairs so that document
    # order survives JSON with sorted keys: the writer gives each back as it was
    raw_header = {"xml_header": [[k, v] for k, v in parsed.algo.items()]}
    return build_trace(
        st, header, name=name, source=source, producer="msccl-xml", extra_params=raw_header, locate=at
    )


def read_msccl_xml(
    path: str | Path,
    *,
    name: str | None = None,
    max_ngpus: int = MAX_NGPUS,
    max_chunks_per_loop: int = MAX_CHUNKS_PER_LOOP,
) -> Trace:
    """Read an MSCCL-IR XML file into an ``algorithm`` trace.

    Every step type (``s r rcs rrs rrc rrcs cpy re nop``, and ``d``/``st`` as
    dependency-only steps), ``<step>`` and ``<op>`` elements, all buffers and
    offsets, channels (``chan="-1"`` on a threadblock without peers, as msccl-tools
    may write), threadblocks and cross-threadblock dependencies (``depid``/``deps``,
    including chains through ``nop`` steps) are understood. ``coll`` may name any
    collective: etstore's own, RCCL's others, msccl-tools' ``custom``; a name outside
    these is read with a logged warning (the checker proves no postcondition for it).
    Fused steps become the node sequence they mean, e.g. ``rrcs`` is
    ``RECV → reduce COMP → SEND``; see :mod:`etstore.ir` and
    ``docs/algorithms.md``.

    Parameters
    ----------
    path
        The ``.xml`` file.
    name
        Trace name; defaults to the file's stem.
    max_ngpus
        Refuse documents declaring more GPUs than this (default :data:`MAX_NGPUS`),
        before anything is allocated for them.
    max_chunks_per_loop
        Refuse documents declaring more chunks per loop, or a ``<gpu>`` with more
        ``i_chunks``/``o_chunks``/``s_chunks``, than this (default :data:`MAX_CHUNKS_PER_LOOP`).

    Returns
    -------
    Trace
        ``kind="algorithm"``; one rank per ``<gpu>``; node ids count from 0 per
        rank in threadblock, then step order. ``params`` holds the ``<algo>``
        attributes typed (``collective``, ``ngpus``, ``nchunksperloop``, ``inplace``,
        ``outofplace``, ``proto``, ``minBytes``, ``maxBytes``, ...), ``gpu_chunks``
        (per-rank buffer sizes) and ``xml_header``: every ``<algo>`` attribute as
        written, as ``[name, value]`` pairs in document order (what
        :func:`~etstore.formats.msccl_writer.to_msccl_xml` writes back).

    Raises
    ------
    TraceFormatError
        The file cannot be read, is not well-formed (e.g. truncated), declares a
        DOCTYPE/ENTITY (XML bombs), is not UTF-8, lacks a required attribute, has
        an integer attribute that is not a signed 64-bit integer, an empty ``coll``,
        declares sizes above the limits, has an unknown step type, a
        ``depid``/``deps`` that points nowhere, a peer, channel or buffer range that is
        impossible, or a dependency cycle. The message starts with ``file:line`` and
        names the gpu, threadblock and step.

    Notes
    -----
    O(file size + S log S) for S steps; the scanner reads a 128-rank ring
    all-reduce (65k steps, 7.6 MB) in about 10 ms, the whole call takes about 45 ms.

    Examples
    --------
    >>> t = read_msccl_xml("custom_allreduce.xml")  # doctest: +SKIP
    >>> t.params["collective"], t.num_ranks  # doctest: +SKIP
    ('allreduce', 8)
    """
    p = Path(path)
    try:
        data = read_within_budget(p, MSCCL_XML_COST)
    except OSError as exc:
        raise TraceFormatError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    return parse_msccl_xml(
        data,
        name=name or p.name.removesuffix(".xml"),
        source=str(p),
        max_ngpus=max_ngpus,
        max_chunks_per_loop=max_chunks_per_loop,
    )
