"""The ``etstore`` command: parses arguments, calls the library, renders the result.

:data:`COMMANDS` is the one list of commands: each name, the module of this package
that implements it and its line in ``etstore --help``. The listing, ``--version`` and
the choice of command are answered from that table alone, so they import neither the
library nor its engines; a command's module is imported only when that command runs
(or prints its own help).

Each command module exposes ``register(sub)``, which adds its subparsers and binds each
to a handler with ``set_defaults(handler=...)``. A handler takes ``(args, console)`` and
returns the exit code; library errors (:class:`~etstore.errors.EtstoreError`) become one
line on stderr and exit code 1.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # the interpreter's own, loaded before any script runs
import os
import sys


def _exit_at_once(signum: int, frame: object) -> None:
    """Ctrl-C while nothing is under way (the imports, or a second Ctrl-C while the first one
    unwinds the command): say so and leave now. ``os.write``: the main thread may be inside
    ``sys.stderr``'s own write, which must not be re-entered."""
    try:
        os.write(2, b"etstore: interrupted\n")
    finally:
        os._exit(130)


def _interrupt_command(signum: int, frame: object) -> None:
    """The first Ctrl-C while the command runs: a KeyboardInterrupt, which unwinds it (a DuckDB
    transaction rolls back) to main()'s one line; any further one leaves at once, so that no
    second KeyboardInterrupt can escape main() while the first is being answered."""
    _signal.signal(_signal.SIGINT, _exit_at_once)
    raise KeyboardInterrupt


def _runs_as_the_command() -> bool:
    """Whether this process is the ``etstore`` command: the console script (argv[0] names it), or
    ``python -m etstore.cli``, while runpy imports this package (argv[0] is ``-m`` until then,
    the interpreter's own arguments name the module)."""
    if not sys.argv:
        return False
    if os.path.basename(sys.argv[0]) == "etstore":
        return True
    if sys.argv[0] != "-m":
        return False
    args = list(getattr(sys, "orig_argv", []))[1:]
    while args and args[0].startswith("-"):
        option = args.pop(0)
        if option.startswith("--"):  # of the interpreter's long options only this one takes a value
            del args[: option == "--check-hash-based-pycs"]
            continue
        for i, flag in enumerate(option[1:], 1):
            if flag in "cmWX":  # the options that take a value: the rest of the cluster, or the next
                value = option[i + 1 :] or (args.pop(0) if args else "")
                if flag in "cm":
                    return flag == "m" and value in (__name__, f"{__name__}.__main__")
                break
    return False


# A Ctrl-C during the imports would otherwise print a traceback from inside some library (or
# crash a C extension interrupted in its initialisation), so the handler goes in before any of
# them: only modules the interpreter's start-up loaded are above. It is the command's alone (a
# program importing etstore.cli keeps its own); main() swaps it for _interrupt_command once
# the command's module is imported, and ignores Ctrl-C once the command has its exit code.
_OWNS_SIGINT = _runs_as_the_command() and _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler
if _OWNS_SIGINT:
    try:
        _signal.signal(_signal.SIGINT, _exit_at_once)
    except ValueError:  # not the main thread: signals are not ours to handle
        _OWNS_SIGINT = False

from etstore.pandas_gate import hide_pandas  # noqa: E402  (after the interrupt handler, as all below)


def _become_the_command() -> None:
    """Process-wide settings for a process that only runs the etstore command.

    numpy's BLAS thread pool serves no etstore command, and starting and stopping its
    threads costs every command that loads numpy ≈ 0.04 s (a user's setting wins); pyarrow
    would import pandas, ≈ 0.2 s more (:mod:`etstore.pandas_gate`). (Freezing the GC before
    exit would save more, but leaves DuckDB's objects alive at shutdown, where its bindings
    print a leak report.)
    """
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    hide_pandas()


if os.path.basename(sys.argv[0] if sys.argv else "") == "etstore":  # the console script
    _become_the_command()

import argparse  # noqa: E402
import difflib  # noqa: E402
import importlib  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from typing import NamedTuple  # noqa: E402

from etstore import __version__  # noqa: E402
from etstore.cli._console import DeferredConsole  # noqa: E402
from etstore.errors import EtstoreError  # noqa: E402

__all__ = ["COMMANDS", "Command", "main"]

# etstore.store.ENV_VAR and DEFAULT_STORE, spelled out: importing etstore.store loads the engines
# (tests/cli/test_startup.py checks the two agree)
_STORE_ENV_VAR = "ETSTORE_STORE"
_DEFAULT_STORE = ".etstore"


class Command(NamedTuple):
    """One command: where it lives and what the listing says about it."""

    module: str
    """Module of :mod:`etstore.cli` whose ``register(sub)`` adds the command."""
    help: str
    """Its line in ``etstore --help``."""


