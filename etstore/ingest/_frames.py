"""Varint-framed protobuf streams: open (gzip-sniffed), validate and split into frames."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from etstore.errors import TraceFormatError

__all__ = ["read_bytes", "varint", "write_varint"]

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


def read_bytes(path: Path, *, sniff: bool = True) -> bytes:
    """The file's bytes, gunzipped if it starts with the gzip magic; ``sniff`` rejects
    well-known foreign formats (PNG, PDF, ...) with a clear message."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if data[:2] == _GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(f"{path}: corrupt or truncated gzip stream: {exc}") from exc
    if not data:
        raise TraceFormatError(f"{path}: empty file; a trace file cannot be empty")
    for magic, what in _FOREIGN_MAGIC.items():
        if sniff and data.startswith(magic):
            raise TraceFormatError(f"{path}: not a Chakra ET file: it is {what}")
    return data


def varint(data: bytes, pos: int, path: Path) -> tuple[int, int]:
    """Decode a varint32 frame length at ``pos``; returns (value, next position)."""
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
