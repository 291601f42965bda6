"""nccl-tests and rccl-tests output logs → measured collective timings (Arrow).

A log is what ``all_reduce_perf`` (or any ``*_perf`` binary of NVIDIA nccl-tests or ROCm
rccl-tests) prints: a ``# nThread … nGpus …`` header, one ``# Rank … on HOST device D
[BUS] MODEL`` line per rank, a column header (``# size count type redop root time algbw
busbw #wrong …``) over an out-of-place and an in-place group of columns, one row per
message size and a ``# Avg bus bandwidth`` footer. Real logs carry more and less than
that; the reader keeps what it recognises and skips the rest:

- NCCL ``INFO``/``WARN`` lines (of which ``NCCL_ALGO``/``NCCL_PROTO set by environment to
  …``, or ``NCCL_ALGO=…`` lines, and ``N coll channels`` are kept in the header as
  ``nccl_env`` and ``nccl_coll_channels``: what a run forced NCCL to use), UCX
  warnings, ``NCCL version`` / ``RCCL version : …`` / ``rccl-tests: Version …`` lines
  and Open MPI's ``[1,0]<stdout>:`` line tags;
- a Markdown heading, prose, code fences or the launch command before the log (the
  binary named in the command, or in ``# Collective test starting:``, names the
  collective);
- older layouts: an ``error`` column instead of ``#wrong``, no ``redop`` or ``root``
  column, device lines without ``Group``; ``N/A`` cells (validation off);
- no header, no device lines, no footer (``ranks``, ``nodes`` and ``gpu_model`` are then
  unknown: null).

A line that looks like a table row (two integers and a type name) but does not fit the
column header above it is an error naming the file and line. Bandwidths stay as the
tool prints them: GB/s with **GB = 10^9 bytes** (nccl-tests divides bytes per second by
1.0E9), the unit of the simulator's tables too.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from etstore.collective import chakra_name
from etstore.errors import TraceFormatError
from etstore.formats._frames import NCCL_TESTS_COST, read_within_budget
from etstore.formats._guard import values_in_range

__all__ = [
    "DEVICE_SCHEMA",
    "DTYPE_BYTES",
    "MEASUREMENT_SCHEMA",
    "NcclTestsLog",
    "is_nccl_tests_log",
    "read_nccl_tests",
]

MEASUREMENT_SCHEMA = pa.schema(
    [
        ("size_bytes", pa.int64()),
        ("count", pa.int64()),
        ("dtype", pa.string()),
        ("redop", pa.string()),
        ("root", pa.int32()),
        ("in_place", pa.bool_()),
        ("time_us", pa.float64()),
        ("algbw_gb_per_s", pa.float64()),
        ("busbw_gb_per_s", pa.float64()),
        ("errors", pa.float64()),
        ("line", pa.int32()),
    ]
)
"""One row per table row and placement (out-of-place, in-place); ``line`` is 1-based."""

DEVICE_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("host", pa.string()),
        ("device", pa.int32()),
        ("bus_id", pa.string()),
        ("gpu_model", pa.string()),
    ]
)
"""One row per ``# Rank …`` line (the first one of a rank when a log repeats them)."""

DTYPE_BYTES: dict[str, int] = {
    "int8": 1,
    "uint8": 1,
    "char": 1,
    "f8e4m3": 1,
    "f8e5m2": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "half": 2,
    "bfloat16": 2,
    "int32": 4,
    "uint32": 4,
    "int": 4,
    "float": 4,
    "int64": 8,
    "uint64": 8,
    "double": 8,
}
"""Bytes per element of the type names nccl-tests and rccl-tests print."""

