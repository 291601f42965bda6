"""NCCL tuner trajectories (CSV or JSON lines) → one row per collective call (Arrow).

A tuner (NCCL's tuner plugins, RL-based ones included) logs, for every collective it
decided, the **state** it saw (collective, message size, ranks, nodes, a topology
fingerprint, ...), the **action** it took (algorithm, protocol, channels, chunk size,
or the name of a stored algorithm trace) and the **reward** (the time the call took).
This module reads such a log, written as

- CSV: a header row naming the fields (``#`` comment lines may precede it), one row per
  call; comma- or tab-separated;
- JSON lines: one object per line; objects under ``state``, ``action``, ``obs`` or
  ``observation`` (and ``reward`` when it is an object) are merged into the row.

Field names are matched case-insensitively, with ``-`` and spaces read as ``_``;
:data:`FIELDS` lists each field and the other spellings it accepts. ``collective``,
the size and the time are required, and at least one action field; every other field
is optional. Columns the reader does not know are kept, as written, in the JSON
``extra`` column: nothing a log holds is dropped. Which bytes make such a log is
decided by content (:func:`is_tuner_log`), never by the file's name.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from etstore.collective import COLLECTIVE_NAMES, chakra_name
from etstore.errors import TraceFormatError
from etstore.formats._frames import MAX_JSON_DEPTH, TUNER_COST, check_json_depth, read_within_budget

__all__ = [
    "ACTION_FIELDS",
    "FIELDS",
    "TUNER_STEP_SCHEMA",
    "TunerLog",
    "is_tuner_log",
    "read_tuner_log",
]

TUNER_STEP_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("line", pa.int32()),
        ("collective", pa.string()),
        ("size_bytes", pa.int64()),
        ("ranks", pa.int32()),
        ("nodes", pa.int32()),
        ("topology", pa.string()),
        ("gpu_model", pa.string()),
        ("algorithm", pa.string()),
        ("protocol", pa.string()),
        ("channels", pa.int32()),
        ("chunk_bytes", pa.int64()),
        ("algorithm_trace", pa.string()),
        ("time_us", pa.float64()),
        ("busbw_gb_per_s", pa.float64()),
        ("reward", pa.float64()),
        ("extra", pa.string()),
    ]
)
"""One row per logged call: ``step`` is its 0-based position in the file, ``line`` the
1-based line it starts on; ``extra`` a JSON object of the columns not in :data:`FIELDS`."""

# field -> (value kind, the spellings accepted for it besides its own name)
FIELDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "collective": ("collective", ("coll", "collective_type", "coll_type", "func")),
    "size_bytes": ("count", ("size", "nbytes", "message_size", "msg_size", "message_bytes")),
    "ranks": ("positive", ("nranks", "n_ranks", "num_ranks", "world_size")),
    "nodes": ("positive", ("nnodes", "n_nodes", "num_nodes")),
    "topology": ("text", ("topo", "topology_fingerprint", "topo_fingerprint", "fingerprint")),
    "gpu_model": ("text", ("gpu",)),
    "algorithm": ("text", ("algo",)),
    "protocol": ("text", ("proto",)),
    "channels": ("positive", ("nchannels", "n_channels", "num_channels")),
    "chunk_bytes": ("count", ("chunk_size", "chunksize", "chunk")),
    "algorithm_trace": ("text", ("trace", "algorithm_dag")),
    "time_us": ("time", ("time", "latency_us")),
    "time_ns": ("time", ()),
    "busbw_gb_per_s": ("real", ("busbw",)),
    "reward": ("real", ()),
}
"""Every field a trajectory may carry: its kind of value and the other spellings read as it
(``time_ns`` is converted to ``time_us``)."""

ACTION_FIELDS = ("algorithm", "protocol", "channels", "chunk_bytes", "algorithm_trace")
"""The action fields; each row needs at least one of them."""

_REQUIRED = (("collective",), ("size_bytes",), ("time_us", "time_ns"))
_NESTED = ("state", "action", "obs", "observation", "reward")
_NULLS = frozenset({"", "na", "n/a", "nan", "null", "none", "-"})
_SNIFF_BYTES = 1 << 16
_INTEGER = re.compile(r"\s*[+-]?\d+\s*")
_COLLECTIVES = ", ".join(COLLECTIVE_NAMES)


def _key(name: str) -> str:
    return re.sub(r"[\s\-]+", "_", name.strip()).lower()


_SPELLINGS: dict[str, str] = {
    _key(alias): field for field, (_, aliases) in FIELDS.items() for alias in (field, *aliases)
}


@dataclass(frozen=True)
class TunerLog:
    """One parsed trajectory file.

    ``steps`` follows :data:`TUNER_STEP_SCHEMA`; ``fields`` are the file's column (CSV) or
    key (JSON lines) names in first-seen order, as written; ``format`` is ``csv`` or
    ``jsonl``; ``content_hash`` the SHA-256 of the file's bytes (hex).
    """

    source: str
    name: str
    content_hash: str
    format: str
    fields: tuple[str, ...]
    steps: pa.Table

    def run_row(self) -> dict[str, Any]:
        """The file's ``tuner_runs`` columns (without ``run_id``, ``name``, ``linked``)."""
        return {
            "source": self.source,
            "content_hash": self.content_hash,
            "format": self.format,
            "fields": json.dumps(list(self.fields)),
            "rows": self.steps.num_rows,
        }


