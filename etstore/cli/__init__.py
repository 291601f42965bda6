"""The ``etstore`` command: parses arguments, calls the library, renders the result.

Each public module of this package owns one group of commands and exposes
``register(sub)``, which adds its subparsers and binds each to a handler with
``set_defaults(handler=...)``. A handler takes ``(args, console)`` and returns the
exit code; library errors (:class:`~etstore.errors.EtstoreError`) become one line
on stderr and exit code 1.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from rich.console import Console

from etstore import __version__
from etstore.errors import EtstoreError
from etstore.store import ENV_VAR

__all__ = ["main"]


# Help lists command groups in pipeline order; groups not named here follow.
_ORDER = ("traces", "query", "algorithms", "topology", "simulate", "expand", "report")


def _command_modules() -> list[str]:
    found = {m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")}
    return [m for m in _ORDER if m in found] + sorted(found - set(_ORDER))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="etstore",
        description="Store, query, expand and simulate Chakra execution traces and collective algorithms.",
    )
    p.add_argument("--version", action="version", version=f"etstore {__version__}")
    p.add_argument(
        "--store",
        default=None,
        help=f"store directory or neo4j://user:pass@host:7687 URL (default: ${ENV_VAR} or ./.etstore)",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _command_modules():
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``etstore`` console script."""
    args = _parser().parse_args(argv)
    # piped output is read by scripts and wide terminals alike: do not fold tables at 80 columns
    console = Console(soft_wrap=False, width=None if sys.stdout.isatty() else 200)
    try:
        return int(args.handler(args, console))
    except EtstoreError as exc:
        print(f"etstore: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a file or directory the user named cannot be read or written
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        print(f"etstore: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("etstore: interrupted; nothing partial was kept", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
