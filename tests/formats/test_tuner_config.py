"""NCCL's example tuner plugin config: each of the plugin's reading and matching rules, by hand.

The rules are those of NVIDIA/nccl ``plugins/tuner/example/plugin.c`` (docs/measured.md,
"Tuner configs out"); every expected value below is worked out from them on paper.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from etstore.errors import OptionError
from etstore.formats.tuner_config import (
    NCCL_ALGORITHMS,
    NCCL_COLLECTIVES,
    NCCL_PROTOCOLS,
    TunerConfigLine,
    config_problems,
    format_tuner_config,
    match_tuner_config,
    nccl_algorithm,
    nccl_collective,
    nccl_protocol,
    parse_tuner_config,
    read_tuner_config,
)

ULLONG_MAX = (1 << 64) - 1


def _fields(text: bytes | str) -> list[tuple[object, ...]]:
    """The parsed lines without their line numbers."""
    return [tuple(c)[:10] for c in parse_tuner_config(text)]


# ---------------------------------------------------------------- reading


def test_comments_blank_lines_and_short_lines_are_skipped() -> None:
    text = (
        "# a comment, with, commas, enough, for, eight, fields, here\n"
        "\n"
        "allreduce,0,1023,tree,ll,2,1,4\n"
        "allreduce,0,1023,tree,ll,2,1\n"  # 7 fields: ignored
        "allgather,8,15,pat,ll128,-1,-1,-1\n"
    )
    got = parse_tuner_config(text)
    assert [c.line for c in got] == [3, 5]
    assert _fields(text) == [
        ("allreduce", 0, 1023, "tree", "ll", 2, 1, 4, -1, -1),
        ("allgather", 8, 15, "pat", "ll128", -1, -1, -1, -1, -1),
    ]


def test_an_indented_hash_is_not_a_comment() -> None:
    # the first byte must be '#': this line has 8 fields, and '#allreduce' is no collective name
    assert _fields(" #allgather,0,7,tree,ll,2,1,4\n") == [("allreduce", 0, 7, "tree", "ll", 2, 1, 4, -1, -1)]


def test_optional_fields_and_the_tenth_is_the_last() -> None:
    text = "reduce,0,7,tree,simple,1,1,2,3\nbroadcast,0,7,ring,ll,1,1,2,3,1,99,98\n"
    assert _fields(text) == [
        ("reduce", 0, 7, "tree", "simple", 1, 1, 2, 3, -1),  # 9 fields: numPipeOps only
        ("broadcast", 0, 7, "ring", "ll", 1, 1, 2, 3, 1),  # 12 fields: the first 10 count
    ]


def test_empty_fields_vanish_and_the_rest_shift_left() -> None:
    # strtok: 'tree,,2' is two fields; protocol becomes '2' (read as simple), channels 1, ...
    text = "allreduce,0,1023,tree,,2,1,4,1\n"
    assert _fields(text) == [("allreduce", 0, 1023, "tree", "simple", 1, 4, 1, -1, -1)]
    assert (
        config_problems(text)[0] == "line 1: an empty field vanishes (strtok): the fields after it shift left"
    )


def test_fields_are_trimmed_of_spaces_and_tabs_only() -> None:
    assert _fields(" allreduce , 0 ,1023,\ttree ,ll,\t2,1,4\r\n") == [
        ("allreduce", 0, 1023, "tree", "ll", 2, 1, 4, -1, -1)  # '4\r': atoi stops at '\r'
    ]
    # a carriage return left on a name makes it unknown
    assert _fields("allreduce,0,1023,tree,ll,2,1,4,1,1\r\n")[0][9] == 1
    assert _fields("allreduce,0,1023,tree,ll\r,2,1,4\n") == [
        ("allreduce", 0, 1023, "tree", "simple", 2, 1, 4, -1, -1)
    ]


def test_unknown_names_are_read_as_the_defaults() -> None:
    text = "all_reduce,0,1,Tree,LL,1,1,1\nalltoall,0,1,nvls_tree,ll128,1,1,1\n"
    assert [c[:5] for c in _fields(text)] == [
        ("allreduce", 0, 1, "ring", "simple"),  # 'all_reduce', 'Tree', 'LL': case and spelling count
        ("allreduce", 0, 1, "nvls_tree", "ll128"),  # no all-to-all in the plugin
    ]
    assert config_problems(text) == [
        "line 1: collective_type 'all_reduce' is read as allreduce",
        "line 1: algorithm 'Tree' is read as ring",
        "line 1: protocol 'LL' is read as simple",
        "line 2: collective_type 'alltoall' is read as allreduce",
    ]


def test_numbers_as_strtoull_and_atoi_read_them() -> None:
    text = (
        "allreduce,1k,-1,ring,ll,2.5,x,4294967297\n"  # 1; 2^64-1; 2; 0; (int) 4294967297 = 1
        "allreduce,99999999999999999999999,-2,ring,ll,-1,+3,-4294967295\n"  # clamped; wraps; -1; 3; 1
    )
    assert [c[1:3] + c[5:8] for c in _fields(text)] == [
        (1, ULLONG_MAX, 2, 0, 1),
        (ULLONG_MAX, ULLONG_MAX - 1, -1, 3, 1),
    ]


def test_a_line_longer_than_255_bytes_is_read_in_pieces() -> None:
    head = "allreduce,0,1023,tree,ll,2,1,4,"
    line = head + " " * (255 - len(head)) + "  allgather,0,7,ring,ll,1,1,1\n"
    got = parse_tuner_config(line)
    # piece 1: 255 bytes, 9 fields (the last one spaces, atoi 0); piece 2: a line of its own
    assert [tuple(c) for c in got] == [
        ("allreduce", 0, 1023, "tree", "ll", 2, 1, 4, 0, -1, 1),
        ("allgather", 0, 7, "ring", "ll", 1, 1, 1, -1, -1, 1),
    ]
    assert config_problems(line) == [
        "line 1: longer than 255 bytes; the plugin reads it in pieces",
        "line 1: numPipeOps '' is read as 0",
    ]
    exactly = "allreduce,0,1023,tree,ll,2,1,4" + " " * 224  # 254 bytes and the newline: one piece
    assert len(exactly) == 254 and len(parse_tuner_config(exactly + "\n")) == 1
    assert config_problems(exactly + "\n") == []
    just = exactly + " "  # 255 bytes: the newline is a piece of its own, which the plugin skips
    assert len(parse_tuner_config(just + "\n")) == 1 and config_problems(just + "\n") == []


def test_a_nul_byte_ends_the_line() -> None:
    assert _fields(b"allreduce,0,1023,tree,ll,2,1,4\x00,1,1\n") == [
        ("allreduce", 0, 1023, "tree", "ll", 2, 1, 4, -1, -1)
    ]


def test_read_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "nccl_tuner.conf"
    path.write_text("reducescatter,0,-1,ring,simple,-1,-1,-1\n")
    assert [tuple(c)[:8] for c in read_tuner_config(path)] == [
        ("reducescatter", 0, ULLONG_MAX, "ring", "simple", -1, -1, -1)
    ]
    with pytest.raises(FileNotFoundError):
        read_tuner_config(tmp_path / "absent.conf")


# ---------------------------------------------------------------- matching


CONF = parse_tuner_config(
    "allreduce,0,1023,tree,ll,2,1,8\n"  # line 1: one node, 8 ranks
    "allreduce,512,4095,ring,ll128,4,-1,8\n"  # line 2: any nodes
    "allreduce,0,4095,nvls,simple,-1,-1,-1,2\n"  # line 3: numPipeOps 2 only
    "allreduce,0,4095,pat,simple,-1,-1,-1,-1,1\n"  # line 4: registered buffers only
    "allgather,0,-1,ring,simple,-1,-1,-1\n"  # line 5: any size
)


@pytest.mark.parametrize(
    ("collective", "n_bytes", "nodes", "ranks", "pipe_ops", "reg_buff", "line"),
    [
        ("allreduce", 0, 1, 8, 1, 0, 1),  # min inclusive
        ("allreduce", 1023, 1, 8, 1, 0, 1),  # max inclusive
        ("allreduce", 512, 1, 8, 1, 0, 1),  # lines 1 and 2 both match: the first wins
        ("allreduce", 512, 2, 8, 1, 0, 2),  # two nodes: line 1 does not match
        ("allreduce", 1024, 1, 8, 1, 0, 2),
        ("allreduce", 4095, 1, 8, 1, 0, 2),
        ("allreduce", 4096, 1, 8, 1, 0, None),  # past every range: NCCL decides
        ("allreduce", 100, 1, 4, 1, 0, None),  # 4 ranks, one pipeline op, unregistered: nothing
        ("allreduce", 100, 1, 4, 2, 0, 3),
        ("allreduce", 100, 1, 4, 1, 1, 4),
        ("allgather", ULLONG_MAX, 9, 72, 1, 0, 5),
        ("reduce", 0, 1, 8, 1, 0, None),
    ],
)
def test_the_first_matching_line_answers(
    collective: str, n_bytes: int, nodes: int, ranks: int, pipe_ops: int, reg_buff: int, line: int | None
) -> None:
    got = match_tuner_config(
        CONF, collective, n_bytes, nodes=nodes, ranks=ranks, pipe_ops=pipe_ops, reg_buff=reg_buff
    )
    assert (got.line if got else None) == line


def test_a_line_whose_choice_nccl_ignores_is_passed_over() -> None:
    got = match_tuner_config(CONF, "allreduce", 512, nodes=1, ranks=8, ignored={("tree", "ll")})
    assert got is not None and got.line == 2


# ---------------------------------------------------------------- writing


def test_written_lines_read_back_as_written() -> None:
    lines = [
        TunerConfigLine("allreduce", 0, 1023, "tree", "ll", 2, 1, 8),
        TunerConfigLine("allgather", 1024, ULLONG_MAX, "nvls_tree", "simple", -1, -1, 16, 2),
        TunerConfigLine("broadcast", 7, 7, "collnet_chain", "ll128", 1, 2, -1, -1, 0),
    ]
    text = format_tuner_config(lines, comments=["one", "two"])
    assert text.splitlines()[:3] == [
        "# one",
        "# two",
        "# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks",
    ]
    assert text.splitlines()[5] == "broadcast,7,7,collnet_chain,ll128,1,2,-1,-1,0"
    assert parse_tuner_config(text) == [c._replace(line=4 + i) for i, c in enumerate(lines)]
    assert config_problems(text) == []


def test_a_comment_stays_one_short_line() -> None:
    name = "run,with,commas\nallreduce,0,1,tree,ll,1,1,1\n" + "x," * 200
    text = format_tuner_config([TunerConfigLine("allreduce", 0, 1, "ring", "ll")], comments=[name])
    first = text.splitlines()[0]
    assert first.startswith("# run,with,commas allreduce,0,1,tree,ll,1,1,1 x,") and len(first) < 255
    assert len(text.splitlines()) == 3 and config_problems(text) == []
    assert [c.algorithm for c in parse_tuner_config(text)] == ["ring"]


@pytest.mark.parametrize(
    ("line", "match"),
    [
        (TunerConfigLine("alltoall", 0, 1, "ring", "ll"), "collective 'alltoall' is not one of"),
        (TunerConfigLine("allreduce", 0, 1, "Ring", "ll"), "algorithm 'Ring' is not one of"),
        (TunerConfigLine("allreduce", 0, 1, "ring", "LL"), "protocol 'LL' is not one of"),
        (TunerConfigLine("allreduce", 2, 1, "ring", "ll"), "0 <= min_bytes <= max_bytes"),
        (TunerConfigLine("allreduce", 0, 1, "ring", "ll", 0), "channels must be -1 or at least 1"),
        (TunerConfigLine("allreduce", 0, 1, "ring", "ll", 1, 0), "nNodes and nRanks must be -1"),
    ],
)
def test_the_writer_refuses_what_the_plugin_would_read_otherwise(line: TunerConfigLine, match: str) -> None:
    with pytest.raises(OptionError, match=match):
        format_tuner_config([line])


# ---------------------------------------------------------------- names


def test_names_as_tuners_log_them() -> None:
    assert [nccl_collective(c) for c in ("ALL_REDUCE", "all-gather", "REDUCE_SCATTER", "BROADCAST")] == [
        "allreduce",
        "allgather",
        "reducescatter",
        "broadcast",
    ]
    assert [nccl_collective(c) for c in ("ALL_TO_ALL", "GATHER", "BARRIER", "nonsense")] == [None] * 4
    assert [nccl_algorithm(a) for a in ("Tree", "CollnetChain", "NVLS", "nvls_tree", "PAT", "direct")] == [
        "tree",
        "collnet_chain",
        "nvls",
        "nvls_tree",
        "pat",
        None,
    ]
    assert [nccl_protocol(p) for p in ("LL", "ll128", "SIMPLE", "", "LL64")] == [
        "ll",
        "ll128",
        "simple",
        None,
        None,
    ]


# ---------------------------------------------------------------- against the plugin's own code

NCCL_EXAMPLE_ENV = "ETSTORE_NCCL_TUNER_EXAMPLE"
"""A directory holding NCCL's ``plugins/tuner/example`` (``plugin.c`` and ``nccl/``): opt-in."""