_SNIFF_BYTES = 1 << 20
_PREFIX = re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err)>:|\s*\d+:\s)")
_HEADER = re.compile(r"#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)(.*)$")
_HEADER_FIELDS = {
    "min_bytes": re.compile(r"minBytes\s+(\d+)"),
    "max_bytes": re.compile(r"maxBytes\s+(\d+)"),
    "warmup_iters": re.compile(r"warmup iters:\s*(\d+)"),
    "iters": re.compile(r"(?<!warmup )(?<!agg )iters:\s*(\d+)"),
    "agg_iters": re.compile(r"agg iters:\s*(\d+)"),
    "validation": re.compile(r"validation:\s*(\d+)"),
    "graph": re.compile(r"graph:\s*(\d+)"),
}
_STEP = re.compile(r"step:\s*(\d+)\((factor|bytes)\)")
_DEVICE = re.compile(
    r"^#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)\s+\[([^\]]*)\]\s*(.*?)\s*$"
)
_COLUMNS = re.compile(r"^#\s*size\s+count\s+type\b(.*)$")
_PLACEMENT = re.compile(r"^#\s*(out-of-place)?\s*(in-place)?\s*$")
_ROW = re.compile(r"^\s*\d+\s+\d+\s+[A-Za-z_]")
_FOOTER_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_FOOTER_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)")
# NCCL's own choice, when the run forced it: NCCL_DEBUG=INFO prints "NCCL_ALGO set by environment to
# Ring" (src/graph/tuning.cc), a launch script may echo NCCL_ALGO=Ring; and "24 coll channels" (init.cc)
_NCCL_ENV = re.compile(r"\b(NCCL_ALGO|NCCL_PROTO)(?:\s+set by environment to\s+|=)[\"']?([^\s\"']+)")
_COLL_CHANNELS = re.compile(r"NCCL INFO (\d+) coll channels\b")
_TOOL = re.compile(r"^#\s*(nccl|rccl)-tests version\s+(\S+)")
_RCCL_TESTS = re.compile(r"^rccl-tests:\s*Version\s*(.*?)\s*$")
_LIBRARY = re.compile(r"(?:^|\s)(NCCL|RCCL) version\s*:?\s*(\d[^\s]*)")
_LIBRARY_CODE = re.compile(r"\b(nccl|rccl)-library=(\d+)")
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_BINARY = re.compile(r"\b([a-z][a-z0-9_]*?)_perf(?:_mpi)?\b")
_PREFIX_COLUMNS = ("size", "count", "type", "redop", "root")
_GROUP = ("time", "algbw", "busbw")


@dataclass(frozen=True)
class NcclTestsLog:
    """One parsed nccl-tests / rccl-tests log (see the module docstring).

    ``measurements`` has :data:`MEASUREMENT_SCHEMA` columns, ``devices``
    :data:`DEVICE_SCHEMA`. ``collective`` is a Chakra name (``ALL_REDUCE``) or None
    when neither the binary's name nor the table's columns tell. ``errors_kind`` says
    what ``measurements.errors`` holds: ``"wrong"`` (count of wrong elements, the
    ``#wrong`` column) or ``"error"`` (largest error, older versions' ``error`` column).
    """

    source: str
    name: str
    content_hash: str
    measurements: pa.Table
    devices: pa.Table
    tool: str = "nccl-tests"
    tool_version: str | None = None
    library_version: str | None = None
    benchmark: str | None = None
    collective: str | None = None
    ranks: int | None = None
    nodes: int | None = None
    gpu_model: str | None = None
    errors_kind: str = "wrong"
    avg_busbw_gb_per_s: float | None = None
    out_of_bounds: int | None = None
    header: dict[str, Any] = field(default_factory=dict)

    def run_row(self) -> dict[str, Any]:
        """The log's ``measured_runs`` row (without ``run_id`` and ``created_at``)."""
        return {
            "name": self.name,
            "source": self.source,
            "content_hash": self.content_hash,
            "tool": self.tool,
            "tool_version": self.tool_version,
            "library_version": self.library_version,
            "benchmark": self.benchmark,
            "collective": self.collective,
            "ranks": self.ranks,
            "nodes": self.nodes,
            "gpu_model": self.gpu_model,
            "hosts": ",".join(sorted(set(self.devices["host"].to_pylist()))) or None,
            "rows": self.measurements.num_rows,
            "errors_kind": self.errors_kind,
            "avg_busbw_gb_per_s": self.avg_busbw_gb_per_s,
            "out_of_bounds": self.out_of_bounds,
            "header": json.dumps(self.header, sort_keys=True),
        }


def is_nccl_tests_log(path: str | Path) -> bool:
    """Whether ``path`` is a regular file whose first MiB reads as nccl-tests output.

    True when a ``# nThread … nGpus …`` header or a ``# size count type …`` column
    header appears (after removing Open MPI line tags). Never raises for unreadable or
    binary files: they are simply not logs.

    Notes
    -----
    Reads at most 1 MiB.
    """
    p = Path(path)
    try:
        if not p.is_file():
            return False
        with p.open("rb") as fh:
            head = fh.read(_SNIFF_BYTES)
    except OSError:
        return False
    if b"\x00" in head[:4096]:
        return False
    for raw in head.decode("utf-8", errors="replace").splitlines():
        line = _PREFIX.sub("", raw, count=1).strip()
        if _HEADER.match(line) or _COLUMNS.match(line):
            return True
    return False


