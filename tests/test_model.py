"""The (rank, id) → row lookup every edge builder relies on, against a dict, in any row order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from etstore.model import Trace, op_rows, ops_table


@pytest.mark.parametrize("shuffle_ops", [False, True])
@pytest.mark.parametrize("shuffle_queries", [False, True])
def test_op_rows_matches_a_dict(shuffle_ops: bool, shuffle_queries: bool) -> None:
    rng = np.random.default_rng(3)
    ranks = np.repeat(np.arange(7), 50)
    ids = np.concatenate([rng.choice(10**12, 50, replace=False) for _ in range(7)]).astype(np.uint64)
    order = rng.permutation(len(ids)) if shuffle_ops else np.arange(len(ids))
    ops = ops_table({"rank": ranks[order], "id": ids[order], "type": ["COMP_NODE"] * len(ids)})
    want = {(int(r), int(i)): row for row, (r, i) in enumerate(zip(ranks[order], ids[order], strict=True))}
    pick = rng.integers(0, len(ids), 500)
    if not shuffle_queries:
        pick = np.sort(pick)
    q_rank, q_id = ranks[order][pick], ids[order][pick]
    got = op_rows(ops, q_rank, q_id)
    assert got.tolist() == [want[(int(r), int(i))] for r, i in zip(q_rank, q_id, strict=True)]


def test_rows_out_of_rank_order_are_grouped_and_none_is_lost(tmp_path: Path) -> None:
    # rank 0's rows are the 1st and 3rd: every per-rank pass reads a rank as one block of
    # rows, so the trace puts them together (each rank's own order kept) instead of the
    # writer keeping only the last block of rank 0
    from etstore.formats.et import read_et, write_et

    t = Trace(
        ops_table(
            {
                "rank": [0, 1, 0],
                "id": [1, 1, 2],
                "name": ["a", "b", "c"],
                "type": ["COMP_NODE"] * 3,
            }
        )
    )
    assert t.ops["rank"].to_pylist() == [0, 0, 1]
    assert t.ops["name"].to_pylist() == ["a", "c", "b"]
    assert t.rank_slices() == {0: (0, 2), 1: (2, 3)}
    write_et(t, tmp_path / "t")
    back = read_et(str(tmp_path / "t"))
    assert sorted(back.ops["name"].to_pylist()) == ["a", "b", "c"]