# ---------------------------------------------------------------- recognition


def _header_fields(names: list[str]) -> set[str]:
    keys = (_key(n.strip().strip('"')) for n in names)  # a CSV header may quote its names
    return {_SPELLINGS[k] for k in keys if k in _SPELLINGS}


def _complete(fields: set[str]) -> bool:
    """The required fields and one action field are all there."""
    return all(any(f in fields for f in group) for group in _REQUIRED) and bool(fields & set(ACTION_FIELDS))


def is_tuner_log(path: str | Path) -> bool:
    """Whether ``path`` is a regular file whose content reads as a tuner trajectory.

    True when the first line that is not blank (nor, in CSV, a ``#`` comment) is a CSV
    header or a one-line JSON object naming the collective, the size, the time and one
    action field (in any spelling of :data:`FIELDS`). Never raises: unreadable or binary
    files are simply not trajectories.

    Notes
    -----
    Reads at most 64 KiB.
    """
    p = Path(path)
    try:
        if not p.is_file():
            return False
        with p.open("rb") as fh:
            head = fh.read(_SNIFF_BYTES)
    except OSError:
        return False
    if b"\x00" in head:
        return False
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
    for raw in text.splitlines():
        line = raw.strip()
        if not line or (line.startswith("#") and not line.startswith("{")):
            continue
        if line.startswith("{"):
            if _too_deep(line):
                return False
            try:
                obj = json.loads(line)
            except ValueError:
                return False
            return isinstance(obj, dict) and _complete(_header_fields(list(_flat_keys(obj))))
        return any(_complete(_header_fields(line.split(sep))) for sep in (",", "\t"))
    return False


def _too_deep(line: str) -> bool:
    """Whether a JSON line nests more than :data:`~etstore.formats._frames.MAX_JSON_DEPTH` deep.

    Why: the standard decoder recurses once per level, and a line nested a little less than
    the interpreter's recursion limit decodes here but breaks whatever walks it next
    (encoding its ``extra`` column), so depth is checked before decoding, as every JSON
    reader does.
    """
    if line.count("[") + line.count("{") <= MAX_JSON_DEPTH:
        return False
    try:
        check_json_depth(line.encode(), "line")
    except TraceFormatError:
        return True
    return False


def _flat_keys(obj: Mapping[str, Any]) -> Iterator[str]:
    for k, v in obj.items():
        if k in _NESTED and isinstance(v, dict):
            yield from (str(x) for x in v)
        else:
            yield str(k)


# ---------------------------------------------------------------- reading


