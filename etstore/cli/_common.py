"""Helpers shared by the command modules: store opening, parameters, progress, formats.

Importing this module loads no backend: :mod:`etstore.store` imports its backends on
first use, so ``etstore ls``, which lists an embedded store from its catalog alone
(:mod:`etstore.cli.listing`), starts without DuckDB, Ladybug, numpy or pyarrow.

A command that writes an embedded store makes Ctrl-C end it at once (within a few
milliseconds, whatever the engines are doing): what it was writing is rolled back, or,
for a removal past its commit point, finished, by the next command on the store, from
the store's journal (``docs/reliability.md``). Rolling back a large ingest there and
then could take as long as the ingest did.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

from etstore import store as stores  # the package; its backends load on first use (see above)
from etstore.cli import _interrupt_command
from etstore.cli._console import DeferredConsole
from etstore.cli._render import FORMATS, json_text
from etstore.errors import OptionError, StoreError
from etstore.progress import ProgressFn
from etstore.store._location import resolve_location
from etstore.store._neo4j_target import parse_url, writes_refused

if TYPE_CHECKING:
    from rich.console import Console

    from etstore.store import EmbeddedStore, IngestReport, Store

__all__ = [
    "add_format",
    "open_from_args",
    "open_to_record",
    "params",
    "phase_step",
    "print_json",
    "progress",
    "progress_to",
    "say",
    "status_words",
    "stored_status",
]


def add_format(sp: argparse.ArgumentParser) -> None:
    """The ``--format table|csv|json`` option every listing command takes."""
    sp.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")


MAX_PARAM_DEPTH = 200
"""Deepest nesting of lists and objects a ``--param`` value may have, as for JSON traces: the
engines' drivers convert parameters recursively, so a deeper one would end in a traceback."""


def _depth(value: Any) -> int:
    """Levels of lists and objects in a decoded JSON value (iterative: no recursion to exhaust)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def _parse_param(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise OptionError(f"--param {text!r}: expected NAME=VALUE")
    key, raw = text.split("=", 1)
    too_deep = False
    try:
        value = json.loads(raw)
    except RecursionError:  # the decoder recurses per level: nested past the interpreter's limit
        value, too_deep = None, True
    except ValueError:  # not JSON (json.JSONDecodeError), or an integer of too many digits: text
        value = raw
    if too_deep or _depth(value) > MAX_PARAM_DEPTH:
        raise OptionError(
            f"--param {key.strip()}: the value nests more than {MAX_PARAM_DEPTH} lists and objects deep"
        )
    return key.strip(), value


def params(args: argparse.Namespace) -> dict[str, Any]:
    """``--param NAME=VALUE`` options as a dict; VALUE is JSON when it parses."""
    return dict(_parse_param(p) for p in args.param or [])


def stored_status(report: IngestReport) -> dict[str, Any]:
    """``status`` and ``same_as`` of a stored trace, as every command that stores one prints them.

    ``new``: new content under its name; ``new name``: the content was stored already, under
    the name in ``same_as``, and only this name was added; ``already stored``: the name
    already pointed at this content, nothing was written.
    """
    if not report.created:
        return {"status": "already stored", "same_as": None}
    if report.same_as is not None:
        return {"status": "new name", "same_as": report.same_as}
    return {"status": "new", "same_as": None}


def status_words(report: IngestReport) -> str:
    """:func:`stored_status` for a sentence: ``new``, ``already stored`` or ``new name of X's content``."""
    got = stored_status(report)
    return f"new name of {got['same_as']}'s content" if got["same_as"] else str(got["status"])


def say(line: str) -> None:
    """One line on stderr, ``etstore: `` first (waiting, recovering, interrupted)."""
    sys.stderr.write(f"etstore: {line}\n")
    sys.stderr.flush()


def _purpose(args: argparse.Namespace) -> str:
    """What this process does to the store, as processes waiting for it are told."""
    return str(getattr(args, "command", None) or "etstore")


def _refuse_server_writes(args: argparse.Namespace) -> None:
    """A command that writes, given a server's URL: refused in one line before anything is
    opened (a server holds what ``etstore publish`` sends, :mod:`etstore.store.neo4j`); one
    that takes ``--no-record`` is told it reads the server with it."""
    location, backend = resolve_location(args.store)
    if backend == "neo4j":
        hint = "; or pass --no-record to read it without recording" if hasattr(args, "no_record") else ""
        raise StoreError(
            f"etstore {_purpose(args)} writes; {writes_refused(parse_url(location).location)}{hint}"
        )


def open_from_args(args: argparse.Namespace, *, read_only: bool = False) -> Store:
    """The store ``--store`` names (default: ``$ETSTORE_STORE``, then ``./.etstore``).

    An embedded store waits ``--wait`` seconds for other processes (saying so on
    stderr), and one opened for writing makes Ctrl-C stop the command at once. A server's
    URL opens for reading only: a command that writes is refused in one line.
    """
    if not read_only:
        _refuse_server_writes(args)
    store = stores.open_store(
        args.store,
        write=not read_only,
        wait_s=getattr(args, "wait", None),
        notify=say,
        purpose=_purpose(args),
    )
    if not read_only and isinstance(store, stores.EmbeddedStore):
        _guard_interrupts(store)
    return store


