"""Collective names: Chakra's enum names, the short names algorithm traces use, every spelling.

Chakra names a collective ``ALL_REDUCE``; algorithm traces, MSCCL-IR and the CLI say
``allreduce``; people type ``all-reduce``, ``all_reduce`` or ``ar``. Every stage maps a
spelling through this module, so one table decides what a name means.
"""

from __future__ import annotations

__all__ = [
    "ALGORITHM_COLLECTIVES",
    "COLLECTIVE_NAMES",
    "chakra_name",
    "short_name",
]

# Chakra CollectiveCommType name -> the collective's name in algorithm traces (``params["collective"]``).
COLLECTIVE_NAMES: dict[str, str] = {
    "ALL_REDUCE": "allreduce",
    "REDUCE": "reduce",
    "ALL_GATHER": "allgather",
    "GATHER": "gather",
    "SCATTER": "scatter",
    "BROADCAST": "broadcast",
    "ALL_TO_ALL": "alltoall",
    "REDUCE_SCATTER": "reducescatter",
    "REDUCE_SCATTER_BLOCK": "reducescatter",
    "BARRIER": "barrier",
}

# The collectives an algorithm trace can implement and the checker can prove.
ALGORITHM_COLLECTIVES: tuple[str, ...] = (
    "allreduce",
    "allgather",
    "reducescatter",
    "alltoall",
    "broadcast",
    "reduce",
)

_ABBREVIATIONS = {
    "ar": "allreduce",
    "ag": "allgather",
    "rs": "reducescatter",
    "a2a": "alltoall",
    "bcast": "broadcast",
}
_SHORT = {short: short for short in COLLECTIVE_NAMES.values()}
_SHORT.update({chakra.replace("_", "").lower(): short for chakra, short in COLLECTIVE_NAMES.items()})
_SHORT.update(_ABBREVIATIONS)
# one Chakra name per short name (REDUCE_SCATTER, not REDUCE_SCATTER_BLOCK), unless named exactly
_CHAKRA = {short: chakra for chakra, short in reversed(list(COLLECTIVE_NAMES.items()))}
_EXACT = {chakra.replace("_", "").lower(): chakra for chakra in COLLECTIVE_NAMES}


def _key(text: str) -> str:
    return text.replace("-", "").replace("_", "").replace(" ", "").lower()


def short_name(text: str) -> str | None:
    """``"allreduce"`` for any spelling (``ALL_REDUCE``, ``all-reduce``, ``ar``); None if unknown.

    Examples
    --------
    >>> short_name("ALL_REDUCE"), short_name("reduce-scatter"), short_name("a2a"), short_name("ring")
    ('allreduce', 'reducescatter', 'alltoall', None)
    """
    return _SHORT.get(_key(text))


def chakra_name(text: str) -> str | None:
    """``"ALL_REDUCE"`` for any spelling; None if unknown.

    Examples
    --------
    >>> chakra_name("allreduce"), chakra_name("reduce-scatter"), chakra_name("REDUCE_SCATTER_BLOCK")
    ('ALL_REDUCE', 'REDUCE_SCATTER', 'REDUCE_SCATTER_BLOCK')
    """
    exact = _EXACT.get(_key(text))
    if exact is not None:
        return exact
    short = short_name(text)
    return None if short is None else _CHAKRA[short]
