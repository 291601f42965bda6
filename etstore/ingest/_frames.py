"""Varint-framed protobuf streams: open (gzip-sniffed, decompressed within a budget), validate and
split into frames, and the upfront limits on what one file may make us hold in memory. JSON files
are opened the same way (:func:`load_json`), here rather than beside the PyTorch readers so that
recognising a file's format does not load them."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from etstore.errors import TraceFormatError
from etstore.units import BUDGET_ENV_VAR, format_bytes, memory_budget

__all__ = [
    "BYTES_PER_NODE",
    "DECODED_BYTES_FACTOR",
    "MAX_JSON_DEPTH",
    "check_json_depth",
    "frame_limit_message",
    "load_json",
    "max_decoded_bytes",
    "max_nodes",
    "read_bytes",
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


def _too_big(path: Path, what: str, limit: int) -> TraceFormatError:
    return TraceFormatError(
        f"{path}: {what} more than {format_bytes(limit)}, the most one file may take of the memory "
        f"budget of {format_bytes(memory_budget())} (set the environment variable {BUDGET_ENV_VAR} "
        "to raise it)"
    )


def _gunzip(data: bytes, path: Path, limit: int) -> bytes:
    """Every gzip member of ``data`` decompressed, refusing once the output passes ``limit`` bytes.

    Notes
    -----
    Streams in :data:`_CHUNK` steps, so a decompression bomb costs at most ``limit`` plus one
    step of memory and the time to inflate that much, never its full expansion.
    """
    out = bytearray()
    rest = data
    try:
        while rest:
            inflater = zlib.decompressobj(wbits=31)
            pending = rest
            while pending and not inflater.eof:
                out += inflater.decompress(pending, _CHUNK)
                if len(out) > limit:
                    raise _too_big(path, "decompresses to", limit)
                pending = inflater.unconsumed_tail
            while not inflater.eof:  # input consumed; drain what zlib still holds
                piece = inflater.decompress(b"", _CHUNK)
                if not piece:
                    break
                out += piece
                if len(out) > limit:
                    raise _too_big(path, "decompresses to", limit)
            if not inflater.eof:
                raise TraceFormatError(f"{path}: truncated gzip stream (it ends before its last block)")
            rest = inflater.unused_data
            if rest and not rest.startswith(_GZIP_MAGIC):
                break  # trailing bytes after the last member are ignored, as gzip does
    except zlib.error as exc:
        raise TraceFormatError(f"{path}: corrupt gzip stream: {exc}") from exc
    return bytes(out)


def read_bytes(path: Path, *, sniff: bool = True, limit: int | None = None) -> bytes:
    """The file's bytes, gunzipped if it starts with the gzip magic.

    Parameters
    ----------
    path
        The file.
    sniff
        Reject well-known foreign formats (PNG, PDF, ...) with a clear message.
    limit
        Most bytes (after decompression) to accept; default :func:`max_decoded_bytes`.

    Raises
    ------
    TraceFormatError
        Unreadable, empty, foreign (with ``sniff``), a corrupt or truncated gzip stream,
        or more than ``limit`` bytes (checked before reading a plain file and while
        decompressing a gzip one).

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
        data = _gunzip(data, path, limit)
    if not data:
        raise TraceFormatError(f"{path}: empty file; a trace file cannot be empty")
    for magic, what in _FOREIGN_MAGIC.items():
        if sniff and data.startswith(magic):
            raise TraceFormatError(f"{path}: not a Chakra ET file: it is {what}")
    return data


MAX_JSON_DEPTH = 1000
"""Deepest nesting of JSON lists and objects read. Traces nest a few levels (a PyTorch ET's
tensor lists a few more); decoders recurse per level, so a deeper file would end in a
RecursionError or overflow the C stack (orjson's object decoder) instead of a message."""


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


def load_json(path: Path) -> Any:
    """Decode a JSON file (plain or gzip); truncated, invalid or too deeply nested JSON is a
    TraceFormatError (:func:`check_json_depth`: the decoder would recurse once per level)."""
    data = read_bytes(path, sniff=False)
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
