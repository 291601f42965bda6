"""NCCL's example tuner plugin config: written, and read back by the plugin's own rules.

NCCL's example tuner plugin (NVIDIA/nccl ``plugins/tuner/example/plugin.c``, once
``ext-tuner/example``) reads a CSV file (``NCCL_TUNER_CONFIG_FILE``, default
``nccl_tuner.conf``) of lines
``collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]``
and, for each collective call, applies the first line that matches it. The plugin never
reports a bad line: an unknown collective is read as ``allreduce``, an unknown algorithm as
``ring``, an unknown protocol as ``simple``, a line of fewer than 8 fields is skipped, a
line longer than 255 bytes is read in pieces. So a written file is only as good as what the
plugin makes of it, and this module reads a config exactly as the plugin does
(:func:`parse_tuner_config`), says where the plugin would read a file otherwise than it is
written (:func:`config_problems`), and answers a call as the plugin would
(:func:`match_tuner_config`).

The rules, from ``plugin.c`` (``loadConfig``, ``pluginGetCollInfo``; docs/measured.md,
"Tuner configs out", names the commit read):

1. The file is read with ``fgets`` into a 256-byte buffer: a line longer than 255 bytes
   (before its newline) comes in pieces, each read as a line of its own.
2. A piece whose first byte is ``#`` or a newline is skipped (``  # x`` is not a comment);
   the rest is cut at its newline (and, being a C string, at a NUL byte).
3. Fields are split at commas by ``strtok``: empty fields vanish (``a,,b`` is two
   fields); at most 10 are kept; each is trimmed of spaces and tabs (not ``\\r``).
4. Fewer than 8 fields: the line is ignored.
5. Names compare exactly (case-sensitive): collectives ``broadcast``, ``reduce``,
   ``allgather``, ``reducescatter``, ``allreduce``; algorithms ``tree``, ``ring``,
   ``collnet_direct``, ``collnet_chain``, ``nvls``, ``nvls_tree``, ``pat``; protocols
   ``ll``, ``ll128``, ``simple``. Anything else becomes the default named above.
6. ``min_bytes``/``max_bytes`` are ``strtoull`` (``-1`` is 2^64 − 1; no digits is 0); the
   other numbers ``atoi`` (no digits is 0). ``numPipeOps`` and ``regBuff`` are -1 when absent.
7. A call (collective, ``nBytes``, the communicator's nodes and ranks, ``numPipeOps``,
   ``regBuff``) is answered by the first line, in file order, with its collective,
   ``min_bytes <= nBytes <= max_bytes`` (both ends included), and nodes, ranks, pipeline
   ops and buffer registration equal or -1, whose (algorithm, protocol) NCCL's cost table
   has not marked ignored; that entry's cost becomes 0.0 and the call's channels the
   line's, unless -1. NCCL's ``nBytes`` is the element size times the count, times the
   ranks for all-gather and reduce-scatter (``src/enqueue.cc``): nccl-tests' size.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from etstore.collective import short_name
from etstore.errors import OptionError

__all__ = [
    "CONFIG_FIELDS",
    "NCCL_ALGORITHMS",
    "NCCL_COLLECTIVES",
    "NCCL_PROTOCOLS",
    "TunerConfigLine",
    "config_problems",
    "format_tuner_config",
    "match_tuner_config",
    "nccl_algorithm",
    "nccl_collective",
    "nccl_protocol",
    "parse_tuner_config",
    "read_tuner_config",
]

CONFIG_FIELDS = (
    "collective_type",
    "min_bytes",
    "max_bytes",
    "algorithm",
    "protocol",
    "channels",
    "nNodes",
    "nRanks",
    "numPipeOps",
    "regBuff",
)
"""The plugin's fields in order; the last two are optional."""

NCCL_COLLECTIVES = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")
"""The collectives the plugin names (``parseCollType``)."""
NCCL_ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
"""The algorithms the plugin names (``parseAlgorithm``)."""
NCCL_PROTOCOLS = ("ll", "ll128", "simple")
"""The protocols the plugin names (``parseProtocol``)."""

_LINE_BYTES = 256  # the plugin's MAX_LINE_LENGTH: fgets keeps 255 bytes and the NUL
_REQUIRED, _MAX_FIELDS = 8, 10
_SPACE = b" \t\n\v\f\r"  # C isspace(), which strtoull and atoi skip
_ULLONG_MAX = (1 << 64) - 1
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_COMMENT_CHARS = 200  # a written comment line stays well inside one fgets piece