def read_tuner_log(path: str | Path, *, name: str | None = None) -> TunerLog:
    """Parse one tuner trajectory file (CSV or JSON lines, told apart by content).

    Parameters
    ----------
    path
        The file.
    name
        The run's name (default: the file name without its extension).

    Returns
    -------
    TunerLog
        One row per logged call in ``steps`` (:data:`TUNER_STEP_SCHEMA`): the collective
        under its Chakra name (``ALL_REDUCE``; NCCL's ``ncclFuncAllReduce`` and every
        spelling etstore accepts are read), sizes in bytes, times in µs.

    Raises
    ------
    TraceFormatError
        The file cannot be read or is not UTF-8; a CSV header lacks a required field or
        names one field twice; a row has another number of cells than the header, a
        JSON line is not an object, a required field is empty, no action field has a
        value, a value is not of its field's kind (an unknown collective, a negative
        size, ``channels`` of 0, ...); the file has no rows. The message starts with
        ``file:line`` and names the field.

    Notes
    -----
    O(rows × fields), one pass in Python over the rows (a trajectory holds one row per
    tuned call, far fewer than a trace's ops).
    """
    p = Path(path)
    try:
        data = read_within_budget(p, TUNER_COST)
    except OSError as exc:
        raise TraceFormatError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    try:
        text = data.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"{p}: byte {exc.start}: not UTF-8 text") from exc
    first = next((s.strip() for s in text.splitlines() if s.strip()), "")
    fmt = "jsonl" if first.startswith("{") else "csv"
    rows = _Rows(str(p))
    fields = _read_jsonl(text, rows) if fmt == "jsonl" else _read_csv(text, rows)
    if not rows.line:
        raise TraceFormatError(f"{p}: no rows; a tuner trajectory needs one row per collective call")
    return TunerLog(
        source=str(p),
        name=name or p.stem,
        content_hash=hashlib.sha256(data).hexdigest(),
        format=fmt,
        fields=tuple(fields),
        steps=rows.table(),
    )


class _Rows:
    """The rows read so far, column by column, and the checks each value passes."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.columns: dict[str, list[Any]] = {f.name: [] for f in TUNER_STEP_SCHEMA}
        self.line: list[int] = []

    def add(self, line: int, values: Mapping[str, Any], extra: Mapping[str, Any]) -> None:
        """Check one row's known fields (by field name) and append it."""
        row = {f: self._value(line, f, values.get(f)) for f in FIELDS}
        for group in _REQUIRED:
            if all(row[f] is None for f in group):
                raise TraceFormatError(f"{self.source}:{line}: field {group[0]!r} is empty; it is required")
        if all(row[f] is None for f in ACTION_FIELDS):
            raise TraceFormatError(
                f"{self.source}:{line}: no action: one of the fields {', '.join(ACTION_FIELDS)} needs a value"
            )
        if row["time_us"] is None:
            row["time_us"] = row["time_ns"] / 1e3
        row["step"] = len(self.line)
        row["line"] = line
        row["extra"] = json.dumps(dict(extra)) if extra else None
        for col, out in self.columns.items():
            out.append(row[col])
        self.line.append(line)

    def table(self) -> pa.Table:
        return pa.table(
            {f.name: pa.array(self.columns[f.name], f.type) for f in TUNER_STEP_SCHEMA},
            schema=TUNER_STEP_SCHEMA,
        )

    def _value(self, line: int, field: str, raw: Any) -> Any:
        """``raw`` as the field's kind; None for an empty cell or a JSON null."""
        if raw is None or (isinstance(raw, str) and raw.strip().lower() in _NULLS):
            return None
        kind = FIELDS[field][0]
        where = f"{self.source}:{line}: field {field!r}"
        if kind == "text":
            return raw.strip() if isinstance(raw, str) else json.dumps(raw)
        if kind == "collective":
            text = str(raw).strip()
            chakra = chakra_name(text.removeprefix("ncclFunc"))
            if chakra is None:
                raise TraceFormatError(
                    f"{where}: collective {text!r} is unknown; expected one of {_COLLECTIVES}"
                )
            return chakra
        number = _number(raw)
        if number is not None and isinstance(raw, int) and not math.isfinite(number):  # past floats
            raise TraceFormatError(f"{where}: {_shown(raw)} is out of range")
        if number is None or not math.isfinite(number):
            raise TraceFormatError(f"{where}: {_shown(raw)} is not a number")
        if kind in ("count", "positive"):
            least = 1 if kind == "positive" else 0
            if number != int(number) or number < least or number >= 2**63:
                what = "a positive integer" if least else "a non-negative integer"
                raise TraceFormatError(f"{where}: expected {what}, got {_shown(raw)}")
            if field in ("ranks", "nodes", "channels") and number >= 2**31:
                raise TraceFormatError(f"{where}: {_shown(raw)} is out of range (below 2^31 expected)")
            # exact above 2^53 too: an integer as written, not its float
            return raw if isinstance(raw, int) else int(raw) if _INTEGER.fullmatch(str(raw)) else int(number)
        if kind == "time" and number < 0:
            raise TraceFormatError(f"{where}: expected a time of at least 0, got {_shown(raw)}")
        return float(number)


