"""Record a PyTorch execution trace + Kineto trace pair per rank: DDP, FSDP2 or tensor parallel.

Runs ``--ranks`` processes on this machine, trains a small MLP for a few steps and writes per
rank::

    <out>/rank<r>_et.json.gz      host execution trace (torch.profiler.ExecutionTraceObserver)
    <out>/rank<r>_kineto.json.gz  profiler trace (torch.profiler, Chrome-trace JSON)

``--mode`` picks the parallelism:

* ``ddp``: ``DistributedDataParallel`` (one all-reduce of the gradient bucket per step);
* ``fsdp2``: ``torch.distributed.fsdp.fully_shard`` on each linear layer and the model
  (all-gathers of parameters forward and backward, reduce-scatters of gradients);
* ``tp``: tensor parallel (DTensor), Megatron style: the linears in pairs, the first of each
  pair column-wise, the second row-wise (an all-reduce of activations forward, of input
  gradients backward, per pair); ``--layers`` must be even.

``--device cpu`` (the default, no GPU needed) uses the gloo backend over loopback;
``--device cuda`` puts rank ``r`` on GPU ``r % device_count``, records CUDA activity too and uses
NCCL (one rank per GPU: NCCL refuses two ranks on one device) unless ``--backend gloo`` is given.

Each traced step is a profiler step (``ProfilerStep#N`` in the Kineto trace), so ``etstore
replay`` sets each rank's simulated step beside its measured one. Read them back with
``etstore ingest <out>`` or ``etstore replay <out>``.

Usage::

    pip install torch
    python examples/pytorch/record.py --mode fsdp2 --ranks 4 --out traces/fsdp2_4r --steps 2
    python examples/pytorch/record.py --mode ddp --device cuda --ranks 1 --hidden 2048 --batch 512 \
        --out traces/ddp_cuda

Not run by CI (it needs torch); ``tests/data/`` holds recordings made with it
(``pytorch_gloo``: DDP, 2 ranks, before profiler steps were recorded; ``torch_*``: see
their README).
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

__all__ = ["main"]

IN_FEATURES, OUT_FEATURES = 16, 4


def _gzip(path: Path) -> Path:
    """Compress ``path`` to ``path.gz`` and remove the original (traces compress ~10x)."""
    out = path.with_name(path.name + ".gz")
    with path.open("rb") as src, gzip.open(out, "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()
    return out


def _model(
    mode: str, rank: int, world: int, device: torch.device, args: argparse.Namespace
) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The model under ``mode``'s parallelism on ``device``, and this rank's batch."""
    hidden, batch = args.hidden, args.batch
    torch.manual_seed(0)
    inner: list[nn.Module] = []
    for _ in range(args.layers - 2):  # extra hidden layers: more gradient buckets, more parameters
        inner += [nn.Linear(hidden, hidden), nn.ReLU()]
    model = nn.Sequential(
        nn.Linear(IN_FEATURES, hidden), nn.ReLU(), *inner, nn.Linear(hidden, OUT_FEATURES)
    ).to(device)
    torch.manual_seed(1 + (0 if mode == "tp" else rank))  # tensor parallel: every rank sees the same batch
    x = torch.randn(batch, IN_FEATURES, device=device)
    y = torch.randn(batch, OUT_FEATURES, device=device)
    if mode == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=args.bucket_mb)
        return ddp, x, y
    if mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        return model, x, y
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh(device.type, (world,))
    linears = [str(i) for i, m in enumerate(model) if isinstance(m, nn.Linear)]
    plan = {k: ColwiseParallel() if j % 2 == 0 else RowwiseParallel() for j, k in enumerate(linears)}
    return parallelize_module(model, mesh, plan), x, y


def _worker(rank: int, world: int, args: argparse.Namespace) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    cuda = args.device == "cuda"
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = args.backend or ("nccl" if cuda else "gloo")
    dist.init_process_group(
        backend, rank=rank, world_size=world, device_id=device if backend == "nccl" else None
    )
    model, x, y = _model(args.mode, rank, world, device, args)
    steps = args.steps
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()

    step()  # warm-up outside the traces: DDP builds its buckets, FSDP2 its groups, on the first step
    if cuda:
        torch.cuda.synchronize()
    outdir = Path(args.out)
    et_path = outdir / f"rank{rank}_et.json"
    kineto_path = outdir / f"rank{rank}_kineto.json"
    et = ExecutionTraceObserver().register_callback(str(et_path))
    sched = schedule(wait=0, warmup=0, active=steps, repeat=1)
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities, record_shapes=True, schedule=sched) as prof:
        et.start()
        for _ in range(steps):
            step()
            prof.step()
        et.stop()
    et.unregister_callback()
    prof.export_chrome_trace(str(kineto_path))
    _gzip(et_path)
    _gzip(kineto_path)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments and record one trace pair per rank."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("ddp", "fsdp2", "tp"), default="ddp", help="parallelism")
    parser.add_argument("--out", default="pytorch_gloo", help="output directory")
    parser.add_argument("--ranks", type=int, default=2, help="processes (ranks)")
    parser.add_argument("--steps", type=int, default=2, help="training steps traced")
    parser.add_argument("--port", type=int, default=29531, help="rendezvous TCP port on 127.0.0.1")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the model runs")
    parser.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl on cuda, gloo on cpu")
    parser.add_argument("--hidden", type=int, default=32, help="hidden width of the MLP")
    parser.add_argument("--batch", type=int, default=8, help="samples per rank and step")
    parser.add_argument("--layers", type=int, default=2, help="linear layers of the MLP (at least 2)")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket cap, MiB (default 25)")
    args = parser.parse_args(argv)
    if args.layers < 2:
        parser.error("--layers must be at least 2")
    if args.mode == "tp" and args.layers % 2:
        parser.error(f"--mode tp pairs the linears (column-, then row-wise): --layers {args.layers} is odd")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.device == "cpu":  # on a machine with GPUs, FSDP2 would still put its shards on one
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    mp.spawn(_worker, args=(args.ranks, args), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
