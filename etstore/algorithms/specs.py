"""Which algorithm expands which collective: algorithm specs and their parsing.

A spec is a generator name, optionally with chunks per rank (``"ring"``,
``"ring:2"``), or an algorithm :class:`~etstore.model.Trace`. Collective types may
be spelt any way :mod:`etstore.collective` knows (``allreduce``, ``all-reduce``,
``ALL_REDUCE``); they are keyed by their Chakra name.
"""

from __future__ import annotations

from collections.abc import Mapping

from etstore.algorithms.generators import GENERATORS
from etstore.algorithms.nccl import NCCL_GENERATORS, NCCL_PICK_COLLECTIVES, check_nccl_spec, is_nccl_spec
from etstore.collective import COLLECTIVE_NAMES, chakra_name
from etstore.errors import OptionError
from etstore.model import Trace

__all__ = ["AlgorithmSpec", "algorithms_by_type", "chakra_type", "parse_by_type", "parse_generator"]

AlgorithmSpec = str | Trace  # a generator ("ring", "ring:2" = 2 chunks per rank) or an algorithm trace


def chakra_type(name: str) -> str:
    """Chakra collective name for any spelling (``allreduce``, ``all-reduce``, ``ALL_REDUCE``).

    Raises
    ------
    OptionError
        The name is no collective; the message lists the known ones.
    """
    chakra = chakra_name(name)
    if chakra is not None:
        return chakra
    raise OptionError(f"unknown collective {name!r}; expected one of {', '.join(COLLECTIVE_NAMES)}")


def parse_by_type(text: str) -> dict[str, str]:
    """``"allreduce=ring,allgather=direct"`` → ``{"ALL_REDUCE": "ring", "ALL_GATHER": "direct"}``.

    Parameters
    ----------
    text
        Comma-separated ``COLLECTIVE=ALGORITHM`` items; blank items are ignored.

    Returns
    -------
    dict
        Algorithm name (not yet resolved) per Chakra collective type.

    Raises
    ------
    OptionError
        An item is not ``COLLECTIVE=ALGORITHM``, names an unknown collective, or the
        text holds no item.

    Examples
    --------
    >>> parse_by_type("allreduce=ring, all-gather=my-algo")
    {'ALL_REDUCE': 'ring', 'ALL_GATHER': 'my-algo'}
    """
    out: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise OptionError(
                f"algorithm-per-collective item {item.strip()!r}: expected COLLECTIVE=ALGORITHM"
            )
        out[chakra_type(key.strip())] = value.strip()
    if not out:
        raise OptionError(
            f"algorithm-per-collective list {text!r}: expected COLLECTIVE=ALGORITHM[,COLLECTIVE=ALGORITHM...]"
        )
    return out


def parse_generator(spec: str) -> tuple[str, int]:
    """``"ring:2"`` → ``("ring", 2)``: a generator name and its chunks per rank (default 1).

    An NCCL spec (``nccl``, ``nccl-ring:24:ll128``, ...) comes back whole with 1: its
    fields are channels, protocol and loops (:func:`etstore.algorithms.nccl.parse_nccl`).

    Raises
    ------
    OptionError
        Unknown generator (the message lists them) or a chunk count that is not a
        positive integer.
    """
    if is_nccl_spec(
        spec
    ):  # NCCL's, whose fields after ':' are channels, protocol ... (etstore.algorithms.nccl)
        check_nccl_spec(spec)
        return spec, 1
    name, _, chunks = spec.partition(":")
    if name not in GENERATORS:
        raise OptionError(
            f"algorithm {spec!r} is neither a stored algorithm nor a generator; generators: "
            f"{', '.join(GENERATORS)} (optionally NAME:CHUNKS), nccl, nccl-ring, nccl-tree"
        )
    if chunks and (not chunks.isdigit() or int(chunks) < 1):
        raise OptionError(f"algorithm {spec!r}: chunks after ':' must be a positive integer")
    return name, int(chunks) if chunks else 1


def algorithms_by_type(algorithms: AlgorithmSpec | Mapping[str, AlgorithmSpec]) -> dict[str, AlgorithmSpec]:
    """Per Chakra collective type, the algorithm spec.

    A mapping's keys may be spelt any way (``allreduce``, ``ALL_REDUCE``); a single
    generator covers every collective it implements, a single trace the one in its
    ``params["collective"]`` (every type when it names none).

    Raises
    ------
    OptionError
        Unknown collective or generator.
    """
    if isinstance(algorithms, Mapping):
        out = {chakra_type(str(k)): v for k, v in algorithms.items()}
        for spec in out.values():
            if isinstance(spec, str):
                parse_generator(spec)
        if "REDUCE_SCATTER" in out:
            out.setdefault("REDUCE_SCATTER_BLOCK", out["REDUCE_SCATTER"])
        return out
    if isinstance(algorithms, str):
        gen, _ = parse_generator(algorithms)
        head = gen.split(":", 1)[0]
        shorts = (
            NCCL_PICK_COLLECTIVES
            if head == "nccl"
            else NCCL_GENERATORS[head]
            if head in NCCL_GENERATORS
            else GENERATORS[gen].collectives
        )
        return {c: algorithms for c, s in COLLECTIVE_NAMES.items() if s in shorts}
    coll = algorithms.params.get("collective")
    if not coll:  # the caller vouches for it: every selected collective
        return dict.fromkeys(COLLECTIVE_NAMES, algorithms)
    return {c: algorithms for c, s in COLLECTIVE_NAMES.items() if s == str(coll)}
