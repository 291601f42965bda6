"""The figures' shared axes and titles: byte-size ticks at powers of two, panel titles that fit."""

from __future__ import annotations

import math

import pytest

from etstore.report._data import RunInfo
from etstore.report._style import MAX_SIZE_TICKS, fmt_bytes, integer_ticks, panel_titles, size_axis


def _run(run_id: int, trace: str, topology: str = "ring:8", congestion: str = "unaware") -> RunInfo:
    return RunInfo(run_id, trace, topology, 8, congestion, "LIFO", 1e6, 10, 10, 10)


@pytest.mark.parametrize(
    ("sizes", "labels"),
    [
        # nccl-tests' default sweep -b 8 -e 128M -f 2: 2^3 .. 2^27 B, 24 bits -> a label every 5 bits
        ([2**k for k in range(3, 28)], ["32 B", "1 KiB", "32 KiB", "1 MiB", "32 MiB"]),
        ([2**16, 2**20, 2**22], ["64 KiB", "128 KiB", "256 KiB", "512 KiB", "1 MiB", "2 MiB", "4 MiB"]),
        ([16 * 2**20, 192 * 2**20], ["16 MiB", "32 MiB", "64 MiB", "128 MiB", "256 MiB"]),
        ([2**20], ["512 KiB", "1 MiB", "2 MiB"]),  # one size: its neighbours too
        ([1, 8 * 2**30], ["1 B", "32 B", "1 KiB", "32 KiB", "1 MiB", "32 MiB", "1 GiB"]),
        ([3000, 5000], ["2 KiB", "4 KiB", "8 KiB"]),
    ],
)
def test_size_axis_labels_powers_of_two_only(sizes: list[int], labels: list[str]) -> None:
    axis = size_axis(sizes, "size (bytes)")
    assert axis["ticktext"] == labels
    assert len(labels) <= MAX_SIZE_TICKS
    assert [fmt_bytes(int(v)) for v in axis["tickvals"]] == labels
    lo, hi = axis["range"]  # log10 of bytes: every tick inside, every size inside
    assert all(lo < math.log10(v) < hi for v in [*axis["tickvals"], *sizes])
    assert axis["type"] == "log" and axis["title"] == "size (bytes)"


def test_size_axis_without_sizes_is_a_plain_log_axis() -> None:
    assert size_axis([0, -1], "s") == {"title": "s", "type": "log"}


def test_fmt_bytes() -> None:
    assert [fmt_bytes(n) for n in (1, 512, 1024, 3 * 1024, 2**20, 2**30, 2**40)] == [
        "1 B",
        "512 B",
        "1 KiB",
        "3 KiB",
        "1 MiB",
        "1 GiB",
        "1 TiB",
    ]


def test_integer_ticks() -> None:
    assert integer_ticks(8) == {"tickmode": "linear", "tick0": 0, "dtick": 1}
    assert integer_ticks(64)["dtick"] == 4


def test_panel_titles_keep_to_their_share_of_the_row() -> None:
    runs = [
        _run(1, "dlrm_8r"),
        _run(2, "dlrm_8r-expanded", congestion="aware"),
        _run(13, "a-very-long-trace-name-from-a-sweep", topology="switch:8,bw=50,lat=500"),
    ]
    titles = panel_titles(runs)
    # 84 characters over 3 panels: 28 each. Topologies and congestions differ; each is added
    # only while the title stays within 28 ("run 1 · dlrm_8r · ring:8" is 24, " · unaware" would
    # make 34), and the long trace name is cut to 27 characters and "…"
    assert titles == ["run 1 · dlrm_8r · ring:8", "run 2 · dlrm_8r-expanded", "run 13 · a-very-long-trace-…"]
    assert all(len(t) <= 84 // 3 for t in titles)
    assert panel_titles(runs[:1]) == ["run 1 · dlrm_8r"]  # nothing to tell apart
    assert panel_titles([]) == []
