"""``etstore rescale``: store a trace with its data- or tensor-parallel size changed.

Why a command of its own: the result is a new stored trace with its parent, as ``expand``
and ``rewrite`` make, and what the rescale could not know (compute scaled by the shard
ratio) is said on the way, one line each (``docs/whatif.md``, "Re-scaling a trace").
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from etstore.app.rescale import rescale_stored
from etstore.cli._common import add_format, open_from_args, stored_status
from etstore.cli._render import render

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register"]


def _layout(part: dict[str, Any]) -> str:
    return f"{part['ranks']} ranks (dp {part['dp']} x tp {part['tp']})"


def _rescale(args: argparse.Namespace, console: Console) -> int:
    with open_from_args(args) as store:
        report = rescale_stored(
            store,
            args.trace,
            ranks=args.ranks,
            dp=args.dp,
            tp=args.tp,
            pp=args.pp,
            source_tp=args.from_tp,
            name=args.name,
        )
    info = report.trace
    derived = info.params.get("rescaled") or {}
    row = {
        "trace": info.name,
        "parent": args.trace,
        "from": _layout(derived["from"]),
        "to": _layout(derived["to"]),
        **stored_status(report),
        "ops": info.ops,
        "deps": info.deps,
    }
    render(pa.Table.from_pylist([row]), args.format, console=console)
    for note in derived.get("notes") or []:  # beside csv or json, stdout stays the one table
        if args.format == "table":
            console.print(note, highlight=False, markup=False, soft_wrap=True)
        else:
            sys.stderr.write(f"etstore: {note}\n")
    return 0


def register(sub: Any) -> None:
    """Add ``rescale`` to the subparsers ``sub``."""
    sp = sub.add_parser(
        "rescale",
        help="store a trace re-scaled to another data- or tensor-parallel size",
        description=(
            "Store a new trace (parent TRACE) with its parallelism changed as the framework would: "
            "data parallel grows its groups and keeps gradient sizes; tensor parallel scales compute "
            "and gradient sizes with the shard. Pipeline parallelism, and what cannot be rescaled "
            "correctly, is refused in one line; see docs/whatif.md."
        ),
    )
    sp.add_argument("trace", help="stored workload trace (generated, or a recorded DDP step)")
    sp.add_argument("--ranks", type=int, required=True, metavar="N", help="ranks of the new trace")
    sp.add_argument("--dp", type=int, default=None, metavar="D", help="data-parallel degree (default N / tp)")
    sp.add_argument(
        "--tp", type=int, default=None, metavar="T", help="tensor-parallel degree (default: the trace's)"
    )
    sp.add_argument("--pp", type=int, default=None, metavar="P", help="pipeline-parallel degree: only 1")
    sp.add_argument(
        "--from-tp",
        type=int,
        default=None,
        metavar="T",
        help="the trace's own tensor-parallel degree, where its params do not say (recordings: 1)",
    )
    sp.add_argument("--name", default=None, help="name of the new trace (default: <trace>-<N>r[-tp<T>])")
    add_format(sp)
    sp.set_defaults(handler=_rescale)
