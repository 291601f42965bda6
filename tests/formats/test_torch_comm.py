"""The PyTorch communication vocabulary: names → Chakra kinds, dtypes → bytes, process groups.

Expected values are PyTorch's and NCCL's documented facts (torch.distributed API names,
``torch.finfo``/``element_size`` of each dtype, NCCL kernel naming), not this module's tables.
"""

from __future__ import annotations

import pytest

from etstore.formats._torch_comm import (
    CommKind,
    ProcessGroup,
    comm_args,
    comm_kind,
    comm_prefixed,
    dtype_size,
    group_ranks,
    is_comm_kernel,
    kernel_dtype,
    parse_int_list,
    process_groups,
)

COLL = "COMM_COLL_NODE"


@pytest.mark.parametrize(
    ("name", "comm_type"),
    [
        ("all_reduce", "ALL_REDUCE"),
        ("allreduce", "ALL_REDUCE"),
        ("nccl:all_reduce", "ALL_REDUCE"),
        ("gloo:all_reduce", "ALL_REDUCE"),
        ("c10d::allreduce_", "ALL_REDUCE"),
        ("allreduce_coalesced", "ALL_REDUCE"),
        ("all_to_all", "ALL_TO_ALL"),
        ("alltoall_base", "ALL_TO_ALL"),
        ("c10d::alltoall_base_", "ALL_TO_ALL"),
        ("all_to_all_single", "ALL_TO_ALL"),
        ("allgather_into_tensor", "ALL_GATHER"),
        ("c10d::_allgather_base_", "ALL_GATHER"),
        ("all_gather", "ALL_GATHER"),
        ("reduce_scatter_tensor", "REDUCE_SCATTER"),
        ("c10d::_reduce_scatter_base_", "REDUCE_SCATTER"),
        ("broadcast", "BROADCAST"),
        ("nccl:broadcast", "BROADCAST"),
        ("barrier", "BARRIER"),
        ("gather", "GATHER"),
        ("scatter", "SCATTER"),
        ("reduce", "REDUCE"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ALL_REDUCE"),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "ALL_REDUCE"),
        ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "BROADCAST"),
        ("ncclDevKernel_AllGather_RING_LL", "ALL_GATHER"),
        ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "REDUCE_SCATTER"),
        ("ncclKernel_AllToAll_RING_SIMPLE_Sum_float", "ALL_TO_ALL"),  # RCCL's own all-to-all kernel
    ],
)
def test_collective_names_map_to_chakra(name: str, comm_type: str) -> None:
    assert comm_kind(name) == CommKind(COLL, comm_type)


@pytest.mark.parametrize(
    ("name", "node_type"),
    [
        ("send", "COMM_SEND_NODE"),
        ("isend", "COMM_SEND_NODE"),
        ("c10d::send", "COMM_SEND_NODE"),
        ("recv", "COMM_RECV_NODE"),
        ("gloo:recv", "COMM_RECV_NODE"),
        ("c10d::recv_any_source_", "COMM_RECV_NODE"),
    ],
)
def test_point_to_point_names(name: str, node_type: str) -> None:
    assert comm_kind(name) == CommKind(node_type, None)


@pytest.mark.parametrize(
    "name",
    [
        "wait",
        "coalesced",
        "aten::gather",  # a tensor op, not a collective
        "ar",  # CLI abbreviations are no op names
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
        "ncclDevKernel_Generic_4",
        "aten::add",
    ],
)
def test_names_without_a_kind(name: str) -> None:
    assert comm_kind(name) is None


def test_kernel_and_prefix_recognition() -> None:
    assert is_comm_kernel(
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
    )
    assert is_comm_kernel("ncclDevKernel_Generic_4")
    assert not is_comm_kernel("void at::native::vectorized_elementwise_kernel<4>")
    assert comm_prefixed("nccl:all_to_all") and comm_prefixed("c10d::allreduce_")
    assert comm_prefixed("gloo:broadcast") and not comm_prefixed("aten::mm")


@pytest.mark.parametrize(
    ("dtype", "size"),
    [
        # torch.empty(0, dtype=...).element_size()
        ("Float", 4),
        ("float32", 4),
        ("torch.float32", 4),
        ("Tensor(float)", 4),
        ("c10::Half", 2),
        ("Half", 2),
        ("float16", 2),
        ("BFloat16", 2),
        ("Tensor(c10::BFloat16)", 2),
        ("Long", 8),
        ("Tensor(long int)", 8),
        ("int64", 8),
        ("Int", 4),
        ("Tensor(int)", 4),
        ("Double", 8),
        ("Byte", 1),
        ("Tensor(unsigned char)", 1),
        ("Char", 1),
        ("Bool", 1),
        ("Short", 2),
        ("ComplexFloat", 8),
        ("ComplexDouble", 16),
        ("ComplexHalf", 4),
        ("Float8_e4m3fn", 1),
        # kernel template arguments
        ("f32", 4),
        ("bf16", 2),
        ("int8_t", 1),
        ("__nv_bfloat16", 2),
        ("uint64_t", 8),
    ],
)
def test_dtype_sizes(dtype: str, size: int) -> None:
    assert dtype_size(dtype) == size


