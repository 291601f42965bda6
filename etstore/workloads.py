"""Synthetic transformer-like workloads: the demo's input and the tests' feedstock.

Per rank: forward compute per layer (with a tensor-parallel ALL_GATHER before the
layer's matmul), backward compute in reverse (with a REDUCE_SCATTER), a
data-parallel ALL_REDUCE of each layer's gradients, and a pipeline-style
COMM_SEND/COMM_RECV exchange with the neighbouring data-parallel replica at the
start. Communicator groups go in ``params["comm_groups"]`` and each collective's
``pg_name`` names its group.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from etstore.errors import OptionError
from etstore.model import CORE_OP_COLUMNS, Trace, deps_table, ops_table
from etstore.units import budget_exceeded

__all__ = ["transformer"]


def transformer(
    *,
    ranks: int = 8,
    layers: int = 4,
    tp: int = 2,
    hidden: int = 4096,
    seq_tokens: int = 2048,
    bytes_per_elem: int = 2,
    seed: int = 0,
    name: str = "transformer",
) -> Trace:
    """A data- × tensor-parallel training step as a Chakra trace.

    Parameters
    ----------
    ranks
        Total ranks; must be a multiple of ``tp``.
    layers
        Transformer layers.
    tp
        Tensor-parallel degree (ranks ``[k*tp, (k+1)*tp)`` form group ``tp{k}``);
        the data-parallel groups ``dp{j}`` take every ``tp``-th rank.
    hidden, seq_tokens, bytes_per_elem
        Model shape; sizes (bytes) and durations (µs, ~100 TFLOP/s) follow from it.
    seed
        Seeds ±10% jitter on compute durations, so ranks differ slightly.

    Returns
    -------
    Trace
        kind ``workload``; ``params`` holds the arguments and ``comm_groups``.

    Notes
    -----
    O(ranks × layers) ops; built columnar per rank.
    """
    if ranks < 1 or tp < 1 or ranks % tp:
        raise OptionError(f"transformer: ranks ({ranks}) must be a positive multiple of tp ({tp})")
    for label, value in (("layers", layers), ("hidden", hidden), ("seq_tokens", seq_tokens)):
        if value < 1:
            raise OptionError(f"transformer: {label} must be at least 1, got {value}")
    if bytes_per_elem < 1:
        raise OptionError(f"transformer: bytes_per_elem must be at least 1, got {bytes_per_elem}")
    # about 7.3 ops per rank and layer plus a few per rank, ~300 bytes each at peak (measured)
    need = ranks * (8.0 * layers + 4) * 400
    too_big = budget_exceeded(need, f"transformer: {ranks:,} ranks x {layers:,} layers")
    if too_big is not None:
        raise OptionError(too_big)
    rng = np.random.default_rng(seed)
    layer_flops = 24 * seq_tokens * hidden * hidden / tp
    fwd_us = layer_flops / 100e12 * 1e6
    act_bytes = seq_tokens * hidden * bytes_per_elem
    grad_bytes = 12 * hidden * hidden * bytes_per_elem // tp
    groups: dict[str, list[int]] = {}
    for k in range(ranks // tp):
        groups[f"tp{k}"] = list(range(k * tp, (k + 1) * tp))
    for j in range(tp):
        groups[f"dp{j}"] = list(range(j, ranks, tp))

    cols: dict[str, list[Any]] = {k: [] for k in (*CORE_OP_COLUMNS, "is_cpu_op")}
    d_rank: list[int] = []
    d_src: list[int] = []
    d_dst: list[int] = []
    ndp = ranks // tp
    for r in range(ranks):
        nid = 0
        last: int | None = None

        def add(
            name: str, typ: str, *, dur: float = 0, after: list[int] | None = None, rank: int = r, **comm: Any
        ) -> int:
            nonlocal nid, last
            cols["rank"].append(rank)
            cols["id"].append(nid)
            cols["name"].append(name)
            cols["type"].append(typ)
            cols["duration_micros"].append(round(dur))
            for key in ("comm_type", "comm_size", "comm_src", "comm_dst", "comm_tag", "pg_name"):
                cols[key].append(comm.get(key))
            cols["is_cpu_op"].append(False)
            for p in after if after is not None else ([last] if last is not None else []):
                d_rank.append(rank)
                d_src.append(p)
                d_dst.append(nid)
            last = nid
            nid += 1
            return last

        tpg, dpg = f"tp{r // tp}", f"dp{r % tp}"
        dp_index = r // tp
        # pipeline-style exchange with the neighbouring data-parallel replica
        if ndp > 1:
            nxt = ((dp_index + 1) % ndp) * tp + r % tp
            prv = ((dp_index - 1) % ndp) * tp + r % tp
            s = add("send_embeddings", "COMM_SEND_NODE", comm_size=act_bytes // 4, comm_dst=nxt, comm_tag=1)
            rv = add(
                "recv_embeddings",
                "COMM_RECV_NODE",
                after=[],
                comm_size=act_bytes // 4,
                comm_src=prv,
                comm_tag=1,
            )
            add("embedding", "COMP_NODE", dur=fwd_us * 0.2, after=[s, rv])
        else:
            add("embedding", "COMP_NODE", dur=fwd_us * 0.2, after=[])
        for layer in range(layers):
            jitter = rng.uniform(0.9, 1.1)
            if tp > 1:
                add(
                    f"fwd_allgather_L{layer}",
                    "COMM_COLL_NODE",
                    comm_type="ALL_GATHER",
                    comm_size=act_bytes,
                    pg_name=tpg,
                )
            add(f"fwd_attn_L{layer}", "COMP_NODE", dur=fwd_us * 0.4 * jitter)
            add(f"fwd_mlp_L{layer}", "COMP_NODE", dur=fwd_us * 0.6 * jitter)
        add("loss", "COMP_NODE", dur=fwd_us * 0.1)
        allreduces: list[int] = []
        for layer in reversed(range(layers)):
            jitter = rng.uniform(0.9, 1.1)
            add(f"bwd_mlp_L{layer}", "COMP_NODE", dur=fwd_us * 1.2 * jitter)
            grads = add(f"bwd_attn_L{layer}", "COMP_NODE", dur=fwd_us * 0.8 * jitter)
            if tp > 1:
                add(
                    f"bwd_reducescatter_L{layer}",
                    "COMM_COLL_NODE",
                    comm_type="REDUCE_SCATTER",
                    comm_size=act_bytes,
                    pg_name=tpg,
                )
            chain = last
            if ndp > 1:
                # the gradient all-reduce waits only for this layer's gradients: overlappable
                allreduces.append(
                    add(
                        f"grad_allreduce_L{layer}",
                        "COMM_COLL_NODE",
                        after=[grads],
                        comm_type="ALL_REDUCE",
                        comm_size=grad_bytes,
                        pg_name=dpg,
                    )
                )
                last = chain
        add(
            "optimizer_step",
            "COMP_NODE",
            dur=fwd_us * 0.3,
            after=[*allreduces, *([] if last is None else [last])],
        )
    ops = ops_table(cols)
    deps = deps_table(np.asarray(d_rank), np.asarray(d_src), np.asarray(d_dst))
    params = {
        "ranks": ranks,
        "layers": layers,
        "tp": tp,
        "hidden": hidden,
        "seq_tokens": seq_tokens,
        "bytes_per_elem": bytes_per_elem,
        "seed": seed,
        "comm_groups": groups,
        "producer": "transformer",
    }
    return Trace(
        ops=ops, deps=deps, name=name, kind="workload", source="etstore.workloads.transformer", params=params
    )
