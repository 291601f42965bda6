"""Two traces side by side: a trace against itself, against a perturbed copy, two recordings."""

from __future__ import annotations

import doctest
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from etstore.analysis import diff as diff_module
from etstore.analysis.diff import diff_traces
from etstore.formats.pytorch_et import read_pytorch_et
from etstore.sim.perturb import Perturbation, perturb

DATA = Path(__file__).resolve().parents[1] / "data"


def test_docstring_examples() -> None:
    failed, tried = doctest.testmod(diff_module)
    assert tried > 0 and failed == 0


def test_a_trace_against_itself_differs_nowhere() -> None:
    t = read_pytorch_et(DATA / "torch_ddp_cuda_gloo_2r")
    d = diff_traces(t, t).to_pandas()
    assert (d["time_us_diff"] == 0).all() and (d["bytes_diff"] == 0).all()
    assert (d["count_a"] == d["count_b"]).all()
    # every non-metadata op is in exactly one op/kernel/collective group and in its rank's
    ops = t.ops.filter(pc.invert(pc.equal(t.ops["type"], "METADATA_NODE")))
    parts = d[d["kind"] != "rank"]
    assert parts["count_a"].sum() == ops.num_rows == d[d["kind"] == "rank"]["count_a"].sum()
    assert set(d[d["kind"] == "kernel"]["key"]) == {
        n for n, c in zip(ops["name"].to_pylist(), ops["is_cpu_op"].to_pylist(), strict=True) if c is False
    } - {
        n for n, ty in zip(ops["name"].to_pylist(), ops["type"].to_pylist(), strict=True) if ty != "COMP_NODE"
    }


def test_a_slowed_rank_is_the_largest_difference_by_its_added_compute() -> None:
    t = read_pytorch_et(DATA / "torch_ddp_cuda_gloo_2r")
    slow = perturb(t, Perturbation(slow={1: 2.0}))
    d = diff_traces(t, slow).to_pandas()
    top = d.iloc[0]
    assert (top["kind"], top["key"]) == ("rank", "1")
    comp = t.ops.filter(pc.and_(pc.equal(t.ops["rank"], 1), pc.equal(t.ops["type"], "COMP_NODE")))
    assert top["time_us_diff"] == comp["duration_micros"].to_numpy().sum()
    assert np.all(np.abs(d["time_us_diff"].to_numpy())[:-1] >= np.abs(d["time_us_diff"].to_numpy())[1:])
    assert d[(d["kind"] == "rank") & (d["key"] == "0")]["time_us_diff"].item() == 0


def test_groups_one_side_lacks_are_rows_with_zeros() -> None:
    """gloo on CUDA tensors against gloo on CPU: the CUDA run's synchronizes and its all-reduces
    of 172,048 B have no counterpart; the CPU run's 2,704 B all-reduces none on the other side."""
    a, b = read_pytorch_et(DATA / "torch_ddp_cuda_gloo_2r"), read_pytorch_et(DATA / "torch_ddp_2r")
    d = diff_traces(a, b).to_pandas().set_index(["kind", "key"])
    assert d.loc[("op", "cudaStreamSynchronize"), "count_b"] == 0
    assert d.loc[("collective", "ALL_REDUCE 172,048 B"), ["count_a", "count_b"]].tolist() == [6, 0]
    assert d.loc[("collective", "ALL_REDUCE 2,704 B"), ["count_a", "count_b", "bytes_b"]].tolist() == [
        0,
        4,
        4 * 2704,
    ]