# NCCL's own spellings (NCCL_ALGO=Tree,CollnetDirect,NVLSTree, ...) and the plugin's, compared
# without case, '_', '-' or spaces
_ALGORITHM_KEYS = {name.replace("_", ""): name for name in NCCL_ALGORITHMS}


def _key(text: str) -> str:
    return re.sub(r"[-_ ]", "", text).lower()


class TunerConfigLine(NamedTuple):
    """One line of the config: which calls it matches and what it sets."""

    collective: str
    """One of :data:`NCCL_COLLECTIVES`."""
    min_bytes: int
    """Smallest ``nBytes`` matched (inclusive)."""
    max_bytes: int
    """Largest ``nBytes`` matched (inclusive)."""
    algorithm: str
    """One of :data:`NCCL_ALGORITHMS`."""
    protocol: str
    """One of :data:`NCCL_PROTOCOLS`."""
    channels: int = -1
    """Channels to use; -1 leaves the plugin's default (see docs/measured.md)."""
    nodes: int = -1
    """Nodes of the communicator matched; -1 any."""
    ranks: int = -1
    """Ranks of the communicator matched; -1 any."""
    pipe_ops: int = -1
    """``numPipeOps`` matched; -1 any."""
    reg_buff: int = -1
    """``regBuff`` matched (0, 1); -1 any."""
    line: int = 0
    """1-based line of the file it was read from (0: not read from a file)."""

    def fields(self) -> list[str]:
        """The line's fields as written: 8, or 9 or 10 when ``pipe_ops``/``reg_buff`` are set.

        >>> TunerConfigLine("allreduce", 0, 65535, "tree", "ll", 2, 1, 8).fields()
        ['allreduce', '0', '65535', 'tree', 'll', '2', '1', '8']
        """
        out = [self.collective, str(self.min_bytes), str(self.max_bytes), self.algorithm, self.protocol]
        out += [str(self.channels), str(self.nodes), str(self.ranks)]
        if self.pipe_ops != -1 or self.reg_buff != -1:
            out.append(str(self.pipe_ops))
        if self.reg_buff != -1:
            out.append(str(self.reg_buff))
        return out


# ------------------------------------------------------------------ names


def nccl_collective(name: str) -> str | None:
    """The plugin's name of collective ``name`` (any etstore spelling), or None when it has none.

    >>> nccl_collective("ALL_REDUCE"), nccl_collective("REDUCE_SCATTER_BLOCK"), nccl_collective("alltoall")
    ('allreduce', 'reducescatter', None)
    """
    short = short_name(name)
    return short if short in NCCL_COLLECTIVES else None


def nccl_algorithm(name: str) -> str | None:
    """The plugin's name of NCCL algorithm ``name`` as a tuner logs it, or None when NCCL has none.

    >>> nccl_algorithm("Ring"), nccl_algorithm("CollNetDirect"), nccl_algorithm("NVLSTree")
    ('ring', 'collnet_direct', 'nvls_tree')
    >>> nccl_algorithm("halving-doubling") is None, nccl_algorithm("ring_allreduce_4r") is None
    (True, True)
    """
    key = _key(name)
    return _ALGORITHM_KEYS.get(key.removeprefix("ncclalgo"))


def nccl_protocol(name: str) -> str | None:
    """The plugin's name of NCCL protocol ``name`` as a tuner logs it, or None when NCCL has none.

    >>> nccl_protocol("Simple"), nccl_protocol("LL128"), nccl_protocol("LL-128"), nccl_protocol("fast")
    ('simple', 'll128', 'll128', None)
    """
    key = _key(name).removeprefix("ncclproto")
    return key if key in NCCL_PROTOCOLS else None


# ------------------------------------------------------------------ writing


def _comment(text: str) -> str:
    """One comment line: no line breaks, short enough to be one piece for the plugin's fgets."""
    flat = " ".join(text.split())
    return "# " + (flat if len(flat) <= _COMMENT_CHARS else flat[: _COMMENT_CHARS - 3] + "...")


