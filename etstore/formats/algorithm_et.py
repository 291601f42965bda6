"""Algorithm trace → per-rank Chakra ``.et`` files for ASTRA-sim's custom-collective path.

The collectiveapi convention ASTRA-sim's ``CustomAlgorithm`` runs: one file per rank,
``<prefix>.<rank>.et``; ``COMM_SEND_NODE`` with ``comm_dst``/``comm_tag``,
``COMM_RECV_NODE`` with ``comm_src``/``comm_tag``, ``COMP_NODE`` for reductions; every
node carries ``msg_chunk_cnt``, ``msg_chunk_idx``, ``total_chunk_cnt`` (read as
``int32_val`` by ASTRA-sim, so written as such), ``chunk_offset``, ``tb_id`` and
``local_time_step``. ASTRA-sim sizes a message as ``coll_size / total_chunk_cnt ·
msg_chunk_cnt`` from the workload's collective; older readers use a fixed
``comm_size`` instead, which is written when a collective size is given.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.errors import UnsatisfiableError
from etstore.formats._et_kind import algorithm_metadata
from etstore.formats._frames import write_varint
from etstore.formats.et import write_et
from etstore.model import CHUNK_COLUMNS, Trace, member_number

__all__ = ["message_sizes", "write_algorithm_et"]

log = logging.getLogger(__name__)

_SCALED = frozenset({"allgather", "reducescatter", "alltoall"})
_CHUNK_COLS = CHUNK_COLUMNS
_I32 = member_number("int32_val")
_I64 = member_number("int64_val")


# binary multiples throughout: ASTRA-sim's "1MB" workloads carry 1,048,576 bytes (DESIGN.md: GB = 2^30)
def message_sizes(trace: Trace, coll_size: int, *, scale_by_ngpus: bool = True) -> np.ndarray:
    """Bytes each node moves for a collective of ``coll_size`` bytes (0 for non-data nodes).

    ``coll_size`` is counted the way the MSCCL runtime counts a call: the buffer of
    an all-reduce, broadcast or reduce; one rank's input of an all-gather; one
    rank's output of a reduce-scatter; one peer's block of an all-to-all. For the
    last three the chunked buffer is ``ngpus`` times larger (``scale_by_ngpus``).
    A node moving ``cnt`` chunks from index ``idx`` gets ``S // C · cnt`` bytes,
    plus ``S % C`` when it includes the last chunk (S the scaled size, C
    ``total_chunk_cnt``), so the chunks of a buffer add up to S exactly.

    Raises
    ------
    UnsatisfiableError
        ``coll_size`` is not positive or smaller than the number of chunks, or a
        send/receive lacks its chunk columns.

    Notes
    -----
    O(V), vectorised.
    """
    if coll_size <= 0:
        raise UnsatisfiableError(f"collective size must be positive, got {coll_size} bytes")
    params = trace.params
    coll = str(params.get("collective", ""))
    ngpus = int(params.get("ngpus") or trace.num_ranks)
    S = coll_size * (ngpus if scale_by_ngpus and coll in _SCALED else 1)
    ops = trace.ops
    cnt = ops["msg_chunk_cnt"]
    total = ops["total_chunk_cnt"]
    idx = ops["msg_chunk_idx"]
    comm = pc.is_in(ops["type"], pa.array(["COMM_SEND_NODE", "COMM_RECV_NODE"])).to_numpy(
        zero_copy_only=False
    )
    for name, col in (("msg_chunk_cnt", cnt), ("total_chunk_cnt", total), ("msg_chunk_idx", idx)):
        missing = np.flatnonzero(comm & ~pc.is_valid(col).to_numpy(zero_copy_only=False))
        if len(missing):
            i = int(missing[0])
            raise UnsatisfiableError(
                f"{trace.name}: rank {ops['rank'][i].as_py()} node {ops['id'][i].as_py()} is a send/receive "
                f"without {name}; ASTRA-sim cannot size it"
            )
    c = pc.fill_null(cnt, 0).to_numpy().astype(np.int64)
    C = pc.fill_null(total, 1).to_numpy().astype(np.int64)
    first = pc.fill_null(idx, 0).to_numpy().astype(np.int64)
    C = np.maximum(C, 1)
    if comm.any() and (C[comm] > S).any():
        raise UnsatisfiableError(
            f"a collective of {S} bytes cannot be cut into {int(C[comm].max())} chunks of at least one byte"
        )
    size = (S // C) * c + np.where((first + c >= C) & (c > 0), S % C, 0)
    return np.where(comm, size, 0)


def write_algorithm_et(
    trace: Trace,
    prefix: str | Path,
    *,
    coll_size: int | None = None,
    scale_by_ngpus: bool = True,
    reduce_duration_micros: int | None = None,
) -> list[Path]:
    """Write ``<prefix>.<rank>.et`` per rank, ready for ASTRA-sim's custom collectives.

    Parameters
    ----------
    trace
        An algorithm trace (``docs/algorithms.md``); read from MSCCL-IR, generated
        or synthesized.
    prefix
        Output prefix; ASTRA-sim's ``all-reduce-implementation-custom`` (etc.) names
        the same prefix.
    coll_size
        Collective size in bytes (see :func:`message_sizes`). When given,
        ``comm_size`` is written on every send and receive; otherwise ASTRA-sim
        derives sizes from the chunk attributes and the workload's collective.
    scale_by_ngpus
        Multiply ``coll_size`` by ``ngpus`` for all-gather, reduce-scatter and
        all-to-all, as the MSCCL runtime does.
    reduce_duration_micros
        Duration written on reduce/copy COMP nodes (µs); ``None`` keeps the trace's.

    Returns
    -------
    list[Path]
        One file per rank ``0 .. ngpus-1`` (a rank without nodes gets a file with
        only the metadata, so every NPU finds its file).

    Raises
    ------
    UnsatisfiableError
        See :func:`message_sizes`.

    Notes
    -----
    O(V + E). Node ids, dependencies and every other attribute are kept, so
    :func:`~etstore.formats.et.read_et` gives the trace back (plus ``comm_size``).
    """
    ops = trace.ops
    n = ops.num_rows
    coll = str(trace.params.get("collective", ""))
    cols = {name: ops[name] for name in ops.column_names}
    if coll_size is not None:
        sizes = message_sizes(trace, coll_size, scale_by_ngpus=scale_by_ngpus)
        comm = pc.is_in(ops["type"], pa.array(["COMM_SEND_NODE", "COMM_RECV_NODE"])).to_numpy(
            zero_copy_only=False
        )
        cols["comm_size"] = pa.chunked_array([pa.array(sizes, pa.int64(), mask=~comm)])
    if reduce_duration_micros is not None:
        comp = pc.equal(ops["type"], "COMP_NODE").to_numpy(zero_copy_only=False)
        dur = np.where(comp, int(reduce_duration_micros), ops["duration_micros"].to_numpy())
        cols["duration_micros"] = pa.chunked_array([pa.array(dur.astype(np.uint64))])
    # which oneof member each promoted attribute uses: int32 where ASTRA-sim reads int32_val
    order_parts = []
    for name, member in (
        ("comm_src", _I32),
        ("comm_dst", _I32),
        ("comm_tag", _I32),
        ("comm_size", _I64),
        *((c, _I32) for c in _CHUNK_COLS),
    ):
        valid = pc.is_valid(cols[name])
        order_parts.append(pc.if_else(valid, f"{name}:{member}", pa.scalar(None, pa.string())))
    joined = pc.binary_join_element_wise(*order_parts, ",", null_handling="skip")
    cols["attr_order"] = joined
    out = pa.Table.from_arrays([cols[c] for c in ops.column_names], schema=ops.schema)
    ngpus = int(trace.params.get("ngpus") or trace.num_ranks)
    meta = algorithm_metadata(coll)
    meta_table = pa.table(
        {"rank": pa.array(range(ngpus), pa.int32()), "metadata": pa.array([meta] * ngpus)},
        schema=trace.meta.schema,
    )
    paths = write_et(trace.replace(ops=out, meta=meta_table), prefix)
    prefix = Path(prefix)
    written = {p.name for p in paths}
    for r in range(ngpus):  # ranks without nodes still need a file
        name = f"{prefix.name}.{r}.et"
        if name not in written:
            p = prefix.parent / name
            p.write_bytes(_frame(meta))
            paths.append(p)
    log.debug("wrote %d ops to %d files under %s", n, len(paths), prefix)
    return sorted(paths, key=lambda p: int(p.name.rsplit(".", 2)[-2]))


def _frame(blob: bytes) -> bytes:
    return write_varint(len(blob)) + blob