HARNESS = r"""
#include "plugin.c"
static const char* A[] = {"tree","ring","collnet_direct","collnet_chain","nvls","nvls_tree","pat"};
static const char* P[] = {"ll","ll128","simple"};
static const char* C[] = {"broadcast","reduce","allgather","reducescatter","allreduce"};
int main(int argc, char** argv) {
  void* v = NULL;
  setenv("NCCL_TUNER_CONFIG_FILE", argv[1], 1);
  if (pluginInit(&v, 0, 1, 1, NULL, NULL, NULL) != ncclSuccess) return 2;
  TunerContext* ctx = (TunerContext*)v;
  for (int i = 0; i < ctx->numConfigs; i++) {
    TuningConfig* c = &ctx->configs[i];
    printf("C %s %zu %zu %s %s %d %d %d %d %d\n", C[c->collType], c->minBytes, c->maxBytes, A[c->algorithm],
           P[c->protocol], c->nChannels, c->nNodes, c->nRanks, c->numPipeOps, c->regBuff);
  }
  int coll, nNodes, nRanks, pipeOps, regBuff; size_t nBytes;
  while (scanf("%d %zu %d %d %d %d", &coll, &nBytes, &nNodes, &nRanks, &pipeOps, &regBuff) == 6) {
    float t[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS];
    for (int a = 0; a < NCCL_NUM_ALGORITHMS; a++) for (int p = 0; p < NCCL_NUM_PROTOCOLS; p++) t[a][p] = 1.0;
    ctx->nNodes = nNodes; ctx->nRanks = nRanks;
    int nCh = 99, fa = -1, fp = -1;
    pluginGetCollInfo(ctx, (ncclFunc_t)coll, nBytes, pipeOps, (float**)t, NCCL_NUM_ALGORITHMS,
                      NCCL_NUM_PROTOCOLS, regBuff, &nCh);
    for (int a = 0; a < NCCL_NUM_ALGORITHMS; a++) for (int p = 0; p < NCCL_NUM_PROTOCOLS; p++)
      if (t[a][p] == 0.0) { fa = a; fp = p; }
    if (fa < 0) printf("Q none - %d\n", nCh); else printf("Q %s %s %d\n", A[fa], P[fp], nCh);
  }
  return 0;
}
"""


