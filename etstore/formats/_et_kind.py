"""Which ``.et`` files are a collective algorithm: the form ``export`` writes for ASTRA-sim's
custom collectives (:mod:`etstore.formats.algorithm_et`), recognised when read back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from etstore.proto import GlobalMetadata

__all__ = ["ALGORITHM_SCHEMA", "AlgorithmScan", "algorithm_metadata", "algorithm_params"]

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
    O(V) over the ops, O(R) metadata parses. :class:`AlgorithmScan` gives the same answer
    for a trace read part by part.
    """
    scan = AlgorithmScan()
    scan.add(ops, metadata)
    return scan.params()


class AlgorithmScan:
    """:func:`algorithm_params` over a trace read in parts: :meth:`add` each part's ops and
    its rank files' metadata, then :meth:`params`. What it keeps is a few numbers and the
    set of collectives named, whatever the trace's size."""

    def __init__(self) -> None:
        self.collectives: set[str | None] = set()
        self.files = 0
        self.ops = 0
        self.foreign_types = False  # a node that is no send, receive or local step
        self.comm = 0  # sends and receives
        self.comm_without_chunks = 0
        self.max_chunks: int | None = None

    @property
    def ruled_out(self) -> bool:
        """Whether what was added already makes the trace a workload, whatever follows."""
        return (
            None in self.collectives
            or len(self.collectives) > 1
            or self.foreign_types
            or self.comm_without_chunks > 0
        )

    def add(self, ops: pa.Table, metadata: Sequence[bytes | None]) -> None:
        """One part: its ops and the metadata of each of its rank files."""
        self.collectives.update(_collective(blob) for blob in metadata)
        self.files += len(metadata)
        self.ops += ops.num_rows
        if self.ruled_out or ops.num_rows == 0:
            return
        if not pc.all(pc.is_in(ops["type"], pa.array(_ALGORITHM_TYPES))).as_py():
            self.foreign_types = True
            return
        comm = pc.is_in(ops["type"], pa.array(_ALGORITHM_TYPES[:2]))
        chunks = ops["total_chunk_cnt"].filter(comm)
        self.comm += len(chunks)
        self.comm_without_chunks += chunks.null_count
        most = pc.max(ops["total_chunk_cnt"]).as_py()
        if most is not None:
            self.max_chunks = most if self.max_chunks is None else max(self.max_chunks, most)

    def params(self) -> dict[str, Any] | None:
        """The algorithm's ``params`` (as :func:`algorithm_params` gives them), or None."""
        if self.ruled_out or len(self.collectives) != 1 or self.ops == 0 or self.comm == 0:
            return None
        assert self.max_chunks is not None  # every send and receive has a chunk count
        return {
            "collective": str(next(iter(self.collectives))),
            "ngpus": self.files,
            "nchunksperloop": int(self.max_chunks),
            "producer": "chakra-et",
        }
