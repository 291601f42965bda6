"""The (rank, id) → row lookup every edge builder relies on, against a dict, in any row order."""

from __future__ import annotations

import numpy as np
import pytest

from etstore.model import op_rows, ops_table


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