def _random_config(rng: random.Random) -> bytes:
    """A file of comments, blank lines and lines of 6 to 11 fields, names and numbers good and bad."""
    names = {
        0: [*NCCL_COLLECTIVES, "AllReduce", "alltoall", " allgather", "reduce\t"],
        3: [*NCCL_ALGORITHMS, "Ring", "direct", "nvlstree"],
        4: [*NCCL_PROTOCOLS, "LL", "Simple", ""],
    }
    numbers = ["-1", "0", "2", "8", "1023", "1024", "4096", "1k", "+3", "2.5", "", " 7 ", "x", "-2"]
    numbers += ["99999999999999999999999", "-4294967295", "4294967297", "18446744073709551615"]
    lines = []
    for _ in range(rng.randint(1, 10)):
        fields = [rng.choice(names.get(i, numbers)) for i in range(rng.choice([6, 7, 8, 8, 9, 10, 11]))]
        text = ",".join(fields)
        kind = rng.random()
        if kind < 0.2:  # a comment, an indented '#' (not a comment), an empty line
            text = "# " + text if kind < 0.1 else " #" + text if kind < 0.15 else ""
        if rng.random() < 0.05:
            text += " " * rng.randint(200, 300) + ",1"
        lines.append(text)
    ending = rng.choice(["\n", "\n", "\r\n"])
    return (ending.join(lines) + ending).encode()


