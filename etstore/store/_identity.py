"""What makes two traces the same content in a store.

For every kind: the kind, every field of every node, every dependency and the
metadata frame (:func:`~etstore.model.content_hash`). For an algorithm, also the
parameters that are its MSCCL-IR header (:data:`HEADER_PARAMS`: ``proto``,
``minBytes``/``maxBytes``, ``nchannels``, ``nchunksperloop``, ``inplace``/``outofplace``,
``name``, ``redop`` and any other ``<algo>`` attribute, the ``<gpu>`` buffer sizes),
which a runtime reads as much as the steps, so two files that differ there are two
algorithms. Other parameters describe where a trace came from (which workload, under
which names, which generator) and belong to each name, not to the content.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from etstore.digest import content_hash
from etstore.errors import StoreError
from etstore.model import Trace, TraceKind

__all__ = ["HEADER_PARAMS", "Counted", "choose_name", "identity", "may_be_stored", "upgraded_identity"]


HEADER_PARAMS = (
    "collective",
    "ngpus",
    "nchunksperloop",
    "inplace",
    "outofplace",
    "algo_name",
    "proto",
    "nchannels",
    "minBytes",
    "maxBytes",
    "gpu_chunks",
    "xml_attrs",
)
"""The parameters of an algorithm that are its MSCCL-IR header (what the writer turns into
``<algo>`` and ``<gpu>`` attributes, ``xml_attrs`` holding any other ``<algo>`` attribute such
as ``redop``). Where it came from (``producer``, ``generator``, ``seed``, ...) and how a file
spelled its header (``xml_header``) do not count: the same steps and header generated or read
back from the XML written for them are one algorithm."""


def _canonical_params(params: Mapping[str, Any]) -> bytes:
    """The header parameters as the store keeps them (JSON, keys sorted), so a loaded trace
    hashes alike."""
    header = {k: params[k] for k in HEADER_PARAMS if k in params}
    return json.dumps(header, sort_keys=True, default=str, separators=(",", ":")).encode()


def upgraded_identity(digest: str, kind: str, params: Mapping[str, Any]) -> str:
    """The identity of a trace whose :func:`~etstore.model.content_hash` is ``digest``.

    Parameters
    ----------
    digest
        ``content_hash`` of the trace (hex).
    kind
        The trace's kind.
    params
        The trace's parameters (only algorithms use them).

    Returns
    -------
    str
        ``digest`` itself for every kind but ``algorithm``; for an algorithm, a SHA-1
        of ``digest`` and the canonical JSON of its :data:`HEADER_PARAMS` (hex).

    Notes
    -----
    O(size of params). Used for new traces (:func:`identity`) and to re-key contents
    stored by a store format that did not count parameters.
    """
    if kind != TraceKind.ALGORITHM.value:
        return digest
    h = hashlib.sha1(digest.encode(), usedforsecurity=False)
    h.update(b"\0")
    h.update(_canonical_params(params))
    return h.hexdigest()


def identity(trace: Trace) -> str:
    """The store's identity of ``trace`` (see the module docstring); O(bytes) over its tables."""
    return upgraded_identity(content_hash(trace), str(trace.kind), trace.params)


class Counted(Protocol):
    """What :func:`may_be_stored` reads of a stored content (a catalog record has it)."""

    kind: str
    ops: int
    deps: int


def may_be_stored(trace: Trace, contents: Iterable[Counted]) -> bool:
    """Whether one of the stored ``contents`` could be ``trace``'s content.

    The identity covers the kind and every row, so content with another kind or other
    numbers of ops or deps never has ``trace``'s identity: an ingest then need not know it
    before writing, and computes it beside the load.

    Parameters
    ----------
    trace
        The trace about to be stored.
    contents
        The stored (ready) contents (catalog records).

    Returns
    -------
    bool
        True when some content has the trace's kind and numbers of ops and deps.

    Notes
    -----
    O(contents).
    """
    kind = str(trace.kind)
    return any(c.kind == kind and c.ops == trace.num_ops and c.deps == trace.num_deps for c in contents)


def choose_name(
    taken: Mapping[str, int], wanted: str, *, explicit: bool, trace_id: int | None
) -> tuple[str, bool]:
    """The name to store content ``trace_id`` under, and whether that name already points at it.

    ``taken`` maps every stored name to its content's id. A name the user chose
    (``explicit``) is used as given; a default name that other content holds gets the
    first free ``-2``, ``-3``, ... suffix instead.

    Raises
    ------
    StoreError
        An explicit name already points at other content.
    """
    candidates = [wanted] if explicit else [wanted, *(f"{wanted}-{i}" for i in range(2, len(taken) + 3))]
    for cand in candidates:
        if cand not in taken:
            return cand, False
        if trace_id is not None and taken[cand] == trace_id:
            return cand, True
    raise StoreError(f"a different trace is already named {wanted!r}; pick another name or remove it")