# In listing order (the pipeline's); a module's commands in the order its register() adds them,
# with the help its register() gives (tests/cli/test_startup.py compares the two listings).
COMMANDS: dict[str, Command] = {
    "ingest": Command("ingest", "read traces or algorithms into the store"),
    "ls": Command("listing", "list stored traces"),
    "runs": Command("runs", "list simulation, measured, tuner and calibration runs"),
    "show": Command("traces", "counts per type and rank, collectives by type and size"),
    "rm": Command("traces", "remove traces"),
    "export": Command("traces", "write a stored trace back to files"),
    "workload": Command("traces", "generate a synthetic transformer training step (data x tensor parallel)"),
    "demo": Command("demo", "run the end-to-end demo on shipped examples"),
    "cypher": Command("query", "run a Cypher query on the graph"),
    "sql": Command("query", "run SQL on the DuckDB tables"),
    "critical-path": Command("critical_path", "longest dependency path of a trace or a simulation run"),
    "check": Command("algorithms", "prove an algorithm delivers its collective (exit 1 if not)"),
    "algo": Command("algorithms", "built-in collective algorithms"),
    "topo": Command("topology", "network topologies"),
    "synth": Command("topology", "synthesize a topology-aware collective algorithm and store it"),
    "sim": Command("simulate", "replay a trace over a network; metrics into DuckDB"),
    "sweep": Command("sweep", "busbw over sizes x algorithms x topologies, or a trace over a knob"),
    "replay": Command(
        "replay", "replay a recorded PyTorch trace (ET + Kineto) as it ran; measured beside simulated"
    ),
    "breakdown": Command(
        "breakdown", "where a recorded step's time went, as measured: per rank, kernel class and collective"
    ),
    "diff": Command("breakdown", "two traces side by side by op, kernel, collective and rank"),
    "calibrate": Command("calibrate", "fit a topology's latency and bandwidth to a measured nccl-tests run"),
    "tuner": Command(
        "tuner", "which tuner choice wins per size bucket; write NCCL's example tuner plugin config"
    ),
    "expand": Command(
        "expand", "replace collective nodes by an algorithm's send/recv/reduce ops (stores a new trace)"
    ),
    "report": Command(
        "report", "write an HTML report (timelines, breakdowns, bandwidth, links) of simulation runs"
    ),
    "timeline": Command(
        "timeline",
        "timeline of a run or timestamped trace as Chrome trace JSON (Perfetto, chrome://tracing)",
    ),
    "overlap": Command("analysis", "find overlap, chunk and reorder opportunities, each gain simulated"),
    "rewrite": Command("analysis", "store a new trace applying overlap, reorder or chunk-split"),
    "compare": Command("analysis", "simulate two traces and record per-rank and total differences"),
    "rescale": Command("rescale", "store a trace re-scaled to another data- or tensor-parallel size"),
    "publish": Command(
        "publish", "publish the store's traces, runs and metrics to a Neo4j server (idempotent)"
    ),
}


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``etstore`` parser, complete for ``command``'s module only.

    Every other command is a placeholder that takes its help line from :data:`COMMANDS`
    and leaves its arguments unparsed: enough to list the commands, print the version
    and tell which command was asked for.
    """
    p = argparse.ArgumentParser(
        prog="etstore",
        description="Store, query, expand and simulate Chakra execution traces and collective algorithms.",
    )
    p.add_argument("--version", action="version", version=f"etstore {__version__}")
    _add_global_options(p, default=None)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    module = COMMANDS[command].module if command is not None else None
    registered = False
    for name, cmd in COMMANDS.items():
        if cmd.module != module:
            sub.add_parser(name, help=cmd.help, add_help=False)
        elif not registered:  # the module adds all of its commands at once
            importlib.import_module(f"{__name__}.{module}").register(sub)
            registered = True
    for parser in _command_parsers(p):  # the global options after the command too
        _add_global_options(parser, default=argparse.SUPPRESS)
    return p


def _add_global_options(p: argparse.ArgumentParser, *, default: object) -> None:
    """``--store`` and ``--wait``: before the command (``default`` None), and after it, where a
    suppressed default leaves the value given before the command (or its default) alone."""
    p.add_argument(
        "--store",
        default=default,
        help=f"store directory, or neo4j://user:pass@host:7687 to read what was published there "
        f"(default: ${_STORE_ENV_VAR} or ./{_DEFAULT_STORE})",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=default,
        metavar="SECONDS",
        help="how long to wait for another etstore process writing (or reading) the store "
        "(default: $ETSTORE_WAIT or 300)",
    )


def _command_parsers(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser below ``p``: its commands' and their actions' (``algo gen``), depth first."""
    found: list[argparse.ArgumentParser] = []
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for parser in action.choices.values():
                found += [parser, *_command_parsers(parser)]
    return found