def test_the_plugins_own_code_reads_and_matches_as_we_do(tmp_path: Path) -> None:
    """NCCL's plugin.c, compiled here, against parse/match on random files (opt-in: set
    ETSTORE_NCCL_TUNER_EXAMPLE to a checkout's plugins/tuner/example; needs a C compiler)."""
    source = os.environ.get(NCCL_EXAMPLE_ENV)
    compiler = shutil.which("cc") or shutil.which("gcc")
    if not source or not (Path(source) / "plugin.c").exists() or compiler is None:
        pytest.skip(f"set {NCCL_EXAMPLE_ENV} to NCCL's plugins/tuner/example (and have a C compiler)")
    (tmp_path / "harness.c").write_text(HARNESS)
    binary = tmp_path / "harness"
    subprocess.run(
        [compiler, "-w", f"-I{source}", f"-I{source}/nccl", "-o", str(binary), str(tmp_path / "harness.c")],
        check=True,
    )
    rng = random.Random(34)
    for _ in range(300):
        data = _random_config(rng)
        (tmp_path / "t.conf").write_bytes(data)
        ours = parse_tuner_config(data)
        sizes = sorted({0, 1024, (1 << 64) - 1} | {c.min_bytes for c in ours} | {c.max_bytes for c in ours})
        calls = [
            (
                rng.randrange(5),
                rng.choice(sizes),
                rng.choice([1, 2]),
                rng.choice([4, 8]),
                rng.choice([1, 2]),
                rng.choice([0, 1]),
            )
            for _ in range(20)
        ]
        run = subprocess.run(
            [str(binary), str(tmp_path / "t.conf")],
            input="".join(" ".join(map(str, c)) + "\n" for c in calls),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        loaded = [tuple(line.split()[1:]) for line in run if line.startswith("C ")]
        assert loaded == [tuple(map(str, c[:10])) for c in ours], data
        answers = [line.split()[1:] for line in run if line.startswith("Q ")]
        for (coll, n, nodes, ranks, pipe, reg), answer in zip(calls, answers, strict=True):
            got = match_tuner_config(
                ours, NCCL_COLLECTIVES[coll], n, nodes=nodes, ranks=ranks, pipe_ops=pipe, reg_buff=reg
            )
            # the plugin starts every call at 1 channel, and -1 (or no match) leaves it
            want = ["none", "-", "1"] if got is None else [got.algorithm, got.protocol, str(got.channels)]
            want[2] = "1" if want[2] == "-1" else want[2]
            assert answer == want, (data, coll, n, nodes, ranks, pipe, reg)
