"""Which files make a trace, what each one is, and which rank each holds.

Chakra files name their rank (``<prefix>.<rank>.et``). PyTorch files are recognised by
their content (:func:`sniff_format`), and their rank comes from the file's own metadata
where it has some (Kineto's ``distributedInfo.rank``), else from the number in the file
name (``rank0_et.json``, ``worker3_step_12.<ts>.pt.trace.json``, ``dlrm_eg_3.json``).
"""

from __future__ import annotations

import codecs
import glob
import gzip
import json
import logging
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etstore.errors import ConfigError, TraceFormatError
from etstore.formats._frames import (
    COMM_GROUPS_COST,
    KINETO_COST,
    PYTORCH_ET_COST,
    check_json_depth,
    load_json,
    read_within_budget,
    require_together_budget,
)

log = logging.getLogger(__name__)

__all__ = [
    "CHAKRA_ET",
    "CHAKRA_JSON",
    "COMM_GROUPS_SUFFIX",
    "KINETO",
    "MAX_RANK",
    "MSCCLPP_PLAN",
    "MSCCL_XML",
    "PYTORCH_ET",
    "RankFile",
    "TorchFiles",
    "candidate_files",
    "comm_groups_path",
    "named_rank",
    "rank_in_name",
    "read_comm_groups",
    "resolve_rank_files",
    "sniff_format",
    "stated_rank",
    "stoi",
    "torch_rank_files",
]

CHAKRA_ET = "chakra-et"
CHAKRA_JSON = "chakra-json"
PYTORCH_ET = "pytorch-et"
KINETO = "kineto"
MSCCL_XML = "msccl-xml"
MSCCLPP_PLAN = "mscclpp-plan"

_RANKED = re.compile(r"^(?P<prefix>.+)\.(?P<rank>\d+)\.(?P<ext>et|et\.gz|json|json\.gz)$")
_EXTS = (".et", ".et.gz", ".json", ".json.gz")

RankFile = tuple[int, Path]


MAX_RANK = (1 << 31) - 1
"""Largest rank a file name may state: ranks are 32-bit ints in every column and in ASTRA-sim."""


def named_rank(digits: str, path: Path | str) -> int:
    """The rank a file name states in ``digits``, refused in one line past :data:`MAX_RANK`."""
    if len(digits) > 10 or int(digits) > MAX_RANK:
        shown = digits if len(digits) <= 20 else f"{digits[:17]}..."
        raise TraceFormatError(f"{path}: rank {shown} in the file name is past the largest, {MAX_RANK:,}")
    return int(digits)


def _split(path: Path) -> tuple[str, int | None]:
    m = _RANKED.match(path.name)
    if m:
        return m["prefix"], named_rank(m["rank"], path)
    stem = path.name
    for ext in _EXTS:
        if stem.endswith(ext):
            stem = stem[: -len(ext)]
            break
    return stem, None


COMM_GROUPS_SUFFIX = ".comm_groups.json"


def comm_groups_path(prefix: str | Path) -> Path:
    """``<prefix>.comm_groups.json``: ASTRA-sim's communicator groups beside a trace's rank files."""
    prefix = Path(prefix)
    return prefix.with_name(f"{prefix.name}{COMM_GROUPS_SUFFIX}")


_INT32 = (-(1 << 31), (1 << 31) - 1)
_STOI = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")


def stoi(text: str) -> int | None:
    """``text`` read as C++'s ``std::stoi`` reads it (ASTRA-sim's reading of group ids), or None
    where ``stoi`` throws.

    Leading whitespace is skipped, a sign and at least one digit are read and the rest is
    ignored (``"0.0"`` → 0, ``" 12abc"`` → 12); no digits (``"dp0"``, ``""``) or a value
    outside a 32-bit ``int`` is what ``stoi`` rejects.

    Examples
    --------
    >>> stoi("0.0"), stoi("+7"), stoi("dp0"), stoi("99999999999")
    (0, 7, None, None)
    """
    m = _STOI.match(text)
    if m is None:
        return None
    if len(m[1].lstrip("+-").lstrip("0")) > 10:  # past 32 bits, and maybe past what int() converts
        return None
    value = int(m[1])
    return value if _INT32[0] <= value <= _INT32[1] else None


