"""MSCCL-IR XML text built line by line, and the N-rank ring all-reduce."""

from __future__ import annotations

# ---------------------------------------------------------------- MSCCL-IR XML text

MSCCL_HEAD = (
    '<algo name="t" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allreduce" '
    'inplace="0" outofplace="1" minBytes="0" maxBytes="0">'
)


def msccl_doc(
    gpu0: str,
    gpu1: str = "",
    head: str = MSCCL_HEAD,
    chunks: str = 'i_chunks="2" o_chunks="2" s_chunks="2"',
) -> str:
    """A 2-GPU MSCCL-IR document: ``head``, then GPUs 0 and 1 holding the given threadblocks."""
    return (
        f'{head}\n  <gpu id="0" {chunks}>\n{gpu0}\n  </gpu>\n'
        f'  <gpu id="1" {chunks}>\n{gpu1}\n  </gpu>\n</algo>\n'
    )


def msccl_step(
    s: int,
    typ: str,
    sb: str = "i",
    so: int = 0,
    db: str = "i",
    do: int = 0,
    cnt: int = 1,
    depid: int = -1,
    deps: int = -1,
) -> str:
    """One ``<step>`` line (source and destination buffer and offset, count, dependency)."""
    return (
        f'      <step s="{s}" type="{typ}" srcbuf="{sb}" srcoff="{so}" dstbuf="{db}" dstoff="{do}" '
        f'cnt="{cnt}" depid="{depid}" deps="{deps}" hasdep="0"/>'
    )


def msccl_tb(i: int, send: int, recv: int, *steps: str, chan: int = 0) -> str:
    """One ``<tb>`` element (send and receive peers, -1 for none) around the given step lines."""
    return f'    <tb id="{i}" send="{send}" recv="{recv}" chan="{chan}">\n' + "\n".join(steps) + "\n    </tb>"


def ring_allreduce_xml(n: int) -> str:
    """Ring all-reduce MSCCL-IR for ``n`` ranks, shaped like ASTRA-sim's ``custom_allreduce.xml``.

    One channel, one threadblock per GPU (send to r+1, receive from r-1), ``n`` chunks;
    per GPU 4n-4 steps: ``s`` of its own chunk, n-1 times (``rrc`` then ``s``), then n-1
    times (``r`` then ``s``) without the last ``s``: only the step types the public
    MSCCL-IR → Chakra converter handles. At n = 8 the steps equal the fixture's line
    for line.

    Parameters
    ----------
    n
        Number of ranks (GPUs), at least 2.

    Returns
    -------
    str
        The XML text, newline-terminated.

    Notes
    -----
    O(n^2) lines.
    """
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