def _checked(row: TunerConfigLine) -> str:
    """The line as written, or OptionError naming what the plugin would read otherwise."""
    where = f"tuner config line {row.fields()!r}"
    if row.collective not in NCCL_COLLECTIVES:
        raise OptionError(
            f"{where}: collective {row.collective!r} is not one of {', '.join(NCCL_COLLECTIVES)}"
        )
    if row.algorithm not in NCCL_ALGORITHMS:
        raise OptionError(f"{where}: algorithm {row.algorithm!r} is not one of {', '.join(NCCL_ALGORITHMS)}")
    if row.protocol not in NCCL_PROTOCOLS:
        raise OptionError(f"{where}: protocol {row.protocol!r} is not one of {', '.join(NCCL_PROTOCOLS)}")
    if not 0 <= row.min_bytes <= row.max_bytes <= _ULLONG_MAX:
        raise OptionError(f"{where}: expected 0 <= min_bytes <= max_bytes < 2^64")
    if row.channels != -1 and row.channels < 1:
        raise OptionError(f"{where}: channels must be -1 or at least 1")
    if any(v != -1 and v < 1 for v in (row.nodes, row.ranks)) or any(
        v < -1 for v in (row.pipe_ops, row.reg_buff)
    ):
        raise OptionError(
            f"{where}: nNodes and nRanks must be -1 or at least 1, numPipeOps and regBuff >= -1"
        )
    return ",".join(row.fields())


def format_tuner_config(lines: Iterable[TunerConfigLine], *, comments: Sequence[str] = ()) -> str:
    """The config file's text: ``comments`` (one ``#`` line each), the field names as a comment,
    then one line per config line, in the order given (the plugin applies the first match).

    Parameters
    ----------
    lines
        The config lines.
    comments
        Text for the leading comment lines; line breaks become spaces and a long one is cut,
        so that each stays one line for the plugin.

    Returns
    -------
    str
        ``\\n``-terminated lines; the first config line is line ``len(comments) + 2``.

    Raises
    ------
    OptionError
        A line names what the plugin does not know, or has a number it would read otherwise.

    Examples
    --------
    >>> text = format_tuner_config([TunerConfigLine("allreduce", 1024, 2047, "tree", "ll", 2, 1, 4)],
    ...                            comments=["from a tuner run"])
    >>> print(text, end="")
    # from a tuner run
    # collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks
    allreduce,1024,2047,tree,ll,2,1,4
    >>> parse_tuner_config(text)[0][:8] == (("allreduce", 1024, 2047, "tree", "ll", 2, 1, 4))
    True
    """
    head = [_comment(c) for c in comments] + ["# " + ",".join(CONFIG_FIELDS[:_REQUIRED])]
    return "".join(f"{line}\n" for line in head + [_checked(row) for row in lines])


# ------------------------------------------------------------------ reading, as the plugin reads


def _pieces(data: bytes) -> Iterator[tuple[int, bytes]]:
    """What the plugin's ``fgets`` loop reads: pieces of at most 255 bytes, each ending at a
    newline or where the buffer filled, with the 1-based line each starts on."""
    line, pos = 1, 0
    while pos < len(data):
        newline = data.find(b"\n", pos, pos + _LINE_BYTES - 1)
        stop = newline + 1 if newline >= 0 else min(pos + _LINE_BYTES - 1, len(data))
        piece = data[pos:stop]
        yield line, piece
        line += piece.endswith(b"\n")
        pos = stop


def _digits(token: bytes) -> tuple[bool, int | None]:
    """Sign and value of the decimal number ``strtoull``/``strtol`` read (None: no digits)."""
    text = token.lstrip(_SPACE)
    negative = text[:1] == b"-"
    if text[:1] in (b"-", b"+"):
        text = text[1:]
    match = re.match(rb"[0-9]+", text)
    return negative, int(match.group()) if match else None


def _strtoull(token: bytes) -> int:
    """glibc ``strtoull(token, NULL, 10)``: 0 without digits, 2^64 − 1 on overflow, a minus wraps."""
    negative, value = _digits(token)
    if value is None:
        return 0
    if value > _ULLONG_MAX:
        return _ULLONG_MAX
    return (-value) & _ULLONG_MAX if negative else value


