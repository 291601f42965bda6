"""The MSCCL-IR step builder the generators write through (:mod:`etstore.algorithms.generators`,
:mod:`etstore.algorithms.nccl`): threadblocks and steps, rank by rank, then a step table."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from etstore.ir import BUF_CODE, TYPE_CODE, StepTable

__all__ = ["Ref", "Slot", "_Builder"]

Ref = tuple[int, int]  # (threadblock, step) on one rank
Slot = tuple[str, int]  # (buffer, chunk offset)


@dataclass
class _Builder:
    """Collects MSCCL-IR threadblocks and steps, rank by rank."""

    ngpus: int
    nchunks: int
    tbs: list[dict[tuple[int, int, int], int]] = field(default_factory=list)
    tb_rows: list[list[tuple[int, int, int]]] = field(default_factory=list)  # per rank: (send, recv, chan)
    steps: list[list[list[tuple[int, ...]]]] = field(default_factory=list)  # per rank, per tb: step rows
    used: list[dict[str, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tbs = [{} for _ in range(self.ngpus)]
        self.tb_rows = [[] for _ in range(self.ngpus)]
        self.steps = [[] for _ in range(self.ngpus)]
        self.used = [{"i": 0, "o": 0, "s": 0} for _ in range(self.ngpus)]

    def tb(self, rank: int, *, send: int = -1, recv: int = -1, chan: int = 0) -> int:
        """The threadblock of ``rank`` with these peers and channel (created on first use)."""
        key = (send, recv, chan)
        tid = self.tbs[rank].get(key)
        if tid is None:
            tid = len(self.tb_rows[rank])
            self.tbs[rank][key] = tid
            self.tb_rows[rank].append(key)
            self.steps[rank].append([])
        return tid

    def step(
        self,
        rank: int,
        tb: int,
        kind: str,
        src: Slot,
        dst: Slot,
        cnt: int = 1,
        after: Iterable[Ref | None] = (),
    ) -> Ref:
        """Append a step; it waits for ``after`` (extra waits become ``nop`` steps before it)."""
        rows = self.steps[rank][tb]
        deps = []
        for ref in after:
            if ref is None or ref[0] == tb or ref in deps:
                continue  # same threadblock: program order already waits
            deps.append(ref)
        for ref in deps[:-1]:
            rows.append((TYPE_CODE["nop"], BUF_CODE["i"], -1, BUF_CODE["o"], -1, 0, ref[0], ref[1]))
        last = deps[-1] if deps else (-1, -1)
        rows.append(
            (TYPE_CODE[kind], BUF_CODE[src[0]], src[1], BUF_CODE[dst[0]], dst[1], cnt, last[0], last[1])
        )
        for side, (buf, off) in (("src", src), ("dst", dst)):
            local = (side == "src" and kind in ("s", "rrs", "rrc", "rrcs", "cpy", "re")) or (
                side == "dst" and kind in ("r", "rcs", "rrc", "rrcs", "cpy", "re")
            )
            if local:
                self.used[rank][buf] = max(self.used[rank][buf], off + cnt)
        return tb, len(rows) - 1

    def table(self, sizes: Mapping[str, int]) -> StepTable:
        cols: dict[str, list[int]] = {k: [] for k in StepTable.__dataclass_fields__}
        for r in range(self.ngpus):
            cols["gpu_rank"].append(r)
            for b in ("i", "o", "s"):
                cols[f"{b}_chunks"].append(max(self.used[r][b], sizes.get(b, 0)))
            for t, (send, recv, chan) in enumerate(self.tb_rows[r]):
                cols["tb_rank"].append(r)
                cols["tb_id"].append(t)
                cols["tb_send"].append(send)
                cols["tb_recv"].append(recv)
                cols["tb_chan"].append(chan)
                for s, (typ, sb, so, db, do, cnt, depid, deps) in enumerate(self.steps[r][t]):
                    for k, v in (
                        ("rank", r),
                        ("tb", t),
                        ("s", s),
                        ("type", typ),
                        ("srcbuf", sb),
                        ("srcoff", so),
                        ("dstbuf", db),
                        ("dstoff", do),
                        ("cnt", cnt),
                        ("depid", depid),
                        ("deps", deps),
                    ):
                        cols[k].append(v)
        return StepTable.from_lists(**cols)