def test_unknown_dtype() -> None:
    assert dtype_size("Object") is None
    assert dtype_size("GenericList[Int]") is None


@pytest.mark.parametrize(
    ("kernel", "dtype"),
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "float"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "f32"),
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "int8_t"),
        ("ncclKernel_AllReduce_RING_LL_Sum_half(ncclDevComm*)", "half"),
        ("ncclDevKernel_AllGather_RING_LL", None),
    ],
)
def test_kernel_dtype(kernel: str, dtype: str | None) -> None:
    assert kernel_dtype(kernel) == dtype


def test_parse_int_list() -> None:
    assert parse_int_list("[0, 1]") == [0, 1]
    assert parse_int_list([3, 5]) == [3, 5]
    assert parse_int_list("[]") == []
    assert parse_int_list("0,2,4") == [0, 2, 4]
    assert parse_int_list("[0, 1, 2, ...]") is None
    assert parse_int_list("[a, b]") is None
    assert parse_int_list(None) is None


def test_process_groups_from_pg_config() -> None:
    # hta/nccl_data.json.gz's distributedInfo, verbatim
    info = {
        "backend": "nccl",
        "rank": 0,
        "world_size": 2,
        "pg_count": 1,
        "pg_config": [
            {
                "pg_name": "0",
                "pg_desc": "default_pg",
                "backend_config": "cuda:nccl",
                "pg_size": 2,
                "ranks": [0, 1],
            }
        ],
        "nccl_version": "2.17.1",
    }
    assert process_groups(info) == {"0": ProcessGroup("0", "default_pg", (0, 1), "cuda:nccl")}


def test_process_groups_default_when_only_world_size() -> None:
    # dlrm_8r_kineto's distributedInfo: no pg_config
    info = {"backend": "nccl", "rank": 0, "world_size": 8}
    assert process_groups(info) == {"0": ProcessGroup("0", "default_pg", tuple(range(8)), "nccl")}
    assert process_groups(None) == {}
    assert process_groups({"rank": 0}) == {}


def test_group_ranks_from_list_or_stride() -> None:
    assert group_ranks({"Process Group Ranks": "[0, 1]", "Group size": 2}) == [0, 1]
    # a truncated list falls back to start/stride/size: ranks 1, 3, 5, 7
    args = {
        "Process Group Ranks": "[1, 3, ...]",
        "Group size": 4,
        "Global rank start": 1,
        "Global rank stride": 2,
    }
    assert group_ranks(args) == [1, 3, 5, 7]
    assert group_ranks({}) is None


def test_comm_args_of_record_param_comms() -> None:
    # one record_param_comms event of hta/nccl_data.json.gz, verbatim
    args = {
        "External id": 2099,
        "Record function id": 1959,
        "Process Group Name": "0",
        "Global rank stride": 1,
        "Out msg nelems": 2049000,
        "Process Group Ranks": "[0, 1]",
        "Group size": 2,
        "Global rank start": 0,
        "Ev Idx": 50,
        "In msg nelems": 2049000,
        "In split size": "[]",
        "Out split size": "[]",
        "dtype": "Float",
        "Process Group Description": "default_pg",
        "Collective name": "allreduce",
    }
    c = comm_args(args)
    assert c.kind == CommKind(COLL, "ALL_REDUCE")
    assert (c.in_nelems, c.out_nelems, c.elem_bytes, c.size_bytes) == (2049000, 2049000, 4, 2049000 * 4)
    assert (c.pg_name, c.pg_desc, c.ranks, c.in_split) == ("0", "default_pg", [0, 1], [])


def test_comm_args_all_gather_counts_its_input() -> None:
    args = {
        "Collective name": "_allgather_base",
        "In msg nelems": 10,
        "Out msg nelems": 80,
        "dtype": "BFloat16",
    }
    assert comm_args(args).size_bytes == 20  # one rank's share, as Chakra and ASTRA-sim count it
    assert comm_args({"Out msg nelems": 80, "dtype": "BFloat16"}).size_bytes == 160


def test_comm_args_of_an_old_kernel_falls_back_to_its_name() -> None:
    name = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
    c = comm_args({"stream": 84, "correlation": 42386}, kernel_name=name)
    assert c.kind == CommKind(COLL, "ALL_REDUCE")
    assert (c.dtype, c.elem_bytes, c.size_bytes) == ("float", 4, None)


def test_comm_args_wait_has_no_kind() -> None:
    c = comm_args({"Collective name": "wait", "dtype": "Byte", "In msg nelems": 0, "Out msg nelems": 0})
    assert c.kind is None and c.name == "wait" and c.size_bytes == 0