@contextmanager
def open_to_record(args: argparse.Namespace) -> Iterator[Store | None]:
    """The store a command records into (``--store``), opened for writing; with
    ``--no-record``, that store read-only, or None where no store exists yet.

    Why: opening a directory creates a store there; a command that records nothing
    (``sim --no-record`` on trace files) must leave nothing behind. A server's URL is read
    with ``--no-record`` only (recording there is refused in one line that says so).
    """
    if not args.no_record:
        _refuse_server_writes(args)
        with open_from_args(args) as store:
            yield store
    else:
        with open_inputs(args) as store:
            yield store


@contextmanager
def open_inputs(args: argparse.Namespace) -> Iterator[Store | None]:
    """The store a command reads its inputs from, read-only; None where no store exists yet.

    Why: a long command (a sweep) reads its inputs, closes the store and opens it for writing
    only to record, so other writers wait for a write, not for the whole computation.
    """
    if not getattr(args, "no_record", True):  # it will record: refused before the computation
        _refuse_server_writes(args)
    if stores.store_exists(args.store):
        with open_from_args(args, read_only=True) as store:
            yield store
    else:
        yield None


_writers: weakref.WeakSet[EmbeddedStore] = weakref.WeakSet()
_exiting = threading.Lock()
_guarded = False
_previous: Callable[[int, FrameType | None], object] = signal.default_int_handler
"""The SIGINT handler :func:`_on_interrupt` replaced: the command's, or Python's own."""


def _guard_interrupts(store: EmbeddedStore) -> None:
    """Make Ctrl-C during ``store``'s ingest or removal end the process at once (see the module
    docstring). Python runs a signal handler only between bytecodes of the main thread, which
    an engine call can hold for seconds, so a thread woken through the signal wakeup fd acts
    as well, whichever comes first."""
    global _guarded, _previous
    _writers.add(store)
    if _guarded or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler and previous is not _interrupt_command:
        return  # someone else handles Ctrl-C (an embedding program): leave it to them
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    if signal.set_wakeup_fd(write_end, warn_on_full_buffer=False) != -1:  # taken: put it back
        signal.set_wakeup_fd(-1)
        os.close(read_end)
        os.close(write_end)
        return
    _previous = previous
    signal.signal(signal.SIGINT, _on_interrupt)
    threading.Thread(target=_watch, args=(read_end,), name="etstore-interrupt", daemon=True).start()
    _guarded = True


def _watch(read_end: int) -> None:
    """Wake on every signal; a Ctrl-C during a write ends the process."""
    while True:
        try:
            got = os.read(read_end, 64)
        except OSError:
            return
        if not got:
            return
        if signal.SIGINT in got:
            _stop_writing()


def _on_interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGINT in the main thread: stop a write at once, else what the handler it replaced does
    (the usual KeyboardInterrupt)."""
    _stop_writing()
    _previous(signum, frame)


def _stop_writing() -> None:
    """If a store of this process is ingesting or removing, say what happens to it and exit 130."""
    for store in list(_writers):
        current = store.session.current
        if current is None or current.op == "open":
            continue
        with _exiting:
            if current.op == "remove":
                fate = f"the next command on {store.location} finishes the removal"
            else:
                fate = f"nothing of it is kept: the next command on {store.location} rolls it back"
            if sys.stdout.isatty():
                sys.stdout.write("\x1b[?25h\n")  # a progress bar hid the cursor
                sys.stdout.flush()
            say(f"interrupted during the {current.describe()}; {fate}")
            os._exit(130)


def progress(console: Console | DeferredConsole) -> Any:
    """A rich progress bar on a terminal (``label (phase)``, bar, done/total, elapsed, ETA), nothing
    when piped or under CI: the one renderer every command's long steps draw with."""
    if not console.is_terminal or os.environ.get("CI"):
        return None
    # imported on first use: piped output, and commands with no long step (ls), draw no bar
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("{task.description}", markup=False),  # names a trace or file: data, not markup
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console.console if isinstance(console, DeferredConsole) else console,  # rich's own
        transient=True,
    )


def phase_step(bar: Any, label: str) -> ProgressFn:
    """A library progress callback ``(phase, done, total)`` drawing one task of ``bar``.

    Each new phase restarts the task, so the ETA is the current phase's (phases have
    their own units: ops, events, trials, rows).
    """
    task = bar.add_task(label, total=None)
    current = [""]

    def step(phase: str, done: int, total: int) -> None:
        if phase != current[0]:
            current[0] = phase
            bar.reset(task, total=total or None, description=f"{label} ({phase})")
        bar.update(task, completed=done, total=total or None)

    return step


@contextmanager
def progress_to(console: Console | DeferredConsole, label: str) -> Iterator[ProgressFn | None]:
    """``with progress_to(console, "simulate x") as step:`` a :func:`phase_step` callback
    drawing on a live bar, or None when :func:`progress` draws nothing."""
    bar = progress(console)
    if bar is None:
        yield None
        return
    with bar:
        yield phase_step(bar, label)


def print_json(doc: Any) -> None:
    """Stable, indented, valid JSON on stdout (for ``--format json``; NaN and ±inf as null)."""
    sys.stdout.write(json_text(doc) + "\n")
