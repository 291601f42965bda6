"""The operands of an MSCCL++ op, and which operands each op takes, as the executor reads them.

Apart from :mod:`etstore.formats._mscclpp_schema` because these rules say what each op
*means* to the executor (``execution_kernel.hpp``: which operand is local, remote or a
switch buffer, which are LL packets, which pair up), beyond the fields a plan must have.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LOCAL", "REMOTE", "SHAPES", "SWITCH", "Entry", "shape_problem"]

LOCAL, REMOTE, SWITCH = 0, 1, 2


@dataclass(frozen=True)
class Entry:
    """One ``src_buff``/``dst_buff`` entry: a local buffer, a remote buffer or a switch channel.

    ``buf`` is the buffer letter (for remote and switch entries: the buffer they resolve to),
    ``rank`` the GPU that holds it (-1 for a switch entry: every member of its group), ``ref``
    the threadblock-local ``buffer_id``/``switch_channel_id`` (-1 for a local entry).
    """

    kind: int
    buf: str
    rank: int
    ref: int
    index: int
    size: int
    group: tuple[int, ...] = ()


SHAPES: dict[str, tuple[str, str]] = {
    "copy": ("L", "L"),
    "cpkt": ("L", "L"),
    "upkt": ("L", "L"),
    "put": ("L+", "R+"),
    "pws": ("L+", "R+"),
    "pwsf": ("L+", "R+"),
    "ppkt": ("L+", "R+"),
    "rppkt": ("L", "R+"),
    "get": ("R+", "L+"),
    "re": ("LL+", "L"),
    "res": ("LL*", "LR+"),
    "rre": ("LR+", "L"),
    "rres": ("LR+", "LR+"),
    "repkt": ("LL+", "L"),
    "respkt": ("LL*", "LR+"),
    "recpkt": ("LL+", "LL"),
    "recspkt": ("LL*", "LLR+"),
    "glres": ("S", "S"),
    "gstore": ("L", "S"),
    "gstorepkt": ("L", "S"),
}
"""Operand shapes (sources, destinations) of the data ops: a string of L (local), R (remote),
S (switch); a trailing ``+`` repeats the last kind one or more times, ``*`` zero or more."""

_KIND_LETTER = {LOCAL: "L", REMOTE: "R", SWITCH: "S"}
_PAIRED = ("put", "pws", "pwsf", "ppkt", "get")


def _fits(kinds: str, shape: str) -> bool:
    if shape.endswith(("+", "*")):
        head, last = shape[:-2], shape[-2]
        least = len(head) + (1 if shape.endswith("+") else 0)
        return len(kinds) >= least and kinds.startswith(head) and set(kinds[len(head) :]) <= {last}
    return kinds == shape


def _packet_operands(name: str, src: tuple[Entry, ...], dst: tuple[Entry, ...]) -> list[tuple[str, Entry]]:
    """The operands the executor addresses as LL packets in its scratch buffer."""
    out: list[tuple[str, Entry]] = []
    if name in ("upkt", "rppkt"):
        out.append(("src_buff[0]", src[0]))
    if name in ("repkt", "respkt", "recpkt", "recspkt"):
        out += [(f"src_buff[{j}]", e) for j, e in enumerate(src) if j]
    if name in ("ppkt", "rppkt", "respkt", "recspkt", "gstorepkt"):
        out += [(f"dst_buff[{j}]", e) for j, e in enumerate(dst) if e.kind != LOCAL]
    return out


def shape_problem(
    name: str,
    src: tuple[Entry, ...],
    dst: tuple[Entry, ...],
    ctype: str,
    channels: tuple[tuple[int, int], ...],
) -> str:
    """Why the executor would not read data op ``name`` with these operands as written ("" if it would).

    ``channels`` holds (peer, GPU-level index) per channel id of the op.
    """
    want_src, want_dst = SHAPES[name]
    got_src = "".join(_KIND_LETTER[e.kind] for e in src)
    got_dst = "".join(_KIND_LETTER[e.kind] for e in dst)
    if not (_fits(got_src, want_src) and _fits(got_dst, want_dst)):
        return (
            f"operands {got_src or '-'} → {got_dst or '-'} (L local, R remote, S switch); "
            f"the executor reads {want_src} → {want_dst}"
        )
    if name in _PAIRED and len(src) != len(dst):
        return f"{len(src)} source(s) for {len(dst)} destination(s); they pair up one to one"
    if name == "get" and ctype != "memory":
        return "get reads through memory channels only"
    puts = ("put", "pws", "pwsf", "ppkt", "rppkt")
    if name in puts and ctype not in ("memory", "port"):
        return "needs channel_type memory or port"
    if ctype == "port" and name in puts and len(channels) < len(dst):
        return f"{len(dst)} port destinations but {len(channels)} channel id(s)"
    if ctype == "port":
        for j, e in enumerate(dst):
            if e.kind == REMOTE and j < len(channels) and channels[j][0] != e.rank:
                return f"dst_buff[{j}] is gpu {e.rank}'s but port channel {j} leads to gpu {channels[j][0]}"
    if ctype == "memory" and name in puts[:4] and len({e.buf for e in src}) > 1:
        return (
            "sources in different buffers; through a memory channel the executor reads every pair "
            "from the first source's buffer"
        )
    for which, e in _packet_operands(name, src, dst):
        if e.buf != "s":
            return (
                f"operand {which} is an LL packet in {e.buf!r}; the executor keeps packets in its "
                "scratch buffer ('s')"
            )
    sizes = {e.size for e in (*src, *dst)}
    if len(sizes) > 1 and name not in _PAIRED:
        return (
            f"operands of different sizes {sorted(sizes)}; the executor moves the size of the first "
            "source everywhere"
        )
    for a, b in zip(src, dst, strict=True) if name in _PAIRED else ():
        if a.size != b.size:
            return f"a {a.size}-chunk source paired with a {b.size}-chunk destination"
    return ""
