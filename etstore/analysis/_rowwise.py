"""Which recorded ops cut along the bytes of an input: a piece that reads part of it writes the
same part of the output.

A chunk of a collective's buffer is a run of bytes, so the ops that can follow the chunks
down a chain are those whose output maps, byte for byte in proportion, to that input: an
elementwise op whose output is the size of its input (ReLU, its backward, a copy, a scaled
add), and a GEMM whose chunked input is its left operand cut at whole rows (a row of the
output per row of it, the weight read whole). A GEMM chunked along its weight, a reduction, a
softmax or a norm does not map: the chain stops there.

>>> node = ('{"inputs": {"values": [[1, 7, 0, 16, 4, "cpu"]], "shapes": [[4, 4]], '
...         '"types": ["Tensor(float)"]}, "outputs": {"values": [[2, 8, 0, 16, 4, "cpu"]], '
...         '"shapes": [[4, 4]], "types": ["Tensor(float)"]}}')
>>> rowwise("aten::relu", node, (7, 0, 64))  # every element: any 4-byte cut; output in storage 8
(4, (8, 0, 64))
>>> rowwise("aten::_softmax", node, (7, 0, 64)) is None  # each row needs all of it
True
>>> rowwise("aten::mm", node, (7, 0, 64))  # the left operand, cut at whole rows of 16 bytes
(16, (8, 0, 64))
>>> map_cuts([0, 32, 64], 64, 128, 16)  # input rows of 16 bytes -> output rows of 32
[0, 64, 128]
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from etstore.formats._torch_et_nodes import node_io

__all__ = ["Arg", "map_cuts", "rowwise", "tensor_args"]

ELEMENTWISE = frozenset(
    {
        "relu", "relu_", "clamp", "clamp_", "clamp_min", "clamp_min_", "threshold", "threshold_backward",
        "gelu", "gelu_backward", "silu", "silu_backward", "sigmoid", "sigmoid_backward", "tanh",
        "tanh_backward", "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "copy_", "neg",
        "exp", "dropout", "native_dropout", "_to_copy",
    }
)  # fmt: skip
"""Op names (after ``::``) that compute each output element from the same element of their inputs."""

GEMM_LEFT = {"mm": 0, "addmm": 1, "linear": 0, "matmul": 0}
"""GEMMs and the argument that is their left operand (rows of the output, one per row of it)."""


@dataclass(frozen=True)
class Arg:
    """A tensor argument of a recorded ET node: its place, bytes and shape."""

    index: int
    storage: int
    lo: int
    hi: int
    shape: tuple[int, ...]
    itemsize: int

    @property
    def range(self) -> tuple[int, int, int]:
        return self.storage, self.lo, self.hi


def tensor_args(node_json: str | None, part: str = "inputs") -> list[Arg]:
    """The direct tensor arguments (not lists of tensors) of a recorded ET node's ``part``."""
    if not node_json:
        return []
    node: dict[str, Any] = json.loads(node_json)
    values, types = node_io(node, part)
    io = node.get(part)
    shapes = io.get("shapes", []) if isinstance(io, dict) else node.get(part[:-1] + "_shapes", [])
    out = []
    for i, (v, t) in enumerate(zip(values, types, strict=False)):
        if not (isinstance(t, str) and t.startswith("Tensor") and isinstance(v, list) and len(v) >= 5):
            continue
        if not all(type(x) is int for x in v[:5]) or v[3] <= 0 or v[4] <= 0:
            continue
        shape = shapes[i] if i < len(shapes) and isinstance(shapes[i], list) else []
        dims = tuple(int(d) for d in shape if type(d) is int)
        out.append(Arg(i, v[1], v[2] * v[4], (v[2] + v[3]) * v[4], dims, v[4]))
    return out


def rowwise(
    name: str, node_json: str | None, read: tuple[int, int, int]
) -> tuple[int, tuple[int, int, int]] | None:
    """``(grain, output)`` when op ``name`` cuts along its input ``read`` (``(storage, lo, hi)``):
    a cut of that input at a multiple of ``grain`` bytes is a cut of ``output`` (``(storage,
    lo, hi)``) in proportion; None when it does not (module docstring)."""
    base = name.rsplit("::", 1)[-1]
    outs = tensor_args(node_json, "outputs")
    arg = next((a for a in tensor_args(node_json) if a.range == read), None)
    if not outs or arg is None:
        return None
    out = outs[0]
    if base in ELEMENTWISE:
        return (arg.itemsize, out.range) if out.hi - out.lo == arg.hi - arg.lo else None
    left = GEMM_LEFT.get(base)
    if left is None or arg.index != left or len(arg.shape) < 2 or arg.shape[-1] <= 0:
        return None
    row = arg.shape[-1] * arg.itemsize
    rows = (arg.hi - arg.lo) // row
    if rows <= 0 or (arg.hi - arg.lo) % row or (out.hi - out.lo) % rows:
        return None
    return row, out.range


def map_cuts(cuts: list[int], in_bytes: int, out_bytes: int, grain: int) -> list[int] | None:
    """Cut points of an input (bytes from its start) as cut points of the output, or None when
    one does not fall on a multiple of ``grain`` or on a whole output byte."""
    out = []
    for c in cuts:
        if c % grain or (c * out_bytes) % in_bytes:
            return None
        out.append(c * out_bytes // in_bytes)
    return out
