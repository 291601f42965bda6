"""Write ring all-reduce MSCCL-IR XML for N ranks in the shape of ASTRA-sim's ``custom_allreduce.xml``.

The text comes from :func:`etstore.testing.ring_allreduce_xml` (one channel, one
threadblock per GPU, 4N-4 steps of only the types the public MSCCL-IR → Chakra
converter handles, so both read the same input; the tests check it against the
fixture). Deterministic (no randomness).

Usage: python bench/data/msccl_ring.py OUT_DIR [--ranks 16 32 64 128]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from etstore.testing import ring_allreduce_xml

__all__ = ["ring_allreduce_xml", "write"]


def write(out_dir: Path, n: int) -> Path:
    """``out_dir/ring_allreduce_<n>.xml``, written once and reused."""
    path = out_dir / f"ring_allreduce_{n}.xml"
    if not path.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(ring_allreduce_xml(n))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 32, 64, 128])
    args = ap.parse_args()
    for n in args.ranks:
        print(write(args.out_dir, n))


if __name__ == "__main__":
    main()
