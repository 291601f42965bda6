"""``etstore tuner``: which choice wins per size bucket, and NCCL's example tuner plugin config of it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from etstore.app.tuner_config import BUCKET_COLUMNS, TunerChoices, run_choices, sweep_choices
from etstore.cli._common import add_format, open_inputs
from etstore.cli._console import warn
from etstore.cli._render import Rows, json_text, render
from etstore.cli._tables import note
from etstore.errors import OptionError, UnknownTraceError
from etstore.units import format_bytes

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register"]

_HELP = "which tuner choice wins per size bucket; write NCCL's example tuner plugin config"

_NO_CALIBRATION = (
    "--calibration {name!r}: a calibration fits one algorithm's network parameters to a measured "
    "run; it holds no choice between algorithms or protocols to write. Sweep its fitted spec "
    "(etstore sweep --topo SPEC --algo ring,tree) and use --sweep ID"
)


def _choices(args: argparse.Namespace) -> TunerChoices:
    """The one library call: a tuner run's or a sweep's winners (refusing what cannot have any)."""
    if args.calibration is not None:
        raise OptionError(_NO_CALIBRATION.format(name=args.calibration))
    if args.protocol is not None and args.run is not None:
        raise OptionError("--protocol is for --sweep: a tuner run's protocols are the ones it logged")
    with open_inputs(args) as store:
        if store is None:
            raise UnknownTraceError(
                f"no store at {args.store or '.etstore'}: ingest a tuner run or sweep first"
            )
        if args.run is not None:
            return run_choices(store.warehouse, args.run, topology=args.topology)
        return sweep_choices(store.warehouse, args.sweep, topology=args.topology, protocol=args.protocol)


def _range(low: int, high: int) -> str:
    """A size range for people: ``1 KiB..2 KiB-1``."""
    return f"{format_bytes(low)}" if low == high else f"{format_bytes(low)}..{format_bytes(high + 1)}-1"


def _where(b: dict[str, Any]) -> str:
    """A bucket in words: collective, sizes, ranks and nodes (and topology when named)."""
    known = [(k, b[k]) for k in ("ranks", "nodes", "topology") if b[k] is not None]
    return ", ".join(
        [f"{b['collective']} {b['size_bucket_bytes']}..{b['bucket_max_bytes']} B"]
        + [f"{k} {v}" for k, v in known]
    )


def _shown(choices: TunerChoices) -> Rows:
    """The table format's columns: the winner, runner-up, margin and what the config says."""
    rows = []
    for b in choices.buckets:
        nccl = (
            f"line {b['config_line']}: {b['nccl_algorithm']},{b['nccl_protocol']},{b['nccl_channels']}"
            if b["left_out"] is None
            else f"left out: {b['left_out']}"
        )
        pct = None if b["margin_pct"] is None else round(b["margin_pct"], 1)
        rows.append(
            {
                "topology": b["topology"],
                "collective": b["collective"],
                "ranks": b["ranks"],
                "nodes": b["nodes"],
                "sizes": _range(b["size_bucket_bytes"], b["bucket_max_bytes"]),
                "winner": b["choice"],
                "median_us": b["median_time_us"],
                "runner_up": b["runner_up"],
                "runner_up_us": b["runner_up_time_us"],
                "margin_us": b["margin_us"],
                "margin_%": pct,
                "tried": b["choices_tried"],
                "nccl config": nccl,
            }
        )
    columns = list(rows[0]) if rows else ["collective", "sizes", "winner"]
    return Rows(columns, rows)


def _write_csv(path: str, choices: TunerChoices) -> None:
    """The config file, and one line on stderr per bucket left out or written with a change."""
    Path(path).write_text(choices.config_text())
    for b in choices.left_out():
        warn(f"left out of {path}: {_where(b)}: {b['choice']}: {b['left_out']}")
    for b in choices.buckets:
        if b["note"] is not None:
            warn(f"{path} line {b['config_line']} ({_where(b)}): {b['note']}")


def _tuner(args: argparse.Namespace, console: Console) -> int:
    choices = _choices(args)
    if args.csv:
        _write_csv(args.csv, choices)
    if args.json:
        Path(args.json).write_text(json_text(choices.document()) + "\n")
    if args.format != "table":
        render(Rows(BUCKET_COLUMNS, choices.buckets), args.format, console=console)
    else:
        counts = (len(choices.buckets), len(choices.config), len(choices.left_out()))
        head = "{}: {} size bucket(s), {} NCCL config line(s), {} bucket(s) left out".format(
            choices.source["name"], *counts
        )
        render(_shown(choices), "table", title=head, console=console)
    for path, what in ((args.csv, "NCCL example tuner plugin config"), (args.json, "JSON")):
        if path:
            note(f"wrote {path} ({what})", args.format, console)
    return 0


def register(sub: Any) -> None:
    """Add ``tuner`` to the subparsers ``sub``."""
    sp = sub.add_parser(
        "tuner",
        help=_HELP,
        description="The fastest choice per (collective, ranks, nodes, power-of-two size bucket) of a "
        "tuner run or a bus-bandwidth sweep, with the runner-up and the margin; --csv writes the "
        "config of NCCL's example tuner plugin (NCCL_TUNER_CONFIG_FILE) that applies the winners.",
    )
    source = sp.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", help="a stored tuner run (name or id; etstore runs --kind tuner lists them)")
    source.add_argument("--sweep", metavar="ID", help="a stored bus-bandwidth sweep (its id; etstore sweep)")
    source.add_argument(
        "--calibration", metavar="NAME", help="refused, saying why: a calibration holds no choice"
    )
    sp.add_argument("--topology", help="only this topology (fingerprint of a run, spec of a sweep)")
    sp.add_argument(
        "--protocol",
        help="with --sweep: the NCCL protocol (ll, ll128, simple) its config lines get; without it a "
        "simulated winner is left out of the config",
    )
    sp.add_argument("--csv", metavar="FILE", help="write NCCL's example tuner plugin config (CSV) here")
    sp.add_argument("--json", metavar="FILE", help="write the config and every bucket as JSON here")
    add_format(sp)
    sp.set_defaults(handler=_tuner)
