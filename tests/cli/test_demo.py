"""`etstore demo` end to end on the shipped recorded DLRM trace (examples/dlrm_8r).

The pinned numbers are counted from the upstream files: every rank's execution trace holds
3 ``nccl:all_reduce`` and 5 ``nccl:all_to_all`` nodes; the all-reduce buffers are
394,241 + 112 + 226,960 float32 elements = 2,485,252 bytes per rank (``dlrm_eg_0.json``).
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from etstore.cli import demo, main
from etstore.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dlrm_8r"


def run(capsys: pytest.CaptureFixture[str], store: Path, *args: str) -> tuple[int, str, str]:
    code = main(["--store", str(store), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_shipped_files_are_the_upstream_pair() -> None:
    et = sorted(EXAMPLE.glob("dlrm_eg_*.json.gz"))
    kineto = sorted(EXAMPLE.glob("worker*_step_12.*.pt.trace.json.gz"))
    assert len(et) == 8 and len(kineto) == 8 and (EXAMPLE / "SOURCE.md").is_file()
    with gzip.open(EXAMPLE / "dlrm_eg_3.json.gz", "rt") as f:
        names = [n["name"] for n in json.load(f)["nodes"]]
    assert names.count("nccl:all_reduce") == 3 and names.count("nccl:all_to_all") == 5


def test_demo_runs_on_the_recorded_dlrm_trace(tmp_path: Path) -> None:
    """As a user runs it: its own process (``python -m etstore.cli``, as the console script,
    which hides pandas from pyarrow and Ladybug)."""
    out_dir = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "etstore.cli", "--store", str(tmp_path / "s"), "demo", "--out", str(out_dir)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    text = " ".join(out.split())  # the console wraps long lines
    assert "dlrm_8r: pytorch-et; 15,724 ops; collectives: ALL_REDUCE 24, ALL_TO_ALL 40; linked 100.0%" in text
    assert "over 8 ranks" in text
    # step 3: per rank, the all-reduce bytes counted from the execution trace
    assert text.count("ALL_REDUCE │ 3 │ 2485252 │ 1576964") == 8
    assert text.count("ALL_TO_ALL │ 5 │ 64448 │ 24576") == 8
    # step 4: 3 all-reduce + 5 all-to-all instances, the 4-rank MSCCL-IR ring does not fit 8 ranks
    assert "replacing 8 collective instances" in text
    assert "all-reduce uses the built-in ring:2 generator" in text
    # step 5: the same algorithms as collective nodes and expanded give the same time (one cost
    # model); ASTRA-sim's native ring is reported as the different algorithm it is
    five = re.search(
        r"dlrm_8r \(collective nodes run ring:2 all-reduce, direct all-to-all\): ([\d,.]+) µs \(run 1\); "
        r"dlrm_8r-expanded: ([\d,.]+) µs \(run 2\): ([-+][\d.]+)%",
        text,
    )
    assert five is not None and five.group(1) == five.group(2) and five.group(3) == "+0.000"
    ends = re.search(r"last communication ends at ([\d,.]+) µs \(collective nodes\) and ([\d,.]+) µs", text)
    assert ends is not None and ends.group(1) == ends.group(2)
    assert "with ASTRA-sim's native ring collectives instead" in text and "not the expansion" in text
    # step 6: the recorded step replayed as it ran, every rank within 5% of its measured step
    six = re.search(r"every rank's simulated step within ([\d.]+)% of its measured one", text)
    assert six is not None and float(six.group(1)) <= 5.0
    # steps 7 and 8: the gains reported (each on top of the ones before it) are what applying all
    # of them realises, on the DLRM and on our FSDP2 recording
    together = re.search(r"on top of the ones above it: together ([\d,.]+) µs", text)
    eight = re.search(
        r"dlrm_8r: ([\d,.]+) µs → dlrm_8r-overlap: ([\d,.]+) µs \((-[\d.]+)%\): estimated ([\d,.]+) µs, "
        r"realised ([\d,.]+) µs",
        text,
    )
    assert together is not None and eight is not None
    assert eight.group(4) == eight.group(5) == together.group(1)
    assert float(eight.group(3)) <= -1.0  # a real win: at least 1% of the step
    own = re.search(
        r"the same on fsdp2_2r .*?estimated ([\d,.]+) µs, realised ([\d,.]+) µs \((-[\d.]+)%", text
    )
    assert own is not None and own.group(1) == own.group(2) and float(own.group(3)) <= -1.0
    html = out_dir / "report.html"
    assert html.is_file() and html.stat().st_size > 20_000
    assert "dlrm_8r" in html.read_text(encoding="utf-8")
    assert len(list(out_dir.glob("dlrm_8r-expanded.*.et"))) == 8  # the expanded trace, for ASTRA-sim


def test_demo_without_its_trace_names_the_missing_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(demo, "EXAMPLES", tmp_path / "examples")
    with pytest.raises(ConfigError, match=r"the demo trace .*examples/dlrm_8r is missing"):
        demo.run_demo(store_location=str(tmp_path / "store"), console=Console(), out_dir=tmp_path / "out")
    assert not (tmp_path / "out" / "report.html").exists()
