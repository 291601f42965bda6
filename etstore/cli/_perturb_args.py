"""``--slow``, ``--scale``, ``--jitter``, ``--seed``: what-if perturbations of compute (replay, sim)."""

from __future__ import annotations

import argparse

from etstore.errors import OptionError
from etstore.sim.perturb import OP_CLASSES, Perturbation, parse_slow

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
        help=f"multiply the compute of an op class by F ({', '.join(OP_CLASSES)}; repeatable): gpu=0.5",
    )
    sp.add_argument("--jitter", type=float, default=0.0, help="log-normal noise on each compute op (sigma)")
    sp.add_argument("--seed", type=int, default=0, help="seed of --jitter")


def perturbation_from(args: argparse.Namespace) -> Perturbation | None:
    """The perturbation the options ask for, or None."""
    slow: dict[int, float] = {}
    for text in args.slow or ():
        slow.update(parse_slow(text))
    scale: dict[str, float] = {}
    for text in args.scale or ():
        name, _, value = text.partition("=")
        try:
            scale[name.strip()] = float(value)
        except ValueError:
            raise OptionError(f"--scale {text!r}: expected CLASS=FACTOR, e.g. gpu=0.5") from None
    p = Perturbation(slow=slow, scale=scale, jitter=args.jitter, seed=args.seed)
    return None if p.is_identity else p
