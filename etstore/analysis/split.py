"""What splitting a compute op into per-chunk pieces costs, and which ops split at all.

A consumer of an expanded collective can start on the first chunks to land if it splits
along the dimension the chunks cut (a GEMM along the gathered or reduced dimension, an
elementwise op anywhere). An op that reduces *across* that dimension (softmax, a norm, a
top-k, a sort, a cumulative sum) needs every chunk before any of its output is right: it
does not split. Pieces are not free: each piece after the first is one more launch
(``overhead_us``, default 4 µs, about a CUDA kernel launch and its dispatch), and a piece
that runs while chunks still arrive shares the device with the communication kernels
(``interference``: the factor its time grows by; 1.0, none, unless set — measure it on your
hardware, e.g. a GEMM timed alone and beside an NCCL kernel).

>>> cost = SplitCost(overhead_us=4, interference=1.25)
>>> cost.pieces(10, 2)  # 5 µs beside communication (x1.25, rounded up), then 5 µs + a launch
[7, 9]
>>> cost.splits("aten::mm"), cost.splits("aten::_softmax"), cost.splits("layer_norm_bwd")
(True, False, False)
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from etstore.errors import OptionError

__all__ = ["NO_SPLIT", "SplitCost"]

NO_SPLIT = re.compile(r"softmax|norm|topk|sort|argmax|argmin|cumsum|cumprod|logsumexp", re.IGNORECASE)
"""Op names that reduce across the split dimension: they need every chunk, so they do not split."""


@dataclass(frozen=True)
class SplitCost:
    """The cost model of a split consumer (module docstring)."""

    overhead_us: int = 4
    interference: float = 1.0

    def __post_init__(self) -> None:
        if self.overhead_us < 0:
            raise OptionError(f"split overhead {self.overhead_us} µs: expected ≥ 0")
        if not self.interference >= 1.0:
            raise OptionError(
                f"interference factor {self.interference}: expected ≥ 1 (compute beside "
                "communication is not faster)"
            )

    def splits(self, name: str) -> bool:
        """Whether an op of this name can start on part of its input (:data:`NO_SPLIT`)."""
        return NO_SPLIT.search(name) is None

    def pieces(self, total_us: int, k: int, weights: Sequence[int] | None = None) -> list[int]:
        """Durations (µs) of ``k`` pieces of a ``total_us`` op: near-equal shares (or shares by
        ``weights``, the bytes each piece takes, rounded to whole µs that add up), every piece
        but the last scaled by ``interference`` (it runs while chunks arrive), every piece but
        the first one launch more.

        >>> SplitCost(overhead_us=0).pieces(10, 2, [1, 3])
        [3, 7]
        """
        if weights is None or sum(weights) <= 0:
            q, rem = divmod(int(total_us), k)
            share = [q + 1 if j < rem else q for j in range(k)]
        else:
            exact = [int(total_us) * w / sum(weights) for w in weights]
            share = [math.floor(e) for e in exact]
            for j in sorted(range(k), key=lambda j: share[j] - exact[j])[: int(total_us) - sum(share)]:
                share[j] += 1
        out = []
        for j, d in enumerate(share):
            t = math.ceil(d * self.interference) if j < k - 1 else d
            out.append(t + (self.overhead_us if j > 0 else 0))
        return out

    def piece(self, total_us: np.ndarray, k: np.ndarray, j: int) -> np.ndarray:
        """Piece ``j`` of :meth:`pieces` for many ops at once (``total_us`` and ``k``, int
        arrays; 0 where ``j >= k``): what the chunk finder asks of every consumer of a rank.

        >>> cost = SplitCost(overhead_us=4, interference=1.25)
        >>> [cost.piece(np.array([10, 9]), np.array([2, 3]), j).tolist() for j in range(3)]
        [[7, 4], [9, 8], [0, 7]]
        >>> cost.pieces(9, 3)
        [4, 8, 7]
        """
        q, rem = np.divmod(total_us, k)
        share = q + (j < rem)
        t = np.where(j < k - 1, np.ceil(share * self.interference).astype(np.int64), share)
        return np.where(j < k, t + (self.overhead_us if j > 0 else 0), 0)

    def to_params(self) -> dict[str, float]:
        """What a rewrite keeps in its params."""
        return {"overhead_us": self.overhead_us, "interference": self.interference}