def read_comm_groups(path: str | Path) -> dict[str, list[int]]:
    """Read ASTRA-sim's communicator-group JSON (``{"1": [0, 1, 2, 3], ...}``).

    Keys are read as ASTRA-sim reads them, with ``std::stoi`` (:func:`stoi`): ``"0.0"`` is
    group 0 and ``"01"`` group 1. The result is keyed by the group number in decimal
    (``"0"``, ``"1"``); a key spelled otherwise is logged as one warning line naming how it
    was read. Members keep the order the file lists them in: ASTRA-sim builds a group's ring
    in that order (``CommunicatorGroup``, ``RingTopology``).

    Raises
    ------
    ConfigError
        The file is missing, not JSON, a key ``stoi`` rejects (no leading number, or one
        outside a 32-bit int), two keys naming one group, or a group that is not a list
        of ranks; one line naming the file.
    """
    path = Path(path)
    try:
        raw = read_within_budget(path, COMM_GROUPS_COST)
        data = _decoded_groups(raw, path)
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: no such communicator group file") from exc
    except TraceFormatError as exc:  # over the memory budget
        raise ConfigError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the communicator group file ({exc})") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: line {exc.lineno}: not valid JSON ({exc.msg})") from exc
    except ValueError as exc:  # an integer of more digits than Python converts
        raise ConfigError(f"{path}: not valid JSON ({str(exc)[:120]})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected an object mapping group names to rank lists")
    out: dict[str, list[int]] = {}
    spelled: dict[str, str] = {}
    for name, ranks in data.items():
        number = stoi(name)
        if number is None:
            raise ConfigError(
                f"{path}: communicator group key {name!r} is not a group number; ASTRA-sim reads keys "
                'with stoi, which rejects it (expected an integer such as "1")'
            )
        key = str(number)
        if key in spelled:
            raise ConfigError(
                f"{path}: keys {spelled[key]!r} and {name!r} both name communicator group {key} "
                "(ASTRA-sim reads keys with stoi)"
            )
        if not isinstance(ranks, list) or not all(
            isinstance(r, int) and not isinstance(r, bool) and 0 <= r <= MAX_RANK for r in ranks
        ):
            raise ConfigError(f"{path}: group {name!r} must be a list of integer ranks in 0..{MAX_RANK:,}")
        spelled[key] = name
        out[key] = list(ranks)
    renamed = [f"{name!r} -> {key}" for key, name in spelled.items() if name != key]
    if renamed:
        log.warning(
            "%s: communicator group keys read as ASTRA-sim reads them (stoi): %s", path, ", ".join(renamed)
        )
    return out


def _decoded_groups(raw: bytes, path: Path) -> Any:
    """The JSON of a communicator group file, its depth checked first (the decoder recurses per level)."""
    try:
        check_json_depth(raw, path)
    except TraceFormatError:
        raise ConfigError(f"{path}: JSON nested too deeply to be a communicator group file") from None
    return json.loads(raw.decode())


def _trace_file(p: Path, exts: tuple[str, ...]) -> bool:
    """A file that may hold a rank's trace: the extension fits and it is no comm-group sidecar."""
    return p.is_file() and p.name.endswith(exts) and not p.name.endswith(COMM_GROUPS_SUFFIX)


def resolve_rank_files(spec: str | Path) -> tuple[str, list[RankFile]]:
    """Resolve a file, directory, glob or ``<dir>/<prefix>`` into ``(prefix, [(rank, path)])``.

    A single file without a rank in its name is rank 0. A directory must hold one
    prefix only. Raises :class:`TraceFormatError` when nothing matches, prefixes mix,
    or a rank appears twice.
    """
    text = str(spec)
    path = Path(text)
    if any(ch in text for ch in "*?["):
        candidates = [Path(p) for p in sorted(glob.glob(text)) if _trace_file(Path(p), _EXTS)]
        where = f"pattern {text!r}"
    elif path.is_dir():
        candidates = sorted(p for p in path.iterdir() if _trace_file(p, _EXTS))
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


# ---------------------------------------------------------------- recognition by content

