"""The recordings under tests/data, each read once per test session (a PyTorch ET + Kineto
pair per rank takes a good part of a second to link)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from etstore.ingest.pytorch_et import read_pytorch_et
from etstore.model import Trace

DATA = Path(__file__).parent / "data"


@cache
def recording(name: str) -> Trace:
    """``tests/data/<name>`` read as one trace (callers must not change it)."""
    return read_pytorch_et(DATA / name)
