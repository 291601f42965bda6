"""Write ring all-reduce MSCCL-IR XML for N ranks in the shape of ASTRA-sim's ``custom_allreduce.xml``.

One channel, one threadblock per GPU (send to r+1, receive from r-1), N chunks; per GPU
4N-4 steps: ``s`` of its own chunk, N-1 times (``rrc`` then ``s``), then N-1 times
(``r`` then ``s``) without the last ``s`` — only the step types the public
MSCCL-IR → Chakra converter (collectiveapi) handles, so both read the same input. At
N = 8 the steps equal the fixture's line for line. Deterministic (no randomness).

Usage: python bench/data/msccl_ring.py OUT_DIR [--ranks 16 32 64 128]
"""

from __future__ import annotations

import argparse
from pathlib import Path


def ring_allreduce_xml(n: int) -> str:
    """The XML text for ``n`` ranks."""
    out = [
        f'<algo name="allreduce_ring_{n}" proto="Simple" nchannels="1" nchunksperloop="{n}" ngpus="{n}" '
        'coll="allreduce" inplace="1" outofplace="0" minBytes="0" maxBytes="0">'
    ]
    for r in range(n):
        out.append(f'  <gpu id="{r}" i_chunks="{n}" o_chunks="0" s_chunks="0">')
        out.append(f'    <tb id="0" send="{(r + 1) % n}" recv="{(r - 1) % n}" chan="0">')
        seq, c = [("s", r)], r
        for _ in range(n - 1):
            c = (c - 1) % n
            seq += [("rrc", c), ("s", c)]
        for k in range(n - 1):
            c = (c - 1) % n
            seq += [("r", c)] + ([("s", c)] if k < n - 2 else [])
        for i, (typ, c) in enumerate(seq):
            out.append(
                f'      <step s="{i}" type="{typ}" srcbuf="i" srcoff="{c}" dstbuf="i" dstoff="{c}" cnt="1" '
                'depid="-1" deps="-1" hasdep="0"/>'
            )
        out += ["    </tb>", "  </gpu>"]
    out.append("</algo>")
    return "\n".join(out) + "\n"


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