_HEAD = 1 << 16  # bytes looked at: the top-level keys precede the event / node lists
_TRACE_EXTS = (".et", ".et.gz", ".json", ".json.gz", ".xml")
_KINETO_KEYS = re.compile(
    rb'"(?:traceEvents|schemaVersion|deviceProperties|distributedInfo|displayTimeUnit)"\s*:'
)
_ET_KEYS = re.compile(rb'"nodes"\s*:')
_ET_SCHEMA = re.compile(rb'"schema"\s*:\s*"')
_JSON_START = re.compile(rb'(?:\{\s*["}]|\[\s*[{\]])')
_CHAKRA_JSON_KEYS = re.compile(rb'"workload_graph"\s*:')
# an MSCCL++ execution plan: a list of gpus beside its collective, or of gpus with threadblocks
_MSCCLPP_GPUS = re.compile(rb'"gpus"\s*:\s*\[')
_MSCCLPP_KEYS = re.compile(rb'"(?:collective|threadblocks)"\s*:')


def _head(path: Path) -> bytes:
    """The first bytes of a file, gunzipped when it is gzip."""
    try:
        with path.open("rb") as f:
            data = f.read(_HEAD)
            if data[:2] == b"\x1f\x8b":
                f.seek(0)
                with gzip.GzipFile(fileobj=f) as g:
                    try:
                        return g.read(_HEAD)
                    except (EOFError, zlib.error) as exc:
                        raise TraceFormatError(f"{path}: corrupt or truncated gzip stream: {exc}") from exc
            return data
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read: {exc.strerror or exc}") from exc


def sniff_format(path: Path) -> str:
    """What a trace file is, from its first bytes (gzip-aware), not its name.

    Returns one of :data:`CHAKRA_ET` (binary protobuf frames, the fallback),
    :data:`CHAKRA_JSON`, :data:`PYTORCH_ET`, :data:`KINETO`, :data:`MSCCL_XML` and
    :data:`MSCCLPP_PLAN` (an MSCCL++ execution plan: ``"gpus": [`` with ``"collective"``
    or ``"threadblocks"``).

    Raises
    ------
    TraceFormatError
        An unreadable or empty file, or one of a kind etstore does not read, in one line
        naming the file and what it is: a JSON document that is none of the JSON forms (a
        JSON list, say), XML other than MSCCL-IR (an NCCL graph or topology dump), other text.
    """
    head = _head(path)
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not text:
        raise TraceFormatError(f"{path}: empty file; a trace file cannot be empty")
    # a Chakra frame length may be the byte of "<" or "{" (60, 123): look one token further
    root = (
        _XML_ELEMENT.search(text)
        if text.startswith((b"<?xml", b"<!--", b"<!DOCTYPE"))
        else _XML_ELEMENT.match(text)
    )
    if root is not None and root[1] != b"algo":
        raise TraceFormatError(f"{path}: {_xml_kind(root[1].decode())}")
    if text.startswith((b"<?xml", b"<algo", b"<!--")):
        return MSCCL_XML
    whole = len(head) < _HEAD  # the head is the whole (decompressed) file
    if text[:1] == b"[" and _is_text(text) and not _JSON_START.match(text):
        raise TraceFormatError(f"{path}: a JSON list that is no trace etstore reads {_JSON_FORMS}")
    if not (_JSON_START.match(text) or (text[:1] in (b"{", b"[") and whole and head[0] >= len(head))):
        if _is_text(text):
            raise TraceFormatError(
                f"{path}: a text file ({_first_line(text)!r}) that is no trace etstore reads"
            )
        return CHAKRA_ET
    if _CHAKRA_JSON_KEYS.search(head):
        return CHAKRA_JSON
    if _KINETO_KEYS.search(head):
        return KINETO
    if _ET_KEYS.search(head) or _ET_SCHEMA.search(head):
        return PYTORCH_ET
    if _MSCCLPP_GPUS.search(head) and _MSCCLPP_KEYS.search(head):
        return MSCCLPP_PLAN
    if whole:
        check_json_depth(head, path)  # the standard decoder recurses once per level
        try:
            json.loads(head)
        except (ValueError, UnicodeDecodeError) as exc:
            raise TraceFormatError(f"{path}: not valid JSON (truncated or corrupt): {exc}") from exc
    what = "a JSON list" if text[:1] == b"[" else "a JSON document"
    raise TraceFormatError(f"{path}: {what} that is no trace etstore reads {_JSON_FORMS}")


