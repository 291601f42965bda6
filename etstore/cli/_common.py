"""Helpers shared by the command modules: store opening, parameters, progress, formats."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from etstore.cli._render import FORMATS, json_text
from etstore.errors import OptionError
from etstore.ingest import read_trace
from etstore.model import Trace
from etstore.store import Store, open_store

__all__ = ["add_format", "open_from_args", "params", "print_json", "progress", "trace_from"]


def add_format(sp: argparse.ArgumentParser) -> None:
    """The ``--format table|csv|json`` option every listing command takes."""
    sp.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")


def _parse_param(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise OptionError(f"--param {text!r}: expected NAME=VALUE")
    key, raw = text.split("=", 1)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.strip(), value


def params(args: argparse.Namespace) -> dict[str, Any]:
    """``--param NAME=VALUE`` options as a dict; VALUE is JSON when it parses."""
    return dict(_parse_param(p) for p in args.param or [])


def open_from_args(args: argparse.Namespace, *, read_only: bool = False) -> Store:
    """The store ``--store`` names (default: ``$ETSTORE_STORE``, then ``./.etstore``)."""
    return open_store(args.store, read_only=read_only)


def progress(console: Console) -> Any:
    """A rich progress bar on a terminal, nothing when piped."""
    if not console.is_terminal or os.environ.get("CI"):
        return None
    return Progress(
        TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console, transient=True
    )


def trace_from(store: Store, spec: str) -> Trace:
    """A stored trace by name, or, when ``spec`` names an existing file or directory, read it."""
    if spec in {t.name for t in store.traces()}:
        return store.load(spec)
    if Path(spec).exists() or "/" in spec or any(ch in spec for ch in "*?["):
        return read_trace(spec)
    return store.load(spec)  # raises UnknownTraceError naming what is stored


def print_json(doc: Any) -> None:
    """Stable, indented, valid JSON on stdout (for ``--format json``; NaN and ±inf as null)."""
    sys.stdout.write(json_text(doc) + "\n")
