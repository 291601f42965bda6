"""Which ``.et`` files are a collective algorithm: the form ``export`` writes for ASTRA-sim's
custom collectives (:mod:`etstore.ingest.algorithm_et`), recognised when read back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from etstore.proto import GlobalMetadata

__all__ = ["ALGORITHM_SCHEMA", "algorithm_metadata", "algorithm_params"]

ALGORITHM_SCHEMA = "1.0.2-chakra.0.0.4"
"""The ``schema`` attribute of an algorithm file's GlobalMetadata (what collectiveapi writes)."""

_ALGORITHM_TYPES = ("COMM_SEND_NODE", "COMM_RECV_NODE", "COMP_NODE")


def algorithm_metadata(collective: str) -> bytes:
    """The GlobalMetadata an algorithm's files carry: ``schema`` and ``collective``, nothing else."""
    meta = GlobalMetadata()
    meta.attr.add(name="schema").string_val = ALGORITHM_SCHEMA
    meta.attr.add(name="collective").string_val = collective
    return meta.SerializeToString()


def _collective(blob: bytes | None) -> str | None:
    """The collective an algorithm file's metadata names; None for any other metadata."""
    if not blob:
        return None
    try:
        meta = GlobalMetadata.FromString(blob)
    except Exception:  # a foreign first frame: not ours (the decoder already judged it)
        return None
    attrs = {a.name: a for a in meta.attr}
    if meta.version or set(attrs) != {"schema", "collective"}:
        return None
    schema, coll = attrs["schema"], attrs["collective"]
    if schema.WhichOneof("value") != "string_val" or schema.string_val != ALGORITHM_SCHEMA:
        return None
    return coll.string_val if coll.WhichOneof("value") == "string_val" and coll.string_val else None


def algorithm_params(ops: pa.Table, metadata: Sequence[bytes | None]) -> dict[str, Any] | None:
    """An algorithm trace's ``params`` if these files are the form ``export`` writes for an
    algorithm, else None.

    The form (``write_algorithm_et``): every rank's GlobalMetadata holds exactly ``schema`` =
    :data:`ALGORITHM_SCHEMA` and ``collective`` (a string, the same on every rank); the nodes
    are sends, receives and local steps only, every send and receive carrying
    ``total_chunk_cnt``. collectiveapi's files, whose metadata also holds ``input_file``,
    stay workloads (what ASTRA-sim's own examples run them as).

    Returns
    -------
    dict or None
        ``collective``, ``ngpus`` (the rank files), ``nchunksperloop`` (the largest
        ``total_chunk_cnt``) and ``producer`` ``"chakra-et"``.

    Notes
    -----
    O(V) over the ops, O(R) metadata parses.
    """
    colls = {_collective(blob) for blob in metadata}
    if len(colls) != 1 or None in colls or ops.num_rows == 0:
        return None
    if not pc.all(pc.is_in(ops["type"], pa.array(_ALGORITHM_TYPES))).as_py():
        return None
    comm = pc.is_in(ops["type"], pa.array(_ALGORITHM_TYPES[:2]))
    chunks = ops["total_chunk_cnt"].filter(comm)
    if chunks.null_count or not len(chunks):
        return None
    return {
        "collective": str(next(iter(colls))),
        "ngpus": len(metadata),
        "nchunksperloop": int(pc.max(ops["total_chunk_cnt"]).as_py()),
        "producer": "chakra-et",
    }
