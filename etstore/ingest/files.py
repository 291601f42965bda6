"""Which files make a trace, and which rank each holds (``<prefix>.<rank>.et``)."""

from __future__ import annotations

import glob
import re
from pathlib import Path

from etstore.errors import TraceFormatError

__all__ = ["RankFile", "resolve_rank_files"]

_RANKED = re.compile(r"^(?P<prefix>.+)\.(?P<rank>\d+)\.(?P<ext>et|et\.gz|json|json\.gz)$")
_EXTS = (".et", ".et.gz", ".json", ".json.gz")

RankFile = tuple[int, Path]


def _split(path: Path) -> tuple[str, int | None]:
    m = _RANKED.match(path.name)
    if m:
        return m["prefix"], int(m["rank"])
    stem = path.name
    for ext in _EXTS:
        if stem.endswith(ext):
            stem = stem[: -len(ext)]
            break
    return stem, None


def resolve_rank_files(spec: str | Path) -> tuple[str, list[RankFile]]:
    """Resolve a file, directory, glob or ``<dir>/<prefix>`` into ``(prefix, [(rank, path)])``.

    A single file without a rank in its name is rank 0. A directory must hold one
    prefix only. Raises :class:`TraceFormatError` when nothing matches, prefixes mix,
    or a rank appears twice.
    """
    text = str(spec)
    path = Path(text)
    if any(ch in text for ch in "*?["):
        candidates = [Path(p) for p in sorted(glob.glob(text)) if Path(p).is_file()]
        where = f"pattern {text!r}"
    elif path.is_dir():
        candidates = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(_EXTS))
        where = f"directory {path}"
    elif path.is_file():
        prefix, rank = _split(path)
        return prefix, [(rank if rank is not None else 0, path)]
    else:
        # <dir>/<prefix>: the files <prefix>.<rank>.et next to it
        candidates = (
            sorted(p for p in path.parent.glob(glob.escape(path.name) + ".*") if _RANKED.match(p.name))
            if path.parent.is_dir()
            else []
        )
        where = f"prefix {text!r}"
        if not candidates:
            raise TraceFormatError(f"{text}: no such file, directory or <prefix>.<rank>.et files")
    if not candidates:
        raise TraceFormatError(f"{where}: no .et or .json trace files found")
    groups: dict[str, list[RankFile]] = {}
    for p in candidates:
        prefix, rank = _split(p)
        groups.setdefault(prefix, []).append((rank if rank is not None else -1, p))
    if len(groups) > 1:
        names = ", ".join(sorted(groups))
        raise TraceFormatError(
            f"{where}: mixes traces with different prefixes ({names}); name one as <dir>/<prefix>"
        )
    prefix, files = next(iter(groups.items()))
    if len(files) == 1 and files[0][0] == -1:
        return prefix, [(0, files[0][1])]
    unranked = [p for r, p in files if r == -1]
    if unranked:
        raise TraceFormatError(f"{unranked[0]}: no rank in the file name; expected {prefix}.<rank>.et")
    seen: dict[int, Path] = {}
    for rank, p in files:
        if rank in seen:
            raise TraceFormatError(f"{p}: rank {rank} also given by {seen[rank]}")
        seen[rank] = p
    return prefix, sorted(files)
