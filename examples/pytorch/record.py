"""Record a PyTorch execution trace + Kineto trace pair per rank: DDP over gloo, on CPU.

Runs two processes on this machine (no GPU needed), trains a tiny two-layer model for a
couple of steps under ``torch.nn.parallel.DistributedDataParallel`` with the gloo backend,
and writes per rank::

    <out>/rank<r>_et.json.gz      host execution trace (torch.profiler.ExecutionTraceObserver)
    <out>/rank<r>_kineto.json.gz  profiler trace (torch.profiler, Chrome-trace JSON)

Read them back with ``etstore.ingest.pytorch_et.read_pytorch_et(<out>/rank0_et.json.gz,
kineto=<out>/rank0_kineto.json.gz)`` or ``etstore ingest <out>``.

Usage::

    pip install torch
    python examples/pytorch/record.py --out traces/ddp_gloo --steps 2

Not run by CI (it needs torch); ``tests/data/pytorch_gloo/`` holds one recording made
with it.
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
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile

__all__ = ["main"]

IN_FEATURES, HIDDEN, OUT_FEATURES = 16, 32, 4
BATCH = 8


def _gzip(path: Path) -> Path:
    """Compress ``path`` to ``path.gz`` and remove the original (traces compress ~10x)."""
    out = path.with_name(path.name + ".gz")
    with path.open("rb") as src, gzip.open(out, "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()
    return out


def _worker(rank: int, world: int, out: str, steps: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT_FEATURES))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(BATCH, IN_FEATURES)
    y = torch.randn(BATCH, OUT_FEATURES)

    def step() -> None:
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()

    step()  # warm-up outside the traces: DDP builds its buckets on the first step
    outdir = Path(out)
    et_path = outdir / f"rank{rank}_et.json"
    kineto_path = outdir / f"rank{rank}_kineto.json"
    et = ExecutionTraceObserver().register_callback(str(et_path))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        et.start()
        for _ in range(steps):
            step()
        et.stop()
    et.unregister_callback()
    prof.export_chrome_trace(str(kineto_path))
    _gzip(et_path)
    _gzip(kineto_path)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments and record one trace pair per rank."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="pytorch_gloo", help="output directory")
    parser.add_argument("--ranks", type=int, default=2, help="processes (ranks)")
    parser.add_argument("--steps", type=int, default=2, help="training steps traced")
    parser.add_argument("--port", type=int, default=29531, help="rendezvous TCP port on 127.0.0.1")
    args = parser.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    mp.spawn(_worker, args=(args.ranks, args.out, args.steps, args.port), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
