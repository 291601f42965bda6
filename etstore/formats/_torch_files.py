"""Which file of a recording is which: execution traces and Kineto traces, and their ranks."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from etstore.errors import TraceFormatError
from etstore.formats.files import MAX_RANK, named_rank

__all__ = ["PathLike", "Spec", "assign_ranks", "doc_kind", "name_rank", "trace_paths"]

_RANK_WORD = re.compile(r"(?:rank|worker)[_-]?(\d+)", re.IGNORECASE)  # rank3_et, worker3_step_12.<ts>
_LAST_NUMBER = re.compile(r"(\d+)(?=\D*$)")  # dlrm_eg_3

PathLike = str | Path
Spec = PathLike | Sequence[PathLike] | Mapping[int, PathLike]


def trace_paths(spec: Spec | None) -> list[tuple[int | None, Path]]:
    """``(rank if given, path)`` for a file, directory, glob, list or ``{rank: path}``."""
    if spec is None:
        return []
    if isinstance(spec, Mapping):
        return [(int(r), Path(p)) for r, p in sorted(spec.items())]
    if not isinstance(spec, (str, Path)):
        return [(None, Path(p)) for p in spec]
    text = str(spec)
    path = Path(text)
    if any(ch in text for ch in "*?["):
        found = sorted(p for p in path.parent.glob(path.name) if p.is_file())
    elif path.is_dir():
        found = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz")))
    elif path.is_file():
        return [(None, path)]
    else:
        raise TraceFormatError(f"{text}: no such file or directory")
    if not found:
        raise TraceFormatError(f"{text}: no .json or .json.gz trace files found")
    return [(None, p) for p in found]


def name_rank(path: Path) -> int | None:
    """The rank a file name states: the number after ``rank``/``worker``, else its last number."""
    stem = path.name.split(".json")[0]
    m = _RANK_WORD.search(stem)
    if m:
        return named_rank(m[1], path)
    m = _LAST_NUMBER.search(stem)  # a bare number past any rank is none (a timestamp, a job id)
    return int(m[1]) if m and len(m[1]) <= 10 and int(m[1]) <= MAX_RANK else None


def assign_ranks(
    items: list[tuple[int | None, Path, int | None]], what: str
) -> dict[int, tuple[Path, int | None]]:
    """Rank of each file: given, else the file's own (content), else its name's number, else its position."""
    out: dict[int, tuple[Path, int | None]] = {}
    names = [name_rank(p) for _, p, _ in items]
    use_names = None not in names and len(set(names)) == len(names)
    for i, ((given, path, content), by_name) in enumerate(zip(items, names, strict=True)):
        rank = given if given is not None else content
        if rank is None:
            rank = by_name if use_names and by_name is not None else i
        if rank in out:
            raise TraceFormatError(f"{path}: {what} of rank {rank} also given by {out[rank][0]}")
        out[rank] = (path, content)
    return out


def doc_kind(doc: Any) -> str:
    """``et``, ``kineto`` or ``other``: what a decoded JSON document is."""
    if isinstance(doc, dict) and "nodes" in doc:
        return "et"
    if isinstance(doc, dict) and "traceEvents" in doc:
        return "kineto"
    return "other"
