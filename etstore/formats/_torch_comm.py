"""PyTorch communication vocabulary: op and kernel names, dtypes and process groups.

PyTorch names one collective many ways. The Python API says ``all_reduce``, the c10d op
``c10d::allreduce_``, the profiler's ``record_param_comms`` ``Collective name`` says
``allreduce``, its user annotation ``nccl:all_reduce`` or ``gloo:all_reduce``, and the GPU
kernel ``ncclKernel_AllReduce_RING_LL_Sum_float`` (NCCL < 2.19, RCCL) or
``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` (NCCL >= 2.19). Element types come as ``Float``
(c10 scalar type), ``c10::Half`` or ``long int`` (execution-trace ``Tensor(...)`` types),
``float32`` (torch dtype) or ``f32`` / ``__nv_bfloat16`` (kernel template arguments).
Process groups come from Kineto's ``distributedInfo.pg_config`` and from the arguments of
each ``record_param_comms`` event.

The Kineto reader and the execution-trace reader both map through this module, so a
collective read from either file gets the same Chakra node type, ``comm_type`` (a
:mod:`etstore.collective` name), byte size and process group.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from etstore.collective import chakra_name

__all__ = [
    "COLL_NODE",
    "MAX_GROUP",
    "RECV_NODE",
    "SEND_NODE",
    "CommArgs",
    "CommKind",
    "ProcessGroup",
    "comm_args",
    "comm_kind",
    "comm_prefixed",
    "dtype_size",
    "group_ranks",
    "is_comm_kernel",
    "kernel_dtype",
    "parse_int_list",
    "process_groups",
]

COLL_NODE = "COMM_COLL_NODE"
MAX_GROUP = 1 << 20  # ranks a group may list: more is no real machine, and would be allocated
SEND_NODE = "COMM_SEND_NODE"
RECV_NODE = "COMM_RECV_NODE"


class CommKind(NamedTuple):
    """What a communication op becomes: a Chakra node type and, for collectives, its comm_type."""

    node_type: str  # COMM_COLL_NODE, COMM_SEND_NODE or COMM_RECV_NODE
    comm_type: str | None  # Chakra CollectiveCommType name (ALL_REDUCE, ...); None for send/recv


# Spellings that etstore.collective does not know: PyTorch's own op names (after the
# backend prefix and trailing underscore are removed), keyed without "_" and lower case.
_TORCH_COLLECTIVES: dict[str, str] = {
    "allreducecoalesced": "ALL_REDUCE",
    "allreduceintrahost": "ALL_REDUCE",
    "allgatherbase": "ALL_GATHER",
    "allgatherintotensor": "ALL_GATHER",
    "allgatherintotensorcoalesced": "ALL_GATHER",
    "allgathercoalesced": "ALL_GATHER",
    "allgatherobject": "ALL_GATHER",
    "allgathertogether": "ALL_GATHER",
    "reducescatterbase": "REDUCE_SCATTER",
    "reducescattertensor": "REDUCE_SCATTER",
    "reducescattertensorcoalesced": "REDUCE_SCATTER",
    "reducescattercoalesced": "REDUCE_SCATTER",
    "alltoallbase": "ALL_TO_ALL",
    "alltoallsingle": "ALL_TO_ALL",
    "alltoallv": "ALL_TO_ALL",
    "broadcastcoalesced": "BROADCAST",
    "broadcastobjectlist": "BROADCAST",
    "gatherobject": "GATHER",
    "scatterobjectlist": "SCATTER",
    "monitoredbarrier": "BARRIER",
}
_P2P: dict[str, str] = {
    "send": SEND_NODE,
    "isend": SEND_NODE,
    "recv": RECV_NODE,
    "irecv": RECV_NODE,
    "recvanysource": RECV_NODE,
}
# Backend prefixes of user annotations and c10d ops ("nccl:all_reduce", "c10d::allreduce_").
_PREFIX = re.compile(
    r"^(?:c10d::|c10d_functional::|_c10d_functional::|(?:nccl|gloo|mpi|ucc|rccl|xccl|hccl):)"
)
# NCCL / RCCL kernels: ncclKernel_<Func>_..., ncclDevKernel_<Func>_..., ncclDevKernelDebug_<Func>...
_KERNEL = re.compile(r"^(?:nccl|rccl)(?:Dev)?Kernel(?:Debug)?_(?P<func>[A-Za-z]+)")
_KERNEL_FUNCS: dict[str, str] = {
    "AllReduce": "ALL_REDUCE",
    "AllGather": "ALL_GATHER",
    "ReduceScatter": "REDUCE_SCATTER",
    "Broadcast": "BROADCAST",
    "Reduce": "REDUCE",
    "AllToAll": "ALL_TO_ALL",
    "AllToAllPivot": "ALL_TO_ALL",
    "Gather": "GATHER",
    "Scatter": "SCATTER",
}


def _key(text: str) -> str:
    return text.replace("_", "").replace("-", "").replace(" ", "").lower()


def comm_kind(name: str) -> CommKind | None:
    """The Chakra node type and comm_type of a PyTorch communication op or kernel name.

    Parameters
    ----------
    name
        Any of: a ``Collective name`` argument (``allreduce``, ``all_to_all``, ``send``),
        a user annotation (``nccl:all_reduce``, ``gloo:broadcast``), a c10d op
        (``c10d::alltoall_base_``), a Python API name (``all_gather_into_tensor``) or an
        NCCL / RCCL kernel name (``ncclDevKernel_AllReduce_Sum_f32_RING_LL``).

    Returns
    -------
    CommKind or None
        None for names that move no data by themselves: ``wait``, ``coalesced``, unknown
        names, and kernels whose function the name does not tell (``SendRecv``, which NCCL
        runs for all_to_all as well as for send/recv; RCCL's ``Generic``). Callers take
        those from the launching op or the kernel's ``Collective name`` argument.

    Examples
    --------
    >>> comm_kind("nccl:all_reduce")
    CommKind(node_type='COMM_COLL_NODE', comm_type='ALL_REDUCE')
    >>> comm_kind("c10d::alltoall_base_").comm_type, comm_kind("recv").node_type
    ('ALL_TO_ALL', 'COMM_RECV_NODE')
    """
    m = _KERNEL.match(name)
    if m:
        func = m["func"]
        # "AllReduce_Sum_f32": the function is the first CamelCase word group before "_"
        chakra = _KERNEL_FUNCS.get(func)
        return None if chakra is None else CommKind(COLL_NODE, chakra)
    base = _PREFIX.sub("", name.strip())
    key = _key(base)
    if key in _P2P:
        return CommKind(_P2P[key], None)
    chakra = _TORCH_COLLECTIVES.get(key)
    if chakra is None and len(key) > 3:  # not the CLI abbreviations (ar, ag, a2a): no op is called so
        chakra = chakra_name(base)
    return None if chakra is None else CommKind(COLL_NODE, chakra)


def comm_prefixed(name: str) -> bool:
    """Whether an op name carries a communication backend prefix (``nccl:``, ``gloo:``, ``c10d::``...).

    CPU ops and annotations so named are the communication calls; a bare ``gather`` may be
    anything, so readers consult :func:`comm_kind` only for these, kernels and
    ``record_param_comms`` arguments.
    """
    return _PREFIX.match(name) is not None


def is_comm_kernel(name: str) -> bool:
    """Whether a GPU kernel name is an NCCL / RCCL communication kernel (of any function)."""
    return _KERNEL.match(name) is not None


# bytes per element, keyed by a normalised dtype spelling (see _dtype_key)
_DTYPE_BYTES: dict[str, int] = {}
for _size, _names in (
    (
        1,
        "bool byte char uint8 int8 uint8t int8t unsignedchar signedchar i8 u8 "
        "float8e4m3fn float8e5m2 float8e4m3fnuz float8e5m2fnuz fp8e4m3 fp8e5m2 nvfp8e4m3 nvfp8e5m2 "
        "qint8 quint8 quint4x2 quint2x4 bits8 float4e2m1fnx2",
    ),
    (
        2,
        "half float16 bfloat16 short int16 uint16 int16t uint16t f16 bf16 nvbfloat16 rcclbfloat16 "
        "hipbfloat16  bits16 unsignedshort shortint",
    ),
    (4, "float float32 int int32 uint32 int32t uint32t f32 i32 u32 unsignedint qint32 complexhalf chalf"),
    (
        8,
        "double float64 long int64 uint64 int64t uint64t f64 i64 u64 longint longlong "
        "unsignedlong unsignedlongint longlongint complexfloat cfloat complex64",
    ),
    (16, "complexdouble cdouble complex128"),
):
    for _name in _names.split():
        _DTYPE_BYTES[_name] = _size


def _dtype_key(text: str) -> str:
    t = text.strip()
    if t.startswith("Tensor(") and t.endswith(")"):  # execution trace: Tensor(c10::Half)
        t = t[7:-1]
    for prefix in ("torch.", "c10::", "at::", "std::"):
        if t.startswith(prefix):
            t = t[len(prefix) :]
    return t.replace("_", "").replace(" ", "").lower()


def dtype_size(name: str) -> int | None:
    """Bytes per element of a dtype in any PyTorch, c10, execution-trace or kernel spelling.

    Examples
    --------
    >>> dtype_size("Float"), dtype_size("c10::Half"), dtype_size("Tensor(long int)"), dtype_size("bf16")
    (4, 2, 8, 2)
    >>> dtype_size("Object") is None
    True
    """
    return _DTYPE_BYTES.get(_dtype_key(name))


# dtype tokens in kernel names: ncclKernel_AllReduce_RING_LL_Sum_float(...) and
# ncclDevKernel_AllReduce_Sum_f32_RING_LL; checked in this order, the longest first
_KERNEL_DTYPES = (
    "__nv_bfloat16",
    "rccl_bfloat16",
    "hip_bfloat16",
    "__nv_fp8_e4m3",
    "__nv_fp8_e5m2",
    "uint8_t",
    "int8_t",
    "uint32_t",
    "int32_t",
    "uint64_t",
    "int64_t",
    "double",
    "float",
    "half",
    "bf16",
    "f16",
    "f32",
    "f64",
    "u8",
    "i8",
    "u32",
    "i32",
    "u64",
    "i64",
)
_KERNEL_DTYPE = re.compile(r"_(" + "|".join(re.escape(d) for d in _KERNEL_DTYPES) + r")(?=$|[_(<,\s])")


def kernel_dtype(name: str) -> str | None:
    """The element type named in an NCCL / RCCL kernel name (``f32``, ``float``...), if any."""
    head = name.split("(", 1)[0]
    m = _KERNEL_DTYPE.search(head)
    return m[1] if m else None


def parse_int_list(value: Any) -> list[int] | None:
    """A list of ints from a list, a ``"[0, 1]"`` string or ``"0,1"``; None if absent or unparsable.

    PyTorch writes ``Process Group Ranks`` and split sizes as strings; long lists may be
    cut with ``...`` (then None: the caller falls back to start/stride/size).
    """
    if value is None:
        return None
    if isinstance(value, Sequence) and not isinstance(value, str):
        items: Any = value
    else:
        text = str(value).strip()
        if "..." in text:
            return None
        if not text.startswith("["):
            text = f"[{text}]"
        try:
            items = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return None
        if not isinstance(items, (list, tuple)):
            return None
    try:
        values = [int(v) for v in items]
    except (TypeError, ValueError, OverflowError):
        return None
    return values if all(-(2**63) <= v < 2**63 for v in values) else None


@dataclass(frozen=True)
class ProcessGroup:
    """One process group: its name (``pg_name``, e.g. ``"0"``), description and global ranks."""

    name: str
    desc: str = ""
    ranks: tuple[int, ...] = ()
    backend: str = ""


def process_groups(distributed_info: Mapping[str, Any] | None) -> dict[str, ProcessGroup]:
    """Process groups of Kineto's ``distributedInfo`` (``pg_config``), keyed by ``pg_name``.

    Older traces have no ``pg_config``; then only the default group is known, with the
    ``world_size`` ranks, under the name ``"0"``.

    Parameters
    ----------
    distributed_info
        The trace's top-level ``distributedInfo`` object (or None).

    Returns
    -------
    dict
        ``{pg_name: ProcessGroup}``; empty when nothing is known.
    """
    if not distributed_info:
        return {}
    out: dict[str, ProcessGroup] = {}
    config = distributed_info.get("pg_config")
    if isinstance(config, Mapping):  # some versions key the groups by name
        config = [{"pg_name": k, **v} for k, v in config.items() if isinstance(v, Mapping)]
    if isinstance(config, list):
        for pg in config:
            if not isinstance(pg, Mapping) or pg.get("pg_name") is None:
                continue
            ranks = parse_int_list(pg.get("ranks")) or []
            out[str(pg["pg_name"])] = ProcessGroup(
                name=str(pg["pg_name"]),
                desc=str(pg.get("pg_desc", "")),
                ranks=tuple(ranks),
                backend=str(pg.get("backend_config", distributed_info.get("backend", ""))),
            )
    world = distributed_info.get("world_size")
    if not out and isinstance(world, int) and not isinstance(world, bool) and 0 < world <= MAX_GROUP:
        out["0"] = ProcessGroup(
            "0", "default_pg", tuple(range(world)), str(distributed_info.get("backend", ""))
        )
    return out


def group_ranks(args: Mapping[str, Any]) -> list[int] | None:
    """Global ranks of the group a ``record_param_comms`` (or NCCL kernel) event ran in.

    From ``Process Group Ranks`` when it is complete, else from ``Global rank start``,
    ``Global rank stride`` and ``Group size``; None when the event says nothing.
    """
    ranks = parse_int_list(args.get("Process Group Ranks"))
    size = args.get("Group size")
    if ranks and (not isinstance(size, int) or len(ranks) == size):
        return ranks
    start, stride = args.get("Global rank start"), args.get("Global rank stride")
    if (
        isinstance(size, int)
        and 0 < size <= MAX_GROUP
        and isinstance(start, int)
        and isinstance(stride, int)
        and 0 <= start < 2**31
        and 0 <= start + stride * (size - 1) < 2**31
    ):
        return [start + stride * i for i in range(size)]
    return ranks or None


class CommArgs(NamedTuple):
    """What a ``record_param_comms`` / NCCL-kernel event says about one communication."""

    kind: CommKind | None
    name: str | None  # the Collective name as written ("allreduce", "send", "wait")
    in_nelems: int | None
    out_nelems: int | None
    dtype: str | None
    elem_bytes: int | None
    pg_name: str | None
    pg_desc: str | None
    ranks: list[int] | None
    in_split: list[int] | None
    out_split: list[int] | None
    src_rank: int | None  # point-to-point peer ranks as PyTorch records them, if it does
    dst_rank: int | None
    seq: int | None

    @property
    def size_bytes(self) -> int | None:
        """Bytes of the op's input buffer: input elements times the element size.

        The Chakra and ASTRA-sim convention (and the execution-trace reader's): one rank's
        share for an all-gather, the whole buffer for a reduce-scatter or all-reduce. The
        output count stands in when the input count is absent.
        """
        count = self.in_nelems if self.in_nelems is not None else self.out_nelems
        if self.elem_bytes is None or count is None or not 0 <= count * self.elem_bytes < 2**63:
            return None
        return count * self.elem_bytes


def _int(value: Any) -> int | None:
    """An int64 from an int, an integral float or a decimal string; None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    elif isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            return None
    if isinstance(value, int) and -(2**63) <= value < 2**63:
        return value
    return None


def comm_args(args: Mapping[str, Any], kernel_name: str | None = None) -> CommArgs:
    """Parse the communication arguments of a Kineto event.

    Parameters
    ----------
    args
        The event's ``args`` (``record_param_comms`` CPU op, or an NCCL kernel, which newer
        PyTorch annotates with the same keys).
    kernel_name
        The kernel's name, used for the kind and dtype when the arguments lack them.

    Returns
    -------
    CommArgs
        Every field None that the event does not carry.
    """
    name = args.get("Collective name")
    name = str(name) if name is not None else None
    kind = comm_kind(name) if name else None
    if kind is None and kernel_name:
        kind = comm_kind(kernel_name)
    dtype = args.get("dtype")
    dtype = str(dtype) if dtype is not None else (kernel_dtype(kernel_name) if kernel_name else None)
    pg = args.get("Process Group Name")
    desc = args.get("Process Group Description")
    return CommArgs(
        kind=kind,
        name=name,
        in_nelems=_int(args.get("In msg nelems")),
        out_nelems=_int(args.get("Out msg nelems")),
        dtype=dtype,
        elem_bytes=dtype_size(dtype) if dtype else None,
        pg_name=str(pg) if pg is not None else None,
        pg_desc=str(desc) if desc is not None else None,
        ranks=group_ranks(args),
        in_split=parse_int_list(args.get("In split size")),
        out_split=parse_int_list(args.get("Out split size")),
        src_rank=_int(args.get("Src Rank")),
        dst_rank=_int(args.get("Dst Rank")),
        seq=_int(args.get("Seq")),
    )