def _atoi(token: bytes) -> int:
    """glibc ``atoi``: ``(int) strtol(token, NULL, 10)`` (clamped to a long, then cut to 32 bits)."""
    negative, value = _digits(token)
    if value is None:
        return 0
    wide = min(max(-value if negative else value, _LONG_MIN), _LONG_MAX) & 0xFFFFFFFF
    return wide - (1 << 32) if wide >= 1 << 31 else wide


def _tokens(piece: bytes) -> list[bytes]:
    """The fields ``strtok`` and the trimming make of one piece: empty ones vanish, 10 at most."""
    text = piece.split(b"\n", 1)[0].split(b"\0", 1)[0]
    return [t.strip(b" \t") for t in text.split(b",") if t][:_MAX_FIELDS]


def _name(token: bytes, known: Sequence[str], default: str) -> str:
    text = token.decode("latin-1")
    return text if text in known else default


# field index -> the names the plugin knows there, and what it reads anything else as
_NAMED = {0: (NCCL_COLLECTIVES, "allreduce"), 3: (NCCL_ALGORITHMS, "ring"), 4: (NCCL_PROTOCOLS, "simple")}


def _parsed(line: int, tokens: Sequence[bytes]) -> TunerConfigLine:
    return TunerConfigLine(
        collective=_name(tokens[0], NCCL_COLLECTIVES, "allreduce"),
        min_bytes=_strtoull(tokens[1]),
        max_bytes=_strtoull(tokens[2]),
        algorithm=_name(tokens[3], NCCL_ALGORITHMS, "ring"),
        protocol=_name(tokens[4], NCCL_PROTOCOLS, "simple"),
        channels=_atoi(tokens[5]),
        nodes=_atoi(tokens[6]),
        ranks=_atoi(tokens[7]),
        pipe_ops=_atoi(tokens[8]) if len(tokens) > 8 else -1,
        reg_buff=_atoi(tokens[9]) if len(tokens) > 9 else -1,
        line=line,
    )


def parse_tuner_config(data: bytes | str) -> list[TunerConfigLine]:
    """The config lines the example plugin loads from a file holding ``data``, in its order.

    Notes
    -----
    O(bytes). Follows ``loadConfig`` rule by rule (module docstring): nothing is reported;
    :func:`config_problems` says what was read otherwise than written.

    Examples
    --------
    >>> parse_tuner_config("# x\\nallreduce,0,65536,tree,simple,2,1,-1,-1,1\\nallgather,0,-1,PAT,ll,4\\n")
    ... # doctest: +NORMALIZE_WHITESPACE
    [TunerConfigLine(collective='allreduce', min_bytes=0, max_bytes=65536, algorithm='tree',
     protocol='simple', channels=2, nodes=1, ranks=-1, pipe_ops=-1, reg_buff=1, line=2)]
    >>> parse_tuner_config("alltoall , 0,,-1, PAT,fast,4,1,8\\n")[0][:8]  # unknown names: defaults
    ('allreduce', 0, 18446744073709551615, 'ring', 'simple', 4, 1, 8)
    """
    raw = data.encode() if isinstance(data, str) else data
    out = []
    for line, piece in _pieces(raw):
        if piece[:1] in (b"#", b"\n"):
            continue
        tokens = _tokens(piece)
        if len(tokens) >= _REQUIRED:
            out.append(_parsed(line, tokens))
    return out


def read_tuner_config(path: str | Path) -> list[TunerConfigLine]:
    """:func:`parse_tuner_config` of the file at ``path`` (the plugin would treat a missing file
    as no config; here it raises ``OSError``)."""
    return parse_tuner_config(Path(path).read_bytes())


