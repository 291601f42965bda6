"""Trace management commands: show, rm, export, workload (``ingest`` and ``ls`` have their own modules)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from etstore.app.summary import summarize
from etstore.cli._common import add_format, open_from_args, status_words
from etstore.cli._console import styled
from etstore.cli._tables import add_table, chosen_table, one_row, print_table
from etstore.errors import OptionError, TraceFormatError
from etstore.formats._guard import values_in_range
from etstore.formats.comm_groups import write_astra_et
from etstore.formats.export import EXPORT_FORMATS, export_trace
from etstore.report.recorded_timeline import recorded_timeline
from etstore.workloads import transformer

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register"]


_SHOW_TABLES = {
    "ops": "ops and duration per rank and type",
    "collectives": "collective nodes by type, size and group",
    "missing": "dependencies on absent nodes per rank and kind",
    "trace": "the trace's catalog row",
}


def _show(args: argparse.Namespace, console: Console) -> int:
    with open_from_args(args, read_only=True) as store:
        info = store.info(args.trace)
        s = summarize(store, args.trace)
    tables = {
        "ops": (s.by_type_rank, "ops per rank and type"),
        "collectives": (s.collectives, "collectives"),
        "missing": (s.missing, "dependencies on absent nodes"),
        "trace": (one_row(info.as_row()), None),
    }
    only = chosen_table(args)
    if only is not None:
        table, title = tables[only]
        print_table(table, args.format, title=title, console=console)
        return 0
    console.print(
        styled(
            (info.name, "bold"),
            f" ({info.kind}) {info.ranks} ranks, {info.ops:,} ops, "
            f"{info.deps:,} deps, {info.missing:,} missing deps, {info.messages:,} messages",
        )
    )
    for name in ("ops", "collectives", "missing"):
        table, title = tables[name]
        if name == "ops" or table.num_rows:
            print_table(table, "table", title=title, console=console)
    return 0


def _rm(args: argparse.Namespace, console: Console) -> int:
    with open_from_args(args) as store:
        # rm is idempotent: a name removed lately, by an rm that finished, or was interrupted past
        # its commit point and finished by a later command, is reported as gone, not unknown
        finished_now = store.finished_removals()
        gone = set(store.removed_names())
        for name in args.traces:
            if name in gone:
                how = "this command finished its interrupted removal" if name in finished_now else ""
                console.print(f"{name} was already removed" + (f" ({how})" if how else ""))
                continue
            store.remove(name)  # one transaction: quick, no bar to draw
            console.print(f"removed {name}")
    return 0


def _export(args: argparse.Namespace, console: Console) -> int:
    with open_from_args(args, read_only=True) as store:
        trace = store.load(args.trace)
    paths = export_trace(
        trace,
        args.out,
        format=args.format,
        coll_size=args.coll_size,
        gzip=args.gzip,
        proto=args.proto,
        verbatim=args.verbatim,
        timeline=recorded_timeline,  # the layout of `etstore timeline`
    )
    # one line however many ranks: the count, and the first and last file written
    if len(paths) == 1:
        console.print(f"wrote 1 file: {paths[0]}", highlight=False, soft_wrap=True)
    elif paths:
        console.print(
            f"wrote {len(paths)} files: {paths[0]} ... {paths[-1].name}", highlight=False, soft_wrap=True
        )
    # what the files differ in from the stored trace, so that ASTRA-sim runs them (one line each)
    for change in paths.changes:
        console.print(f"changed for ASTRA-sim: {change}", highlight=False, soft_wrap=True)
    return 0


def _model(args: argparse.Namespace) -> Any:
    """The transformer the options describe; a shape whose sizes or durations pass 64 bits (they
    grow as hidden² x tokens) is refused in one line, as is a negative seed."""
    if args.seed < 0:
        raise OptionError(f"workload: --seed must be at least 0, got {args.seed}")
    try:
        with values_in_range("workload"):
            return transformer(
                ranks=args.ranks,
                layers=args.layers,
                tp=args.tp,
                hidden=args.hidden,
                seq_tokens=args.seq_tokens,
                seed=args.seed,
                name=args.name,
            )
    except TraceFormatError:
        raise OptionError(
            f"workload: --hidden {args.hidden:,} with --seq-tokens {args.seq_tokens:,} makes message "
            "sizes or durations past 64 bits"
        ) from None


def _workload(args: argparse.Namespace, console: Console) -> int:
    trace = _model(args)
    if args.out:
        for path in write_astra_et(trace, args.out):  # integer pg_names + comm-group JSON for ASTRA-sim
            console.print(str(path), highlight=False, soft_wrap=True)
    if args.ingest:
        with open_from_args(args) as store:
            report = store.ingest(trace, name=args.name)
        console.print(
            styled(
                "stored ",
                (report.trace.name, "bold"),
                f": {report.trace.ops:,} ops, {report.trace.ranks} ranks"
                + ("" if status_words(report) == "new" else f" ({status_words(report)})"),
            ),
            soft_wrap=True,
        )
    if not args.out and not args.ingest:
        raise OptionError("workload: give --out PREFIX (write .et files) and/or --ingest")
    return 0


def register(sub: Any) -> None:
    sp = sub.add_parser("show", help="counts per type and rank, collectives by type and size")
    sp.add_argument("trace")
    add_format(sp)
    add_table(sp, _SHOW_TABLES, "ops")
    sp.set_defaults(handler=_show)

    sp = sub.add_parser("rm", help="remove traces")
    sp.add_argument("traces", nargs="+")
    sp.set_defaults(handler=_rm)

    sp = sub.add_parser("export", help="write a stored trace back to files")
    sp.add_argument("trace")
    sp.add_argument(
        "--out",
        required=True,
        help="output prefix: writes <PREFIX>.<rank>.et (.json), <PREFIX>.xml (msccl-xml) or <PREFIX>.json "
        "(mscclpp)",
    )
    sp.add_argument(
        "--format",
        choices=EXPORT_FORMATS,
        default="et",
        help="et: Chakra per rank as ASTRA-sim runs them (default); json: Chakra JSON; msccl-xml: "
        "MSCCL-IR for MSCCL/RCCL; mscclpp: an execution plan for MSCCL++'s executor",
    )
    sp.add_argument(
        "--coll-size",
        metavar="SIZE",
        help="algorithm traces: write comm_size for a collective of SIZE (e.g. 1MiB), as ASTRA-sim's "
        "custom collectives read it",
    )
    sp.add_argument("--proto", choices=("Simple", "LL", "LL128"), help="msccl-xml: protocol attribute")
    sp.add_argument(
        "--gzip", action="store_true", help="gzip the .et files (ASTRA-sim reads only plain files)"
    )
    sp.add_argument(
        "--verbatim",
        action="store_true",
        help="et: write the trace exactly as stored, without the changes ASTRA-sim needs (printed "
        "otherwise: METADATA nodes dropped, pg_names it cannot read renamed, ...)",
    )
    sp.set_defaults(handler=_export)

    sp = sub.add_parser(
        "workload", help="generate a synthetic transformer training step (data x tensor parallel)"
    )
    sp.add_argument("--ranks", type=int, default=8, help="ranks (a multiple of --tp; default 8)")
    sp.add_argument("--layers", type=int, default=4, help="transformer layers (default 4)")
    sp.add_argument("--tp", type=int, default=2, help="tensor-parallel degree (default 2)")
    sp.add_argument("--hidden", type=int, default=4096, help="hidden size (default 4096)")
    sp.add_argument("--seq-tokens", type=int, default=2048, help="tokens per step (default 2048)")
    sp.add_argument("--seed", type=int, default=0, help="seed of the ±10%% compute jitter")
    sp.add_argument("--name", default="transformer", help="trace name (default transformer)")
    sp.add_argument("--out", help="write <OUT>.<rank>.et files (integer pg_names) and <OUT>.comm_groups.json")
    sp.add_argument("--ingest", action="store_true", help="also store it")
    sp.set_defaults(handler=_workload)
