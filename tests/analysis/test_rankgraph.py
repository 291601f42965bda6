"""Per-rank rewrite passes on hand-built graphs (etstore.analysis._rankgraph)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from etstore.analysis._rankgraph import RankGraph, reorder_rank

ROOT = Path(__file__).resolve().parents[2]


def _diamond_ladder(depth: int) -> RankGraph:
    """``depth`` diamonds of compute ops (a → b, a → c, b → d, c → d, all ctrl), then a send
    ordered after the last one by a ctrl edge: 2**depth ctrl paths into the send, and no
    data path at all."""
    edges: dict[tuple[int, int], str] = {}
    top = 0
    for _ in range(depth):
        b, c, d = top + 1, top + 2, top + 3
        edges.update({(top, b): "ctrl", (top, c): "ctrl", (b, d): "ctrl", (c, d): "ctrl"})
        top = d
    send = top + 1
    edges[(top, send)] = "ctrl"
    types = ["COMP_NODE"] * send + ["COMM_SEND_NODE"]
    return RankGraph(0, 0, np.arange(send + 1, dtype=np.uint64), types, edges)


def test_reorder_frees_the_send_from_every_compute_op_it_never_needed() -> None:
    g = _diamond_ladder(3)
    send = g.n - 1
    applied = reorder_rank(g)
    assert sorted(applied.freed) == [(send, v) for v in range(send)]  # 10 compute ops, none needed
    assert all(dst != send for _src, dst in g.edges)  # nothing orders the send any more
    assert applied.moved == {send: 0}  # it issues first
    # what waited for the send (nothing) still waits; the diamonds are untouched
    assert {e for e in g.edges if e[1] != send} == set(_diamond_ladder(3).edges) - {(9, 10)}


def test_reorder_bypasses_each_compute_op_once_however_many_paths_lead_to_it() -> None:
    """Each (compute, send) pair is bypassed at most once: with a bypassed edge put back for
    every path, 2**40 paths would never finish (a 17,732-op expanded DLRM rank took > 300 s)."""
    code = textwrap.dedent(
        """
        from tests.analysis.test_rankgraph import _diamond_ladder
        from etstore.analysis._rankgraph import reorder_rank
        g = _diamond_ladder(40)
        print(len(reorder_rank(g).freed))
        """
    )
    run = [sys.executable, "-c", code]
    done = subprocess.run(run, capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == 3 * 40 + 1