def _refuse_unknown(parser: argparse.ArgumentParser, command: str, extras: list[str]) -> None:
    """Exit 2 with one line naming the first unknown option (and the nearest known one), or the
    arguments left over when none is an option."""
    below = [p for p in _command_parsers(parser) if p.prog.split()[1:2] == [command]]
    own = below[0] if below else parser  # ``etstore COMMAND``: its usage line comes with the error
    unknown = next((a for a in extras if a.startswith("-") and not _is_number(a)), None)
    if unknown is None:
        own.error(f"unrecognized arguments: {' '.join(extras)}")
    name = unknown.split("=", 1)[0]
    known = sorted({o for q in (parser, *below) for a in q._actions for o in a.option_strings})
    near = difflib.get_close_matches(name, [o for o in known if o.startswith("--")], n=1, cutoff=0.6)
    hint = f"; did you mean {near[0]}?" if near else f" (etstore {command} --help lists its options)"
    own.error(f"unknown option {name}{hint}")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``etstore`` console script.

    Parameters
    ----------
    argv
        The arguments after the program name (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit code: 0 on success, 1 when the library refused (one line on stderr),
        130 when interrupted. Bad usage exits with argparse's code 2.

    Notes
    -----
    The arguments are parsed twice: once against the placeholders, which answers
    ``--help`` and ``--version`` and names the command, then against the parser its
    module completes. ``--store`` and ``--wait`` go before or after the command; an
    unknown option is named, with the nearest known one (exit 2).
    """
    try:  # the command's Ctrl-C is one KeyboardInterrupt (_interrupt_command): answered here alone
        try:
            code = _run(argv)
        except Exception as exc:
            code = _failed(exc)
        except SystemExit:  # argparse: usage errors, --help, --version
            _finished()
            raise
        _finished()
        return code
    except KeyboardInterrupt:  # whatever was being written has rolled back on its way out
        return _interrupted()


def _run(argv: Sequence[str] | None) -> int:
    """:func:`main` up to the exit code: parse, import the command's module, run its handler."""
    arg_list = list(sys.argv[1:] if argv is None else argv)
    chosen, _ = _parser().parse_known_args(arg_list)
    parser = _parser(chosen.command)  # imports the command's module
    args, extras = parser.parse_known_args(arg_list)
    if extras:
        _refuse_unknown(parser, chosen.command, extras)
    # only now has anything started: until here a Ctrl-C leaves at once, which also keeps it
    # out of C extensions' module initialisation (orjson's crashes when interrupted there)
    if _OWNS_SIGINT and _signal.getsignal(_signal.SIGINT) is _exit_at_once:
        _signal.signal(_signal.SIGINT, _interrupt_command)
    # piped output is read by scripts and wide terminals alike: do not fold tables at 80 columns
    console = DeferredConsole(soft_wrap=False, width=None if sys.stdout.isatty() else 200)
    return int(args.handler(args, console))


def _failed(exc: Exception) -> int:
    """The exit code for an error out of the command, said in one line (a bug's is raised)."""
    if _engine_interrupted(exc):
        return _interrupted()
    if isinstance(exc, EtstoreError):
        print(f"etstore: error: {exc}", file=sys.stderr)
        return 1
    if isinstance(exc, OSError):  # a file or directory the user named cannot be read or written
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        print(f"etstore: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    raise exc


def _finished() -> None:
    """The command has its exit code: from now on the command's process ignores Ctrl-C, which
    would change nothing but interrupt its exit (buffered output, ``atexit``) with a traceback."""
    if _OWNS_SIGINT:
        _signal.signal(_signal.SIGINT, _signal.SIG_IGN)


def _interrupted() -> int:
    _finished()  # before the line: a second Ctrl-C is ignored from here (sooner, it left with this line)
    print("etstore: interrupted", file=sys.stderr)
    return 130


def _engine_interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) is a Ctrl-C: DuckDB turns one that lands while it runs
    a query into its own error (``RuntimeError('Query interrupted')`` in DuckDB 2, its
    ``InterruptException`` before), which the store may wrap in turn."""
    seen: BaseException | None = exc
    for _ in range(8):  # the chain of causes, bounded
        if seen is None:
            return False
        if isinstance(seen, KeyboardInterrupt) or type(seen).__name__ == "InterruptException":
            return True
        if isinstance(seen, RuntimeError) and str(seen) == "Query interrupted":
            return True
        seen = seen.__cause__ or seen.__context__
    return False
