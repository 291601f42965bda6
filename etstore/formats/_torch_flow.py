"""Data flow of a PyTorch execution trace by storage and byte range.

A tensor argument of an ET node is ``[tensor_id, storage_id, offset, numel, itemsize,
device]`` (offset and numel in elements). Two tensors that share bytes of one storage are
the same data, whatever their ids: a view (``as_strided``, ``view``, ``slice``, DDP's bucket
views, FSDP's flat parameters) reads and writes its base's bytes. So a consumer depends on
the last writer of each byte range it reads, and tensor ids (which PyTorch reuses across
iterations) play no part.

* Writers: a node's outputs (in-place and ``out=`` results included), and for a
  collective or receive the buffers it is given (it fills them).
* Readers: a node's inputs, except for view and metadata ops (``aten::view``,
  ``aten::as_strided``, ``aten::detach``, ...), which read no data: the consumer of the
  view does.
* Overwrites: a writer comes after every row that read the bytes since they were last
  written (or, if none did, after their last writer), so a rewrite cannot move it ahead of
  them: the optimizer may not update a weight before the backward op that reads it, nor a
  bucket be refilled before its send.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from etstore.formats._torch_et_nodes import node_io, tensors

__all__ = ["NO_READ_OPS", "Flow", "node_ranges", "returns_alias", "storage_flow"]

_ALIAS = re.compile(r"Tensor\(\w+\)")


def returns_alias(schema: object) -> bool:
    """Whether an op schema returns an alias of an input without writing it (``aten::view``,
    ``aten::resolve_conj``: ``-> Tensor(a)``), rather than a mutated one (``-> Tensor(a!)``).

    >>> returns_alias("aten::resolve_conj(Tensor(a) self) -> Tensor(a)")
    True
    >>> returns_alias("aten::mul.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)")
    False
    >>> returns_alias("aten::relu(Tensor self) -> Tensor"), returns_alias(None)
    (False, False)
    """
    if not isinstance(schema, str) or "->" not in schema:
        return False
    ret = schema.rsplit("->", 1)[1]
    return "!" not in ret and _ALIAS.search(ret) is not None


# ops that make a tensor that shares its input's storage, or only look at its metadata
# (a wait returns its input):
# their inputs are no data reads
NO_READ_OPS = frozenset(
    {
        "aten::view",
        "aten::_reshape_alias",
        "aten::reshape",
        "aten::as_strided",
        "aten::slice",
        "aten::select",
        "aten::narrow",
        "aten::t",
        "aten::transpose",
        "aten::permute",
        "aten::expand",
        "aten::expand_as",
        "aten::unsqueeze",
        "aten::squeeze",
        "aten::detach",
        "aten::alias",
        "aten::view_as",
        "aten::split",
        "aten::split_with_sizes",
        "aten::chunk",
        "aten::unbind",
        "aten::unflatten",
        "aten::flatten",
        "aten::lift_fresh",
        "aten::_unsafe_view",
        "aten::numel",
        "aten::size",
        "aten::stride",
        "aten::is_nonzero",
        "aten::empty_like",
        "aten::empty_strided",
        "aten::empty",
        "aten::resize_",
        "_c10d_functional::wait_tensor",  # returns its input: the collective wrote the data
        # wraps a functional collective's output for autograd as soon as it is issued, while
        # gloo may still be filling it: no read (and its output is that same data)
        "_c10d_functional::_wrap_tensor_autograd",
    }
)


class _Bytes:
    """Who last wrote each byte range of each storage: sorted, disjoint ``[lo, hi)`` segments."""

    def __init__(self) -> None:
        self.los: dict[int, list[int]] = {}
        self.segs: dict[int, list[tuple[int, int, int]]] = {}

    def writers(self, storage: int, lo: int, hi: int) -> list[int]:
        segs = self.segs.get(storage)
        if not segs:
            return []
        los = self.los[storage]
        i = max(bisect_left(los, lo) - 1, 0)
        out = []
        while i < len(segs) and segs[i][0] < hi:
            if segs[i][1] > lo:
                out.append(segs[i][2])
            i += 1
        return out

    def write_older(self, storage: int, lo: int, hi: int, row: int) -> None:
        """``row`` writes ``[lo, hi)`` except where a later row (one of its children) wrote."""
        segs = self.segs.get(storage, [])
        los = self.los.get(storage, [])
        i = max(bisect_left(los, lo) - 1, 0)
        at = lo
        mine: list[tuple[int, int]] = []
        while i < len(segs) and segs[i][0] < hi:
            a, b, w = segs[i]
            if b > lo and w > row:  # a child's write stays
                if a > at:
                    mine.append((at, a))
                at = max(at, b)
            i += 1
        if at < hi:
            mine.append((at, hi))
        for a, b in mine:
            self.write(storage, a, b, row)

    def write(self, storage: int, lo: int, hi: int, row: int) -> None:
        segs = self.segs.setdefault(storage, [])
        los = self.los.setdefault(storage, [])
        i = max(bisect_left(los, lo) - 1, 0)
        j = i
        keep_before: list[tuple[int, int, int]] = []
        keep_after: list[tuple[int, int, int]] = []
        while j < len(segs) and segs[j][0] < hi:
            a, b, w = segs[j]
            if b <= lo:  # wholly before: untouched
                keep_before.append(segs[j])
            else:
                if a < lo:
                    keep_before.append((a, lo, w))
                if b > hi:
                    keep_after.append((hi, b, w))
            j += 1
        segs[i:j] = [*keep_before, (lo, hi, row), *keep_after]
        los[i:j] = [s[0] for s in (*keep_before, (lo, hi, row), *keep_after)]


class _Readers:
    """Who read each byte range since it was last written: ``(lo, hi, row)`` per storage."""

    def __init__(self) -> None:
        self.reads: dict[int, list[tuple[int, int, int]]] = {}

    def read(self, storage: int, lo: int, hi: int, row: int) -> None:
        self.reads.setdefault(storage, []).append((lo, hi, row))

    def overwritten(self, storage: int, lo: int, hi: int, row: int) -> list[int]:
        """Rows before ``row`` that read bytes ``[lo, hi)`` it now overwrites; those reads are
        forgotten (a later writer is ordered after ``row``, hence after them)."""
        entries = self.reads.get(storage)
        if not entries:
            return []
        out: list[int] = []
        kept: list[tuple[int, int, int]] = []
        for a, b, r in entries:
            if b <= lo or a >= hi or r >= row:  # elsewhere, or ``row`` itself or its children
                kept.append((a, b, r))
                continue
            out.append(r)
            if a < lo:
                kept.append((a, lo, r))
            if b > hi:
                kept.append((hi, b, r))
        self.reads[storage] = kept
        return out


def _ranges(args: Sequence[list[Any]]) -> list[tuple[int, int, int]]:
    """``(storage, lo, hi)`` byte ranges of tensor records (those with data)."""
    out = []
    for t in args:
        storage, offset, numel, itemsize = t[1], t[2], t[3], t[4]
        if numel > 0 and itemsize > 0:
            out.append((storage, offset * itemsize, (offset + numel) * itemsize))
    return out


class Flow(NamedTuple):
    """Row pairs of a rank's storage flow: ``data`` (the consumer reads bytes the producer wrote
    last) and ``overwrite`` (the later row overwrites bytes the earlier one read, or wrote with
    no reader since)."""

    src: np.ndarray
    dst: np.ndarray
    over_src: np.ndarray
    over_dst: np.ndarray


def storage_flow(
    names: Sequence[str],
    parent_row: np.ndarray,
    reads: Sequence[Sequence[list[Any]]],
    writes: Sequence[Sequence[list[Any]]],
    fills: Sequence[bool],
    views: Sequence[bool] | None = None,
) -> Flow:
    """Rows ``(producer, consumer)`` in entry order: the consumer reads bytes the producer wrote
    last; and ``(earlier, writer)``: the writer overwrites bytes the earlier row read (or wrote,
    unread), so it may not run before it.

    ``parent_row`` is each row's parent (-1 for none); ``reads`` and ``writes`` each row's
    input and output tensor records; ``fills`` marks rows (collectives, receives) that also
    write the buffers they read; ``views`` rows whose outputs alias their inputs unchanged
    (their schema returns ``Tensor(a)``, not ``Tensor(a!)``), which, like :data:`NO_READ_OPS`,
    read and write nothing. A node writes when it returns, so its children read what
    was there before it, and a wrapper's outputs are written by the children that wrote
    them: the wrapper writes only bytes none of them did. A collective's buffers are its
    own when it returns, whatever records nested in it listed.

    >>> base = [1, 7, 0, 8, 4, "cpu"]        # 8 floats of storage 7
    >>> view = [2, 7, 4, 4, 4, "cpu"]        # the last 4 of them, another tensor id
    >>> flow = storage_flow(
    ...     ["aten::ones", "aten::as_strided", "aten::mul_", "aten::sum", "aten::zero_"], np.full(5, -1),
    ...     [[], [base], [view], [base], []], [[base], [view], [view], [], [base]], [False] * 5)
    >>> list(zip(flow.src.tolist(), flow.dst.tolist()))
    [(0, 2), (0, 3), (2, 3)]

    ``aten::zero_`` overwrites what ``aten::mul_`` (its view) and ``aten::sum`` read:

    >>> sorted(zip(flow.over_src.tolist(), flow.over_dst.tolist()))
    [(2, 4), (3, 4)]
    """
    last = _Bytes()
    readers = _Readers()
    src: list[int] = []
    dst: list[int] = []
    over: set[tuple[int, int]] = set()
    Range = tuple[int, int, int]
    open_rows: list[tuple[int, list[Range], list[Range]]] = []  # entered, not yet returned

    def overwrite(storage: int, lo: int, hi: int, row: int) -> None:
        earlier = readers.overwritten(storage, lo, hi, row)
        if not earlier:  # nobody read it: what wrote it before must still come first
            earlier = [w for w in last.writers(storage, lo, hi) if w < row]
        inside = {r for r, _, _ in open_rows}  # its callers: they read through it
        over.update((e, row) for e in earlier if e != row and e not in inside)

    def close(row: int, written: list[Range], filled: list[Range]) -> None:
        for storage, lo, hi in written:
            overwrite(storage, lo, hi, row)
            last.write_older(storage, lo, hi, row)
        for storage, lo, hi in filled:  # the collective's result, whatever its nested records listed
            overwrite(storage, lo, hi, row)
            last.write(storage, lo, hi, row)

    for row, name in enumerate(names):
        parent = int(parent_row[row])
        while open_rows and open_rows[-1][0] != parent:
            close(*open_rows.pop())
        aliases = name in NO_READ_OPS or bool(views and views[row])
        read = _ranges(reads[row]) if not aliases else []
        seen: set[int] = {row}
        for storage, lo, hi in read:
            if not fills[row]:  # a collective's buffer is its own until it returns (it writes it)
                readers.read(storage, lo, hi, row)
            for w in last.writers(storage, lo, hi):
                if w not in seen:
                    seen.add(w)
                    src.append(w)
                    dst.append(row)
        written = _ranges(writes[row]) if not aliases else []
        open_rows.append((row, written, read if fills[row] else []))
    while open_rows:
        close(*open_rows.pop())
    pairs = sorted(over - set(zip(src, dst, strict=True)))  # a data edge already orders them
    o_src = np.asarray([a for a, _ in pairs], dtype=np.int64)
    o_dst = np.asarray([b for _, b in pairs], dtype=np.int64)
    return Flow(np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64), o_src, o_dst)


def node_ranges(node_json: str | None, part: str = "inputs") -> list[tuple[int, int, int]]:
    """``(storage, lo, hi)`` byte ranges of the tensors among a recorded ET node's inputs (its
    ``pytorch_et_node`` attribute): what an op reads, and what a collective fills; with
    ``part="outputs"``, among its outputs (what an op writes, an in-place op's own input).

    >>> node = '{"inputs": {"values": [[7, 28, 4, 2, 4, "cpu"], 0], "types": ["Tensor(float)", "int"]}}'
    >>> node_ranges(node)
    [(28, 16, 24)]
    >>> node_ranges('{"inputs": [[7, 28, 4, 2, 4, "cpu"]], "input_types": ["Tensor(float)"]}')  # schema 1.0.1
    [(28, 16, 24)]
    >>> node_ranges(None)
    []
    """
    if not node_json:
        return []
    return _ranges(tensors(*node_io(json.loads(node_json), part)))