def read_nccl_tests(
    path: str | Path, *, name: str | None = None, collective: str | None = None
) -> NcclTestsLog:
    """Parse one nccl-tests or rccl-tests log.

    Parameters
    ----------
    path
        The log file (plain text, any line ends; a Markdown page with the log in it works).
    name
        The run's name (default: the file name without its extension).
    collective
        The collective, in any spelling (``all_reduce``, ``ALL_REDUCE``, ``ar``); default:
        from the binary's name in the log, else from the table's columns, else None.

    Returns
    -------
    NcclTestsLog

    Raises
    ------
    TraceFormatError
        The file cannot be read or is not UTF-8 text; it holds no column header or no
        table row; a row does not fit the column header above it (wrong number of
        cells, a cell that is not a number); a second run starts after the first one's
        rows; ``collective`` is not a collective name. The message names the file and,
        for a bad line, its number.

    Notes
    -----
    O(lines of the log), one pass.
    """
    src = Path(path)
    try:
        data = read_within_budget(src, NCCL_TESTS_COST)
    except OSError as exc:
        raise TraceFormatError(f"{src}: cannot read the log: {exc.strerror or exc}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"{src}: not a text log (byte {exc.start} is not UTF-8)") from None
    forced = None
    if collective is not None:
        forced = chakra_name(collective)
        if forced is None:
            raise TraceFormatError(f"{src}: {collective!r} is not a collective name (e.g. all_reduce)")
    scan = _Scan(str(src))
    with values_in_range(src):
        for number, raw in enumerate(text.splitlines(), start=1):
            try:
                scan.line(number, _PREFIX.sub("", raw, count=1).rstrip())
            except ValueError as exc:  # int() of more digits than Python converts (4,300)
                if "integer string conversion" not in str(exc):
                    raise
                raise TraceFormatError(f"{src}:{number}: a number of more digits than a count has") from None
        return scan.finish(name or _stem(src), hashlib.sha256(data).hexdigest(), forced)


def _stem(path: Path) -> str:
    """The file name without its last extension (``log.txt`` → ``log``)."""
    return path.name.rsplit(".", 1)[0] if "." in path.name.strip(".") else path.name


class _Scan:
    """The reader's state while it walks the lines of one log."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.tool = "nccl-tests"
        self.tool_version: str | None = None
        self.library_version: str | None = None
        self.binary: str | None = None
        self.header: dict[str, Any] = {}
        self.devices: dict[int, tuple[str, int, str, str]] = {}
        self.columns: tuple[str, ...] | None = None
        self.groups: tuple[bool, ...] = ()  # in_place flag of each column group, in order
        self.errors_kind = "wrong"
        self.placement: tuple[bool, bool] = (True, True)
        self.rows: dict[str, list[Any]] = {f.name: [] for f in MEASUREMENT_SCHEMA}
        self.avg: float | None = None
        self.oob: int | None = None
        self.nccl_env: dict[str, str] = {}
        self.coll_channels: int | None = None

    # ------------------------------------------------------------ one line

    def line(self, number: int, line: str) -> None:
        """Take one line (its tag removed): a header, device, column, row or footer line."""
        text = line.strip()
        if not text:
            return
        if "NCCL" in text:
            for key, value in _NCCL_ENV.findall(text):
                self.nccl_env.setdefault(key, value)
            if self.coll_channels is None and (m := _COLL_CHANNELS.search(text)):
                self.coll_channels = int(m[1])
        if text.startswith("#"):
            self._comment(number, text)
        elif _ROW.match(text) and self.columns is not None:
            self._row(number, text)
        elif _ROW.match(text):
            raise TraceFormatError(
                f"{self.source}:{number}: a table row before any column header "
                "(expected '# size count type ...' above the rows)"
            )
        else:
            self._other(text)

    def _comment(self, number: int, text: str) -> None:
        if m := _HEADER.match(text):
            if self.rows["line"]:
                raise TraceFormatError(
                    f"{self.source}:{number}: a second run starts after the first one's rows "
                    "(one log per file: split it)"
                )
            self.header = _header_fields(int(m[1]), int(m[2]), m[3])
        elif m := _DEVICE.match(text):
            rank = int(m[1])
            self.devices.setdefault(rank, (m[2], int(m[3]), m[4], m[5]))
        elif m := _COLUMNS.match(text):
            self._columns(number, m[1])
        elif m := _PLACEMENT.match(text):
            if m[1] or m[2]:
                self.placement = (bool(m[1]), bool(m[2]))
        elif m := _FOOTER_AVG.match(text):
            self.avg = _number(m[1])
        elif m := _FOOTER_OOB.match(text):
            self.oob = int(m[1])
        elif m := _TOOL.match(text):
            self.tool, self.tool_version = f"{m[1]}-tests", m[2]
            if self.library_version is None and (code := _LIBRARY_CODE.search(text)):
                self.library_version = _version_of_code(code[1].upper(), int(code[2]))
        elif m := _STARTING.match(text):
            self.binary = _binary(m[1]) or self.binary
        elif self.binary is None and (b := _binary(text)):
            self.binary = b

    def _other(self, text: str) -> None:
        if m := _RCCL_TESTS.match(text):
            self.tool = "rccl-tests"
            self.tool_version = m[1] or None
            return
        if self.library_version is None and (m := _LIBRARY.search(text)):
            self.library_version = f"{m[1]} {m[2]}"
            return
        if self.binary is None and self.columns is None and (b := _binary(text)):
            self.binary = b

    # ------------------------------------------------------------ the table

    def _columns(self, number: int, rest: str) -> None:
        """Read the column header: the prefix columns, then one group per placement."""
        tokens = rest.split()
        prefix = ["size", "count", "type"]
        while tokens and tokens[0] in ("redop", "root"):
            prefix.append(tokens.pop(0))
        groups: list[str] = []
        while len(tokens) >= 4 and tuple(tokens[:3]) == _GROUP and tokens[3] in ("#wrong", "wrong", "error"):
            groups.append(tokens[3])
            tokens = tokens[4:]
        if tokens or not groups or len(groups) > 2:
            raise TraceFormatError(
                f"{self.source}:{number}: unknown column header (expected 'size count type [redop] [root]' "
                "then one or two groups of 'time algbw busbw #wrong|error')"
            )
        if self.rows["line"] and self.columns is not None and tuple(prefix) != self.columns:
            raise TraceFormatError(f"{self.source}:{number}: the column header changes after the first rows")
        self.columns = tuple(prefix)
        self.errors_kind = "error" if groups[0] == "error" else "wrong"
        if len(groups) == 2:
            self.groups = (False, True)
        else:
            only_in_place = self.placement == (False, True)
            self.groups = (only_in_place,)

    def _row(self, number: int, text: str) -> None:
        """One table row: its prefix cells, then time, algbw, busbw and errors per group."""
        assert self.columns is not None
        cells = text.split()
        want = len(self.columns) + 4 * len(self.groups)
        if len(cells) != want:
            raise TraceFormatError(
                f"{self.source}:{number}: {len(cells)} cells in a table row; the column header above "
                f"it has {want} ({' '.join(self.columns)} then {len(self.groups)} x time algbw busbw errors)"
            )
        values = dict(zip(self.columns, cells, strict=False))
        size = _integer(values["size"], self.source, number, "size")
        count = _integer(values["count"], self.source, number, "count")
        root = values.get("root")
        k = len(self.columns)
        for g, in_place in enumerate(self.groups):
            time_us, algbw, busbw, errors = (
                _cell(cells[k + 4 * g + j], self.source, number, name)
                for j, name in enumerate(("time", "algbw", "busbw", "errors"))
            )
            for key, value in (
                ("size_bytes", size),
                ("count", count),
                ("dtype", values["type"]),
                ("redop", values.get("redop")),
                ("root", None if root is None else _integer(root, self.source, number, "root", signed=True)),
                ("in_place", in_place),
                ("time_us", time_us),
                ("algbw_gb_per_s", algbw),
                ("busbw_gb_per_s", busbw),
                ("errors", errors),
                ("line", number),
            ):
                self.rows[key].append(value)

    # ------------------------------------------------------------ the result

    def finish(self, name: str, digest: str, forced: str | None) -> NcclTestsLog:
        """The parsed log, once every line has been read."""
        if self.columns is None:
            raise TraceFormatError(
                f"{self.source}: no nccl-tests column header (expected a line '# size count type ...')"
            )
        measurements = pa.Table.from_pydict(self.rows, schema=MEASUREMENT_SCHEMA)
        if measurements.num_rows == 0:
            raise TraceFormatError(f"{self.source}: a column header but no table rows under it")
        ranks_known = sorted(self.devices)
        devices = pa.Table.from_pydict(
            {
                "rank": ranks_known,
                "host": [self.devices[r][0] for r in ranks_known],
                "device": [self.devices[r][1] for r in ranks_known],
                "bus_id": [self.devices[r][2] for r in ranks_known],
                "gpu_model": [self.devices[r][3] or None for r in ranks_known],
            },
            schema=DEVICE_SCHEMA,
        )
        ranks = ranks_known[-1] + 1 if ranks_known else None
        hosts = {self.devices[r][0] for r in ranks_known}
        models = Counter(m for m in devices["gpu_model"].to_pylist() if m)
        collective = forced or _collective_of_binary(self.binary) or _inferred(self.rows, ranks)
        return NcclTestsLog(
            source=self.source,
            name=name,
            content_hash=digest,
            measurements=measurements,
            devices=devices,
            tool=self.tool,
            tool_version=self.tool_version,
            library_version=self.library_version,
            benchmark=self.binary,
            collective=collective,
            ranks=ranks,
            nodes=len(hosts) if hosts else None,
            gpu_model=" + ".join(sorted(models)) if models else None,
            errors_kind=self.errors_kind,
            avg_busbw_gb_per_s=self.avg,
            out_of_bounds=self.oob,
            header=self._header(),
        )

    def _header(self) -> dict[str, Any]:
        """The header's fields, plus what NCCL's own lines said of its choice (``nccl_env``: the
        ``NCCL_ALGO``/``NCCL_PROTO`` a run forced; ``nccl_coll_channels``) when they said anything."""
        out = dict(self.header)
        if self.nccl_env:
            out["nccl_env"] = dict(self.nccl_env)
        if self.coll_channels is not None:
            out["nccl_coll_channels"] = self.coll_channels
        return out


def _header_fields(n_threads: int, n_gpus: int, rest: str) -> dict[str, Any]:
    """The ``# nThread`` line's values under snake_case names."""
    out: dict[str, Any] = {"n_threads": n_threads, "gpus_per_thread": n_gpus}
    for key, rx in _HEADER_FIELDS.items():
        if m := rx.search(rest):
            out[key] = int(m[1])
    if m := _STEP.search(rest):
        out["step"] = int(m[1])
        out["step_kind"] = m[2]
    return out


def _version_of_code(library: str, code: int) -> str:
    """``NCCL 2.29.7`` for ``NCCL_VERSION_CODE`` 22907 (major x 10000 + minor x 100 + patch, NCCL >= 2.9)."""
    return f"{library} {code // 10000}.{code // 100 % 100}.{code % 100}"


def _binary(text: str) -> str | None:
    """The first ``<name>_perf`` binary named in ``text`` (``all_reduce_perf``), or None."""
    m = _BINARY.search(text)
    return f"{m[1]}_perf" if m else None


def _collective_of_binary(binary: str | None) -> str | None:
    """The Chakra collective a ``*_perf`` binary measures (``all_reduce_perf`` → ``ALL_REDUCE``)."""
    if binary is None:
        return None
    base = binary.removesuffix("_perf")
    return chakra_name(base) or base.upper()


def _inferred(rows: dict[str, list[Any]], ranks: int | None) -> str | None:
    """The collective the columns imply, from the first non-empty row; None when ambiguous.

    A reduction with ``count`` × element size = size is ALL_REDUCE (REDUCE with a root);
    one whose count covers a rank's share is REDUCE_SCATTER; no reduction and a full
    count with a root is BROADCAST. All-gather, all-to-all, gather and scatter print
    the same columns, so they stay unknown.
    """
    for size, count, dtype, redop, root in zip(
        rows["size_bytes"], rows["count"], rows["dtype"], rows["redop"], rows["root"], strict=True
    ):
        width = DTYPE_BYTES.get(dtype)
        if not count or width is None:
            continue
        full = count * width == size
        reduces = redop is not None and redop != "none"
        rooted = root is not None and root >= 0
        if reduces and full:
            return "REDUCE" if rooted else "ALL_REDUCE"
        if reduces and ranks and count * width * ranks == size and not rooted:
            return "REDUCE_SCATTER"
        if not reduces and rooted and full:
            return "BROADCAST"
        return None
    return None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _integer(text: str, source: str, number: int, what: str, *, signed: bool = False) -> int:
    """``text`` as an integer cell, or an error naming the line and column."""
    ok = re.fullmatch(r"-?\d+" if signed else r"\d+", text)
    if not ok:
        shown = text if len(text) <= 40 else f"{text[:37]}..."
        raise TraceFormatError(f"{source}:{number}: column {what} is {shown!r}, expected an integer")
    return int(text)


def _cell(text: str, source: str, number: int, what: str) -> float | None:
    """A time, bandwidth or error cell: a number, or None for ``N/A``; a ``*`` mark is dropped."""
    if text in ("N/A", "n/a", "-"):
        return None
    value = _number(text.rstrip("*"))
    if value is None:
        raise TraceFormatError(f"{source}:{number}: column {what} is {text!r}, expected a number or N/A")
    return value