_JSON_FORMS = (
    "(expected a JSON object: Chakra JSON 'workload_graph', a PyTorch execution trace 'nodes', "
    "a Kineto 'traceEvents' or an MSCCL++ execution plan 'gpus')"
)
_XML_ELEMENT = re.compile(rb"<([A-Za-z_][\w.:-]*)[\s>/]")  # an element's start tag (not <? or <!)
_KNOWN_XML = {
    "graphs": "an NCCL graph dump (NCCL_GRAPH_DUMP_FILE)",
    "system": "an NCCL topology dump (NCCL_TOPO_DUMP_FILE)",
}


def _xml_kind(root: str) -> str:
    """What an XML document whose root element is ``root`` (not ``algo``) is, in words."""
    known = _KNOWN_XML.get(root)
    what = f"{known}, root element <{root}>" if known else f"XML with root element <{root}>"
    return f"{what}: not MSCCL-IR (<algo>) nor any other trace etstore reads"


def _is_text(data: bytes) -> bool:
    """Whether ``data`` (a file's first bytes) reads as text: UTF-8 without control characters.
    A Chakra ``.et`` file never does: its first bytes hold a frame length and a field tag."""
    sample = data[:512]
    try:
        decoded = codecs.getincrementaldecoder("utf-8")().decode(sample, final=len(data) <= 512)
    except UnicodeDecodeError:
        return False
    return bool(decoded) and all(ch >= " " or ch in "\t\r\n" for ch in decoded)


def _first_line(data: bytes) -> str:
    """The first line of a text file's head, at most 60 characters."""
    line = data.split(b"\n", 1)[0].decode("utf-8", errors="replace").strip()
    return line if len(line) <= 60 else line[:57] + "..."


_RANK_WORD = re.compile(r"(?:rank|worker|gpu|device|node|proc)[_\-.]?(\d+)", re.IGNORECASE)
_NUMBER = re.compile(r"\d+")


def rank_in_name(name: str) -> int | None:
    """The rank a file name states: the number after ``rank``/``worker``/..., else its only
    or first number (``dlrm_eg_3.json`` → 3); None when it has none."""
    stem = name
    for ext in (".pt.trace.json.gz", ".pt.trace.json", ".json.gz", ".json", ".et.gz", ".et"):
        if stem.endswith(ext):
            stem = stem[: -len(ext)]
            break
    m = _RANK_WORD.search(stem)
    if m:
        return named_rank(m[1], name)
    numbers = _NUMBER.findall(stem)
    if not numbers:
        return None
    # a bare number past any rank is no rank (a timestamp, a job id): the file states none
    return int(numbers[0]) if len(numbers[0]) <= 10 and int(numbers[0]) <= MAX_RANK else None


def names_rank_files(spec: str | Path) -> bool:
    """Whether ``spec`` is a ``<dir>/<prefix>`` (or bare ``<prefix>``) with rank files
    ``<prefix>.<rank>.*`` next to it: ASTRA-sim's way of naming a workload."""
    path = Path(spec)
    return path.parent.is_dir() and any(
        _RANKED.match(p.name) for p in path.parent.glob(glob.escape(path.name) + ".*")
    )


def candidate_files(spec: str | Path) -> tuple[str, list[Path]] | None:
    """``(where, files)`` of a directory or glob holding trace files; None for anything else."""
    text = str(spec)
    if any(ch in text for ch in "*?["):
        return f"pattern {text!r}", [
            Path(p) for p in sorted(glob.glob(text)) if _trace_file(Path(p), _TRACE_EXTS)
        ]
    path = Path(text)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if _trace_file(p, _TRACE_EXTS))
        return f"directory {path}", files
    return None


@dataclass
class TorchFiles:
    """The PyTorch files of one trace: ET and Kineto per rank, and the parsed Kineto documents."""

    et: dict[int, Path] = field(default_factory=dict)
    kineto: dict[int, Path] = field(default_factory=dict)
    docs: dict[Path, Any] = field(default_factory=dict)
    world_size: int | None = None


