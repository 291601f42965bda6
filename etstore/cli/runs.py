"""The ``runs`` command: the store's simulations, measured runs, tuner runs and calibrations."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from etstore.cli._common import add_format, open_from_args
from etstore.cli._render import render
from etstore.store.runs import RUN_KINDS, list_runs

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register"]


def _runs(args: argparse.Namespace, console: Console) -> int:
    with open_from_args(args, read_only=True) as store:
        table = list_runs(store, tuple(args.kind) if args.kind else None)
    render(table, args.format, console=console)
    return 0


def register(sub: Any) -> None:
    sp = sub.add_parser("runs", help="list simulation, measured, tuner and calibration runs")
    sp.add_argument(
        "--kind", action="append", choices=RUN_KINDS, help="only runs of this kind (repeatable; default: all)"
    )
    add_format(sp)
    sp.set_defaults(handler=_runs)