def _shown(raw: Any) -> str:
    """``raw`` for a message: its repr, cut to 60 characters (a value may be thousands of digits)."""
    text = repr(raw)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _number(raw: Any) -> float | None:
    """A JSON number or numeric text as a float (±inf past the float range); None for anything
    else (booleans too)."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int | float):
        try:
            return float(raw)
        except OverflowError:  # an integer past the float range
            return math.inf if raw > 0 else -math.inf
    if isinstance(raw, str):
        try:
            return float(raw.strip())
        except ValueError:
            return None
    return None


def _columns(source: str, line: int, names: list[str]) -> list[str | None]:
    """The field each column or key gives (None: an extra), refusing one field given twice."""
    seen: dict[str, str] = {}
    out: list[str | None] = []
    for name in names:
        field = _SPELLINGS.get(_key(name))
        if field is not None and field in seen:
            raise TraceFormatError(
                f"{source}:{line}: {seen[field]!r} and {name!r} both give field {field!r}; keep one"
            )
        if field is not None:
            seen[field] = name
        out.append(field)
    if "time_us" in seen and "time_ns" in seen:  # the µs column is the time; the other one an extra
        out[names.index(seen["time_ns"])] = None
    return out


def _read_csv(text: str, rows: _Rows) -> list[str]:
    """Read a CSV trajectory into ``rows``; returns the header's names."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, s in enumerate(lines) if s.strip() and not s.lstrip().startswith("#")), len(lines))
    if start == len(lines):
        return []
    header_line = lines[start]
    sep = max((",", "\t"), key=lambda s: len(_header_fields(header_line.split(s))))
    reader = csv.reader(io.StringIO("".join(lines[start:])), delimiter=sep)
    names = [n.strip() for n in next(reader)]
    fields = _columns(rows.source, start + 1, names)
    have = {f for f in fields if f is not None}
    for group in _REQUIRED:
        if not any(f in have for f in group):
            raise TraceFormatError(
                f"{rows.source}:{start + 1}: the header has no {group[0]!r} column; a trajectory needs "
                "collective, size_bytes and time_us (see docs/measured.md)"
            )
    if not have & set(ACTION_FIELDS):
        raise TraceFormatError(
            f"{rows.source}:{start + 1}: the header has no action column (one of {', '.join(ACTION_FIELDS)})"
        )
    done = 1  # lines the reader has consumed: the header
    try:
        for cells in reader:
            line = start + done + 1
            done = reader.line_num
            if not cells or (len(cells) == 1 and not cells[0].strip()) or cells[0].lstrip().startswith("#"):
                continue
            if len(cells) != len(names):
                raise TraceFormatError(
                    f"{rows.source}:{line}: {len(cells)} cells; "
                    f"the header on line {start + 1} has {len(names)}"
                )
            values = {f: c for f, c in zip(fields, cells, strict=True) if f is not None}
            extra = {n: c for n, f, c in zip(names, fields, cells, strict=True) if f is None}
            rows.add(line, values, extra)
    except csv.Error as exc:
        raise TraceFormatError(f"{rows.source}:{start + reader.line_num}: not CSV: {exc}") from exc
    return names


def _read_jsonl(text: str, rows: _Rows) -> list[str]:
    """Read a JSON-lines trajectory into ``rows``; returns the keys in first-seen order."""
    keys: dict[str, None] = {}
    for i, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        if _too_deep(raw):
            raise TraceFormatError(
                f"{rows.source}:{i}: not a JSON object (nested more than {MAX_JSON_DEPTH} "
                "lists and objects deep)"
            )
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            raise TraceFormatError(f"{rows.source}:{i}: not a JSON object ({exc})") from exc
        if not isinstance(obj, dict):
            raise TraceFormatError(
                f"{rows.source}:{i}: expected one JSON object per line, got {type(obj).__name__}"
            )
        flat: dict[str, Any] = {}
        for k, v in obj.items():
            parts = v.items() if k in _NESTED and isinstance(v, dict) else [(k, v)]
            for name, value in parts:
                if name in flat:
                    raise TraceFormatError(f"{rows.source}:{i}: key {name!r} appears twice in the row")
                flat[str(name)] = value
        names = list(flat)
        keys.update(dict.fromkeys(names))
        fields = _columns(rows.source, i, names)
        values = {f: flat[n] for n, f in zip(names, fields, strict=True) if f is not None}
        extra = {n: flat[n] for n, f in zip(names, fields, strict=True) if f is None}
        rows.add(i, values, extra)
    return list(keys)
