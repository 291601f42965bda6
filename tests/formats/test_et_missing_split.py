"""Missing dependencies are found rank file by rank file, on the decoding threads: the result
must be what one split of the whole trace gives, whatever the ids look like."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from etstore.errors import TraceFormatError
from etstore.formats import et, read_et, write_et
from etstore.formats.et_parts import read_et_parts
from etstore.model import Trace, deps_table, ops_table


def _trace(rng: np.random.Generator, ids_kind: str, ranks: int = 3) -> Trace:
    """Ops per rank with ids ``dense`` (0..n-1 in order), ``gappy`` (ascending, with gaps) or
    ``shuffled`` (unique, any order); deps on present ids and some on absent ones."""
    rank_col, id_col, d_rank, d_src, d_dst = [], [], [], [], []
    for r in range(ranks):
        n = int(rng.integers(0, 40))
        if ids_kind == "dense":
            ids = np.arange(n)
        elif ids_kind == "gappy":
            ids = np.cumsum(rng.integers(1, 4, n)) + int(rng.integers(0, 3))
        else:
            ids = rng.permutation(3 * n + 1)[:n]
        rank_col += [r] * n
        id_col += ids.tolist()
        for dst in ids[1:]:
            src = int(rng.choice(ids)) if rng.random() < 0.8 else int(rng.integers(0, 200))  # some absent
            d_rank.append(r)
            d_src.append(src)
            d_dst.append(int(dst))
    n = len(id_col)
    ops = ops_table(
        {"rank": rank_col, "id": id_col, "name": ["x"] * n, "type": ["COMP_NODE"] * n},
        num_rows=n,
    )
    deps = deps_table(np.array(d_rank, dtype=np.int32), d_src, d_dst)
    return Trace(ops=ops, deps=deps)


def _expected(trace: Trace) -> tuple[pa.Table, pa.Table]:
    """The whole-trace split of every dependency the files hold (present and missing alike)."""
    return et.split_missing(trace.ops, trace.deps)


@pytest.mark.parametrize("ids_kind", ["dense", "gappy", "shuffled"])
def test_per_rank_split_equals_the_whole_trace_split(tmp_path: Path, ids_kind: str) -> None:
    rng = np.random.default_rng(7)
    for trial in range(12):
        trace = _trace(rng, ids_kind)
        if trace.num_ops == 0:
            continue
        write_et(trace, tmp_path / f"t{trial}" / "t")
        back = read_et(tmp_path / f"t{trial}" / "t")
        present, missing = _expected(back.replace(deps=pa.concat_tables([back.deps, back.missing])))
        key = ["rank", "dst", "kind", "pos", "src"]
        assert back.deps.sort_by([(k, "ascending") for k in key]).equals(
            present.sort_by([(k, "ascending") for k in key])
        )
        assert back.missing.sort_by([(k, "ascending") for k in key]).equals(
            missing.sort_by([(k, "ascending") for k in key])
        )
        parts = list(read_et_parts(tmp_path / f"t{trial}" / "t", part_ops=16))
        assert pa.concat_tables([p.deps for p in parts]).equals(back.deps)
        assert pa.concat_tables([p.missing for p in parts]).equals(back.missing)


def test_a_repeated_id_in_a_file_written_out_of_order_is_refused(tmp_path: Path) -> None:
    ops = ops_table({"rank": [0, 0, 0], "id": [5, 2, 5], "name": ["a", "b", "c"], "type": ["COMP_NODE"] * 3})
    (path,) = write_et(Trace(ops=ops), tmp_path / "dup")
    with pytest.raises(TraceFormatError, match="node id 5 appears twice on rank 0"):
        read_et(path)


def test_split_rank_dense_gappy_and_unordered_ids() -> None:
    deps = deps_table(0, [0, 3, 9, 2], [1, 1, 1, 1])
    for ids, in_order, present in (
        ([0, 1, 2, 3], True, [True, True, False, True]),  # dense: src < n
        ([0, 2, 3, 7], True, [True, True, False, True]),  # gappy, ascending: binary search
        ([3, 0, 2], False, [True, True, False, True]),  # any order
        ([], True, [False] * 4),
    ):
        kept, gone = et._split_rank(np.array(ids, dtype=np.uint64), in_order, deps)
        mask = np.array(present)
        assert kept["src"].to_pylist() == np.array([0, 3, 9, 2])[mask].tolist()
        assert gone["src"].to_pylist() == np.array([0, 3, 9, 2])[~mask].tolist()
