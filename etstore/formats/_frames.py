"""Varint-framed protobuf streams: open (gzip-sniffed, decompressed within a budget), validate and
split into frames, and the upfront limits on what one file may make us hold in memory: for every
reader, what reading a file peaks at per byte (and per line) of it (:class:`ReadCost`), checked
against the memory budget before the file is parsed. JSON files are opened the same way
(:func:`load_json`), here rather than beside the PyTorch readers so that recognising a file's
format does not load them."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import orjson

from etstore.errors import TraceFormatError
from etstore.units import BUDGET_ENV_VAR, budget_exceeded, format_bytes, memory_budget

__all__ = [
    "BYTES_PER_NODE",
    "COMM_GROUPS_COST",
    "DECODED_BYTES_FACTOR",
    "KINETO_COST",
    "MAX_JSON_DEPTH",
    "MSCCL_XML_COST",
    "NCCL_TESTS_COST",
    "PYTORCH_ET_COST",
    "TUNER_COST",
    "ReadCost",
    "check_json_depth",
    "declared_size",
    "frame_limit_message",
    "load_json",
    "max_decoded_bytes",
    "max_nodes",
    "read_bytes",
    "read_within_budget",
    "require_read_budget",
    "require_together_budget",
    "varint",
    "write_varint",
]

_GZIP_MAGIC = b"\x1f\x8b"
_FOREIGN_MAGIC = {
    b"\x89PNG": "a PNG image",
    b"%PDF": "a PDF document",
    b"PK\x03\x04": "a ZIP archive",
    b"\x7fELF": "an ELF binary",
    b"<?xm": "an XML document",
    b"{": "a JSON document (use a .json name for Chakra JSON traces)",
    b"BZh": "a bzip2 archive",
}

BYTES_PER_NODE = 320
"""Peak bytes one decoded node costs on its way into the store: the decoder's columns (~150 B for
an empty node), the duplicate-id sort and the concatenated copy."""

DECODED_BYTES_FACTOR = 2
"""A file's (decompressed) bytes may take at most 1/this of the memory budget: the rest is for the
columns decoded from them."""

_CHUNK = 1 << 20  # decompress in 1 MiB steps, so a bomb stops within one step of the limit


def max_decoded_bytes() -> int:
    """Most (decompressed) bytes one trace file may hold: the budget / :data:`DECODED_BYTES_FACTOR`."""
    return memory_budget() // DECODED_BYTES_FACTOR


def max_nodes() -> int:
    """Most nodes one rank file may hold: the memory budget / :data:`BYTES_PER_NODE`."""
    return max(1, memory_budget() // BYTES_PER_NODE)


def frame_limit_message(nodes: int) -> str:
    """Why a file of ``nodes`` node frames is refused (one line, no path)."""
    limit = max_nodes()
    return (
        f"{nodes:,} node frames, more than the {limit:,} the memory budget of "
        f"{format_bytes(memory_budget())} allows at {BYTES_PER_NODE} bytes per decoded node "
        f"(set the environment variable {BUDGET_ENV_VAR} to raise it)"
    )


class ReadCost(NamedTuple):
    """Peak bytes reading one format takes: per byte of the file and per line of it.

    Measured (peak RSS over the reader's own, on real and generated files, the densest
    layouts included) and rounded up, so the estimates bound the shapes measured.
    """

    what: str
    per_byte: float
    per_line: float = 0.0

    def byte_limit(self) -> int:
        """Most bytes a file of this format may hold under the budget (its lines aside)."""
        return max(1, int(memory_budget() // self.per_byte))


MSCCL_XML_COST = ReadCost("MSCCL-IR XML", 20)
"""9.4x the file through the native scanner, 15.7x through expat (the fallback)."""
NCCL_TESTS_COST = ReadCost("nccl-tests log", 8, 900)
"""~750 bytes per table row and ~4 per byte (rows of 41 to 75 bytes measured)."""
TUNER_COST = ReadCost("tuner log", 16, 400)
"""~330 bytes per row and ~12.5 per byte (CSV rows of 9 to 48 bytes, JSON lines of 43 to 146)."""
COMM_GROUPS_COST = ReadCost("communicator groups", 8)
"""5.7x the file (lists of ranks)."""
KINETO_COST = ReadCost("Kineto trace", 12)
"""10.7x the file (decoded events and the columns read from them)."""
PYTORCH_ET_COST = ReadCost("PyTorch execution trace", 20)
"""18.8x the file (decoded nodes, their raw JSON kept per op, the columns)."""


def require_read_budget(path: Path, cost: ReadCost, size: int, lines: int = 0) -> None:
    """Refuse a file of ``size`` bytes and ``lines`` lines whose reading would not fit the budget.

    Raises
    ------
    TraceFormatError
        One line: the file, what reading it needs, the budget and how to raise it.
    """
    need = size * cost.per_byte + lines * cost.per_line
    counted = f" in {lines:,} lines" if lines else ""
    message = budget_exceeded(need, f"{path}: reading {format_bytes(size)} of {cost.what}{counted}")
    if message is not None:
        raise TraceFormatError(message)


def declared_size(path: Path) -> int:
    """Bytes ``path`` holds once decompressed, as far as it says before it is read: a gzip
    stream's trailer (ISIZE: the last member's size modulo 4 GiB), else the file's own size.

    An estimate for checks that come before any reading; each file's reader still stops
    at its own limit while it inflates, whatever the trailer says.
    """
    size = path.stat().st_size
    if size < 18:  # no room for a gzip header and trailer
        return size
    with path.open("rb") as f:
        if f.read(2) != _GZIP_MAGIC:
            return size
        f.seek(-4, 2)
        return max(size, int.from_bytes(f.read(4), "little"))


def require_together_budget(files: Sequence[tuple[Path, ReadCost]]) -> None:
    """Refuse, before any is read, files that would not fit the memory budget held together.

    Why: the ranks of one PyTorch recording are read into memory side by side (every rank's
    decoded execution trace and Kineto document lives until the trace is assembled), so a
    recording whose every file fits alone can still need many times the budget. One file
    is left to its reader's own limit.

    Raises
    ------
    TraceFormatError
        One line: the files (their directory first, where they share one), their bytes,
        what reading them together needs, the budget and how to raise it.
    """
    if len(files) < 2:
        return
    sizes = [declared_size(path) for path, _ in files]
    need = sum(size * cost.per_byte for size, (_, cost) in zip(sizes, files, strict=True))
    paths = [path for path, _ in files]
    folders = {p.parent for p in paths}
    shown = [p.name for p in paths] if len(folders) == 1 else [str(p) for p in paths]
    names = ", ".join(shown[:8]) + (f", ... ({len(shown) - 8} more)" if len(shown) > 8 else "")
    where = f"{folders.pop()}: " if len(folders) == 1 else ""
    kinds = " and ".join(dict.fromkeys(f"{cost.what}s" for _, cost in files))
    together = f"{where}{len(files)} files read together ({names}), {format_bytes(sum(sizes))} of {kinds},"
    message = budget_exceeded(need, together)
    if message is not None:
        raise TraceFormatError(message)


def read_within_budget(path: Path, cost: ReadCost) -> bytes:
    """The bytes of ``path``, read only when reading them as ``cost`` says fits the memory budget.

    The one way a text reader (MSCCL-IR XML, nccl-tests and tuner logs, communicator groups)
    takes its file: the size is checked before reading, the lines (for formats with a
    per-line cost) once the bytes are in, both before any parsing. JSON traces go through
    :func:`load_json` with their cost's :meth:`ReadCost.byte_limit`, gzip included.

    Raises
    ------
    TraceFormatError
        Over the budget (:func:`require_read_budget`).
    OSError
        The file cannot be read (each reader words that its own way).
    """
    size = path.stat().st_size
    require_read_budget(path, cost, size)
    data = path.read_bytes()
    if cost.per_line:
        require_read_budget(path, cost, len(data), data.count(b"\n") + 1)
    return data


def _too_big(path: Path, what: str, limit: int) -> TraceFormatError:
    """The refusal of a file past ``limit`` bytes (``what``: "holds 3 MiB," or "decompresses to")."""
    return TraceFormatError(
        f"{path}: {what} more than {format_bytes(limit)}, the most one file may take of the memory "
        f"budget of {format_bytes(memory_budget())} (set the environment variable {BUDGET_ENV_VAR} "
        "to raise it)"
    )


class _FrameCount:
    """Node frames of a varint-framed stream counted as it is inflated, to refuse a file of more
    than ``limit`` before all of it is held.

    Why: a gzip of empty frames inflates 1000:1, a byte per frame; counting after the whole
    stream is inflated would hold hundreds of MiB for a file refused anyway. Frames are at
    least a byte each, so no count is needed before ``limit`` bytes; from there the walk
    costs ~0.2 µs a frame and stops at the limit.
    """

    def __init__(self, path: Path, limit: int) -> None:
        self.path, self.limit = path, limit
        self.pos = 0
        self.frames = 0  # the first is the GlobalMetadata frame, not a node

    def feed(self, buf: bytearray) -> None:
        """Walk the frames complete in ``buf`` from where the last call stopped."""
        end = len(buf)
        if end <= self.limit:
            return
        pos, frames, limit = self.pos, self.frames, self.limit + 1
        while pos < end and frames <= limit:
            b = buf[pos]
            if b < 0x80:
                nxt = pos + 1 + b
            else:
                length, shift, p = b & 0x7F, 7, pos + 1
                while p < end and shift < 35:
                    b = buf[p]
                    p += 1
                    length |= (b & 0x7F) << shift
                    if b < 0x80:
                        break
                    shift += 7
                else:  # a length cut by the chunk, or no varint32: the decoder names the latter
                    if shift >= 35:
                        pos = 1 << 62  # count no further
                    break
                nxt = p + length
            if nxt > end:
                break
            pos, frames = nxt, frames + 1
        self.pos, self.frames = pos, frames
        if frames - 1 > self.limit:
            raise TraceFormatError(f"{self.path}: at least {frame_limit_message(frames - 1)}")


def _gunzip(data: bytes, path: Path, limit: int, counter: _FrameCount | None = None) -> bytes:
    """Every gzip member of ``data`` decompressed, refusing once the output passes ``limit`` bytes
    (or, with ``counter``, once it holds more node frames than the budget allows).

    Notes
    -----
    Streams in :data:`_CHUNK` steps, so a decompression bomb costs at most ``limit`` plus one
    step of memory and the time to inflate that much, never its full expansion. Running out of
    memory on the way (an address-space limit below what the budget assumes) is the same
    one-line refusal, naming the budget, not a MemoryError.
    """
    out = bytearray()
    rest = data
    try:
        while rest:
            inflater = zlib.decompressobj(wbits=31)
            pending = rest
            while pending and not inflater.eof:
                out += inflater.decompress(pending, _CHUNK)
                _check_inflated(out, path, limit, counter)
                pending = inflater.unconsumed_tail
            while not inflater.eof:  # input consumed; drain what zlib still holds
                piece = inflater.decompress(b"", _CHUNK)
                if not piece:
                    break
                out += piece
                _check_inflated(out, path, limit, counter)
            if not inflater.eof:
                raise TraceFormatError(f"{path}: truncated gzip stream (it ends before its last block)")
            rest = inflater.unused_data
            if rest and not rest.startswith(_GZIP_MAGIC):
                break  # trailing bytes after the last member are ignored, as gzip does
        return bytes(out)
    except zlib.error as exc:
        raise TraceFormatError(f"{path}: corrupt gzip stream: {exc}") from exc
    except MemoryError:
        held = len(out)
        del out
        raise TraceFormatError(
            f"{path}: ran out of memory decompressing it, at {format_bytes(held)}: this process gets "
            f"less memory than the memory budget of {format_bytes(memory_budget())} assumes (set the "
            f"environment variable {BUDGET_ENV_VAR} to what it may use)"
        ) from None


def _check_inflated(out: bytearray, path: Path, limit: int, counter: _FrameCount | None) -> None:
    if len(out) > limit:
        raise _too_big(path, "decompresses to", limit)
    if counter is not None:
        counter.feed(out)


def read_bytes(
    path: Path, *, sniff: bool = True, limit: int | None = None, max_frames: int | None = None
) -> bytes:
    """The file's bytes, gunzipped if it starts with the gzip magic.

    Parameters
    ----------
    path
        The file.
    sniff
        Reject well-known foreign formats (PNG, PDF, ...) with a clear message.
    limit
        Most bytes (after decompression) to accept; default :func:`max_decoded_bytes`.
    max_frames
        For a varint-framed (``.et``) file: most node frames to accept, counted while a gzip
        stream is inflated (a plain file's frames are counted by the decoder, before it
        allocates); None: not counted here.

    Raises
    ------
    TraceFormatError
        Unreadable, empty, foreign (with ``sniff``), a corrupt or truncated gzip stream,
        more than ``limit`` bytes (checked before reading a plain file and while
        decompressing a gzip one), more than ``max_frames`` node frames in a gzip stream,
        or memory running out while decompressing.

    Notes
    -----
    O(bytes); a gzip stream is inflated in 1 MiB steps, so memory stays within ``limit``.
    """
    limit = max_decoded_bytes() if limit is None else limit
    try:
        size = path.stat().st_size
        if size > limit:
            raise _too_big(path, f"holds {format_bytes(size)},", limit)
        data = path.read_bytes()
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if data[:2] == _GZIP_MAGIC:
        counter = None if max_frames is None else _FrameCount(path, max_frames)
        data = _gunzip(data, path, limit, counter)
    if not data:
        raise TraceFormatError(f"{path}: empty file; a trace file cannot be empty")
    for magic, what in _FOREIGN_MAGIC.items():
        if sniff and data.startswith(magic):
            raise TraceFormatError(f"{path}: not a Chakra ET file: it is {what}")
    return data


MAX_JSON_DEPTH = 200
"""Deepest nesting of JSON lists and objects read. Traces nest a few levels (a PyTorch ET's
tensor lists a few more); decoders recurse per level, so a deeper file would end in a
RecursionError or overflow the C stack (orjson's object decoder) instead of a message. The
limit sits below what every later step handles too: orjson encodes at most 254 levels (the
raw JSON kept per op), and the standard library's decoder and ``repr`` recurse within the
interpreter's limit of 1,000 frames, less the frames already on the stack."""


def check_json_depth(data: bytes, path: Path | str, limit: int = MAX_JSON_DEPTH) -> None:
    """Refuse JSON text nested deeper than ``limit`` lists and objects, before any decoder sees it.

    Raises
    ------
    TraceFormatError
        One line naming the file, the byte offset where the nesting passes ``limit`` and
        the limit.

    Notes
    -----
    A vectorised scan, no decoding (UTF-8 continuation bytes are never ASCII): a few
    passes over the bytes pick out the brackets and quotes, then O(k) over those k
    bytes: a quote after an odd run of backslashes is escaped, brackets between an
    opening and a closing quote are inside a string, and the depth is the running sum
    of the rest. A text with at most ``limit`` opening brackets is accepted after one
    pass. Under a tenth of the time orjson takes to decode the same text.
    """
    raw = np.frombuffer(data, dtype=np.uint8)
    folded = raw | 0x20  # '[' 0x5B and '{' 0x7B, ']' 0x5D and '}' 0x7D differ in bit 5 only
    opens = folded == 0x7B
    if np.count_nonzero(opens) <= limit:
        return
    events = opens | (folded == 0x7D) | (raw == 0x22)  # 0x22 | 0x20 is itself
    del folded, opens
    kind = raw[events]
    quote = kind == 0x22
    after_slash = np.flatnonzero((raw[1:] == 0x22) & (raw[:-1] == 0x5C)) + 1
    at: np.ndarray | None = None
    if after_slash.size:  # a quote after a run of backslashes is escaped when the run is odd
        at = np.flatnonzero(events)
        slashes = np.flatnonzero(raw == 0x5C)
        first = np.maximum.accumulate(
            np.where(np.r_[True, np.diff(slashes) != 1], np.arange(len(slashes)), 0)
        )
        last = np.searchsorted(slashes, after_slash - 1)
        escaped = after_slash[(last - first[last]) % 2 == 0]  # run length last - first + 1 is odd
        quote[np.searchsorted(at, escaped)] = False
    inside = (np.cumsum(quote, dtype=np.uint8) & 1).astype(bool)  # parity survives the uint8 wrap
    inside |= quote
    step = np.where((kind | 0x20) == 0x7B, 1, -1).astype(np.int8)
    step[inside] = 0
    depth = np.cumsum(step, dtype=np.int32 if len(step) < 1 << 31 else np.int64)
    deep = np.flatnonzero(depth > limit)
    if deep.size:
        at = np.flatnonzero(events) if at is None else at
        raise TraceFormatError(
            f"{path}: byte {int(at[deep[0]])}: JSON nested more than {limit:,} lists and objects deep "
            f"({int(depth.max()):,} at its deepest); no trace format etstore reads nests that deep"
        )


def load_json(path: Path, *, limit: int | None = None) -> Any:
    """Decode a JSON file (plain or gzip); truncated, invalid or too deeply nested JSON is a
    TraceFormatError (:func:`check_json_depth`: the decoder would recurse once per level).

    ``limit``: most bytes (decompressed) the file may hold; default what the budget allows a
    PyTorch execution trace (:data:`PYTORCH_ET_COST`), the costliest JSON to read per byte.
    """
    limit = PYTORCH_ET_COST.byte_limit() if limit is None else limit
    data = read_bytes(path, sniff=False, limit=limit)
    check_json_depth(data, path)
    try:
        return orjson.loads(data)  # strict JSON (no NaN), ~1.7x the standard library's speed
    except (ValueError, UnicodeDecodeError) as exc:  # orjson.JSONDecodeError is a ValueError
        raise TraceFormatError(f"{path}: not valid JSON (truncated or corrupt): {exc}") from exc


def varint(data: bytes, pos: int, path: Path) -> tuple[int, int]:
    """Decode a varint32 frame length at ``pos``; returns (value, next position).

    Raises
    ------
    TraceFormatError
        The varint runs past the end or is longer than five bytes. (A length beyond the
        rest of the file is the caller's check, with the frame's own wording.)
    """
    result = 0
    shift = 0
    start = pos
    while True:
        if pos >= len(data):
            raise TraceFormatError(f"{path}: byte {start}: truncated frame length at end of file")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 35:
            raise TraceFormatError(f"{path}: byte {start}: frame length is not a varint32")


def write_varint(value: int) -> bytes:
    """Encode a varint (frame lengths)."""
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)