def config_problems(data: bytes | str) -> list[str]:
    """Where the plugin reads ``data`` otherwise than it is written: one line per problem.

    A line in pieces, a line that looks like a config line but has fewer than 8 fields, a
    name the plugin replaces by its default, an empty field that vanishes, a number with
    characters ``strtoull``/``atoi`` stop at.

    Examples
    --------
    >>> config_problems("allreduce,0,1024,tree,ll,2,1,4\\n")
    []
    >>> config_problems("all_reduce,0,1k,Tree,ll,2,1\\n")  # doctest: +NORMALIZE_WHITESPACE
    ['line 1: 7 fields; the plugin ignores lines of fewer than 8']
    >>> config_problems("all_reduce,0,1k,Tree,ll,,2,1,4\\n")  # doctest: +NORMALIZE_WHITESPACE
    ['line 1: an empty field vanishes (strtok): the fields after it shift left',
     "line 1: collective_type 'all_reduce' is read as allreduce",
     "line 1: max_bytes '1k' is read as 1",
     "line 1: algorithm 'Tree' is read as ring"]
    """
    raw = data.encode() if isinstance(data, str) else data
    out: list[str] = []
    pieces = list(_pieces(raw))
    for index, (line, piece) in enumerate(pieces):
        if not piece.endswith(b"\n") and index + 1 < len(pieces) and pieces[index + 1][1] != b"\n":
            out.append(f"line {line}: longer than 255 bytes; the plugin reads it in pieces")
        if piece[:1] in (b"#", b"\n"):
            continue
        text = piece.split(b"\n", 1)[0].split(b"\0", 1)[0]
        if not text.strip(_SPACE):
            continue
        tokens = _tokens(piece)
        if len(tokens) < _REQUIRED:
            count = f"{len(tokens)} field{'' if len(tokens) == 1 else 's'}"
            out.append(f"line {line}: {count}; the plugin ignores lines of fewer than 8")
            continue
        if b"" in text.split(b","):
            out.append(f"line {line}: an empty field vanishes (strtok): the fields after it shift left")
        out += _field_problems(line, tokens)
    return out


def _field_problems(line: int, tokens: Sequence[bytes]) -> list[str]:
    """Names replaced by defaults and numbers cut short, in one line's fields."""
    out = []
    for i, token in enumerate(tokens):
        field, shown = CONFIG_FIELDS[i], token.decode("latin-1")
        if i in _NAMED:
            known, default = _NAMED[i]
            if shown not in known:
                out.append(f"line {line}: {field} {shown!r} is read as {default}")
        elif not re.fullmatch(r"[-+]?[0-9]+", shown):
            value = _strtoull(token) if i in (1, 2) else _atoi(token)
            out.append(f"line {line}: {field} {shown!r} is read as {value}")
    return out


# ------------------------------------------------------------------ matching, as the plugin matches


def match_tuner_config(
    lines: Iterable[TunerConfigLine],
    collective: str,
    n_bytes: int,
    *,
    nodes: int,
    ranks: int,
    pipe_ops: int = 1,
    reg_buff: int = 0,
    ignored: Collection[tuple[str, str]] = (),
) -> TunerConfigLine | None:
    """The line the plugin applies to one call, or None when none does (NCCL then decides).

    Parameters
    ----------
    lines
        The config, in file order (:func:`parse_tuner_config`).
    collective
        The call's collective, a name of :data:`NCCL_COLLECTIVES`.
    n_bytes
        NCCL's ``nBytes`` for the call (nccl-tests' size; module docstring).
    nodes, ranks
        The communicator's nodes and ranks.
    pipe_ops, reg_buff
        ``numPipeOps`` (collectives in the group) and ``regBuff`` (0 or 1) of the call.
    ignored
        (algorithm, protocol) pairs NCCL's cost table marks ignored for the call: a line
        choosing one is passed over and the search goes on.

    Notes
    -----
    O(lines). The plugin sets the call's channels to the line's unless it is -1; it starts
    every call at 1 channel (so -1, and no match, leave 1; docs/measured.md).

    Examples
    --------
    >>> conf = parse_tuner_config("allreduce,0,1023,tree,ll,2,-1,4\\nallreduce,0,4095,ring,ll,-1,-1,-1\\n")
    >>> [match_tuner_config(conf, "allreduce", n, nodes=1, ranks=4).line for n in (0, 1023, 1024, 4095)]
    [1, 1, 2, 2]
    >>> match_tuner_config(conf, "allreduce", 4096, nodes=1, ranks=4) is None
    True
    >>> match_tuner_config(conf, "allreduce", 8, nodes=1, ranks=4, ignored={("tree", "ll")}).line
    2
    """
    for row in lines:
        if (
            row.collective == collective
            and row.min_bytes <= n_bytes <= row.max_bytes
            and row.nodes in (-1, nodes)
            and row.ranks in (-1, ranks)
            and row.pipe_ops in (-1, pipe_ops)
            and row.reg_buff in (-1, reg_buff)
            and (row.algorithm, row.protocol) not in ignored
        ):
            return row
    return None