def stated_rank(doc: Any) -> tuple[int | None, int | None]:
    """``(rank, world size)`` a Kineto document's ``distributedInfo`` states (None where it does not)."""
    info = doc.get("distributedInfo") if isinstance(doc, Mapping) else None
    if not isinstance(info, Mapping):
        return None, None
    rank, world = info.get("rank"), info.get("world_size")
    ok_rank = isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < 2**31
    ok_world = isinstance(world, int) and not isinstance(world, bool) and 0 < world < 2**31
    return (rank if ok_rank else None), (world if ok_world else None)


def torch_rank_files(where: str, files: Sequence[tuple[Path, str]]) -> TorchFiles:
    """Assign each PyTorch file (ET or Kineto, with its sniffed format) its rank.

    Parameters
    ----------
    where
        What the files came from (a directory, a pattern), for messages.
    files
        ``(path, format)`` of every file, format :data:`PYTORCH_ET` or :data:`KINETO`.

    Returns
    -------
    TorchFiles

    Raises
    ------
    TraceFormatError
        Two files of one kind for one rank, a file with no rank beside files that have one
        (one ET and one Kineto file without ranks are one process's pair: rank 0), Kineto
        files of different world sizes, or a rank outside the world. Missing ranks are not
        an error: a capture of some ranks is a trace of those ranks. Or the files, read
        together as their reader holds them, would not fit the memory budget (checked
        before any is read).

    Notes
    -----
    Parses each Kineto file once (the documents are handed on, not parsed again).
    """
    costs = [(path, KINETO_COST if fmt == KINETO else PYTORCH_ET_COST) for path, fmt in files]
    require_together_budget(costs)
    out = TorchFiles()
    worlds: dict[int, Path] = {}
    unranked: list[tuple[Path, str]] = []
    for path, fmt in files:
        rank: int | None = None
        if fmt == KINETO:
            doc = load_json(path, limit=KINETO_COST.byte_limit())
            out.docs[path] = doc
            rank, world = stated_rank(doc)
            if world is not None:
                if worlds and world not in worlds:
                    other_world, other = next(iter(worlds.items()))
                    raise TraceFormatError(
                        f"{path}: distributedInfo.world_size is {world} but {other} says {other_world} "
                        "(files of different runs)"
                    )
                worlds.setdefault(world, path)
        if rank is None:
            rank = rank_in_name(path.name)
        if rank is None:
            unranked.append((path, fmt))
            continue
        _put(out, path, fmt, rank)
    # one recording of one process (a single-GPU ET + Kineto pair) needs no rank: it is rank 0
    kinds = [fmt for _, fmt in unranked]
    if unranked and (len(unranked) < len(files) or len(set(kinds)) < len(kinds)):
        raise TraceFormatError(
            f"{unranked[0][0]}: no rank in the file's metadata or name; name per-rank files rank<N>_..."
        )
    for path, fmt in unranked:
        _put(out, path, fmt, 0)
    out.world_size = next(iter(worlds)) if worlds else None
    _check_ranks(where, out)
    return out


def _put(out: TorchFiles, path: Path, fmt: str, rank: int) -> None:
    table = out.kineto if fmt == KINETO else out.et
    if rank in table:
        raise TraceFormatError(f"{path}: rank {rank} also given by {table[rank]}")
    table[rank] = path


def _check_ranks(where: str, files: TorchFiles) -> None:
    """Ranks lie inside the world; ET and Kineto cover the same ranks. A recording of some of
    the ranks only (a capture of a subset) is a trace of those ranks: the reader says which."""
    ranks = sorted(set(files.et) | set(files.kineto))
    world = files.world_size
    if world is not None:
        outside = [r for r in ranks if r >= world]
        if outside:
            r = outside[0]
            path = files.kineto.get(r) or files.et[r]
            raise TraceFormatError(f"{path}: rank {r} is outside the world of {world} ranks")
    if files.et and files.kineto and set(files.et) != set(files.kineto):
        lone = sorted(set(files.et) ^ set(files.kineto))[0]
        has, lacks = ("an execution trace", "Kineto") if lone in files.et else ("a Kineto trace", "execution")
        raise TraceFormatError(f"{where}: rank {lone} has {has} but no {lacks} trace")
