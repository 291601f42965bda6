"""``--slow``, ``--scale``, ``--jitter``, ``--seed``, ``--degrade``, ``--fail``: what-if perturbations of
compute and links (replay, sim)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from etstore.errors import OptionError
from etstore.sim.perturb import LINK_SCALES, OP_CLASSES, Perturbation, parse_slow

__all__ = ["add_perturbation", "perturbation_from"]


def add_perturbation(sp: argparse.ArgumentParser) -> None:
    """Add the perturbation options to ``sp``."""
    sp.add_argument(
        "--slow",
        action="append",
        metavar="RANKS=F",
        help="multiply the compute of these ranks by F (a straggler; repeatable): 3=1.5, 0,4-7=2",
    )
    sp.add_argument(
        "--scale",
        action="append",
        metavar="CLASS=F",
        help=f"multiply the compute of an op class ({', '.join(OP_CLASSES)}) or every link's bandwidth "
        f"or latency ({', '.join(LINK_SCALES)}) by F (repeatable): gpu=0.5, bw=2",
    )
    sp.add_argument("--jitter", type=float, default=0.0, help="log-normal noise on each compute op (sigma)")
    sp.add_argument("--seed", type=int, default=0, help="seed of --jitter")
    sp.add_argument(
        "--degrade",
        action="append",
        metavar="LINK=F",
        help="multiply a link's bandwidth by F in (0, 1] (repeatable): 3-4=0.5 both directions, 3>4=0.5 one",
    )
    sp.add_argument(
        "--fail",
        action="append",
        metavar="LINK",
        help="remove links; traffic routes around them (repeatable, or joined by /): 3-4, 3>4, 3-4/5-6",
    )


def perturbation_from(args: argparse.Namespace) -> Perturbation | None:
    """The perturbation the options ask for, or None."""
    slow: dict[int, float] = {}
    for text in args.slow or ():
        slow.update(parse_slow(text))
    scale = dict(map(_pair_option("--scale", "CLASS=FACTOR, e.g. gpu=0.5"), args.scale or ()))
    degrade = dict(map(_pair_option("--degrade", "LINK=FACTOR, e.g. 3-4=0.5"), args.degrade or ()))
    fail = tuple(item.strip() for text in args.fail or () for item in text.split("/") if item.strip())
    p = Perturbation(
        slow=slow,
        scale=scale,
        jitter=args.jitter,
        seed=args.seed,
        degrade=degrade,
        fail=fail,
    )
    return None if p.is_identity else p


def _pair_option(option: str, form: str) -> Callable[[str], tuple[str, float]]:
    """A reader of ``NAME=FACTOR`` for ``option``, its error naming the expected ``form``."""

    def read(text: str) -> tuple[str, float]:
        name, _, value = text.partition("=")
        try:
            return name.strip(), float(value)
        except ValueError:
            raise OptionError(f"{option} {text!r}: expected {form}") from None

    return read
