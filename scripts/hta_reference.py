"""Write HTA's breakdowns of the shipped recordings to tests/data/hta_reference.json.

The measured breakdowns of ``etstore breakdown`` follow HolisticTraceAnalysis's definitions; this
script runs HTA itself on the same Kineto traces so the tests compare with its numbers. HTA is not
a dependency of etstore (it pulls in JupyterLab), so run it from a venv of its own:

    python -m venv /tmp/hta && /tmp/hta/bin/pip install HolisticTraceAnalysis==0.5.0
    /tmp/hta/bin/python scripts/hta_reference.py examples/dlrm_8r tests/data/torch_*cuda*

Each argument is a folder holding one Kineto trace per rank (``*kineto*`` or
``*.pt.trace.json``, gzipped or not).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "hta_reference.json"


def _one(folder: Path) -> dict[str, Any]:
    from hta.trace_analysis import TraceAnalysis  # type: ignore[import-not-found]

    tmp = Path(tempfile.mkdtemp())
    for f in sorted(folder.rglob("*")):
        if f.is_file() and ("kineto" in f.name or ".pt.trace.json" in f.name):
            shutil.copy(f, tmp / f.name)
    a = TraceAnalysis(trace_dir=str(tmp))
    out: dict[str, Any] = {}
    try:
        out["temporal"] = a.get_temporal_breakdown(visualize=False).to_dict("records")
    except AssertionError as e:  # HTA asserts non-compute time >= 0, and fails it on some traces
        out["temporal_error"] = f"HTA failed: AssertionError {e}".strip()
    out["comm_comp_overlap"] = a.get_comm_comp_overlap(visualize=False).to_dict("records")
    return out


def _no_nan(v: Any) -> Any:
    """NaN (HTA's overlap of a rank with no communication: 0 / 0) as null."""
    if isinstance(v, dict):
        return {k: _no_nan(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_no_nan(x) for x in v]
    if isinstance(v, float) and v != v:
        return None
    return float(v) if hasattr(v, "item") else v


def main() -> None:
    import hta  # type: ignore[import-not-found]

    ref = {"hta_version": getattr(hta, "__version__", "0.5.0"), "traces": {}}
    for arg in sys.argv[1:]:
        ref["traces"][Path(arg).name] = _one(Path(arg))
    OUT.write_text(json.dumps(_no_nan(ref), indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
