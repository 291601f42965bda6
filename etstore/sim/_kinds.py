"""The event loop's vocabulary: op kinds and NPU resource classes as small integers.

The native loop (``_simloop.c``) uses the same numbers for the kinds.
"""

from __future__ import annotations

__all__ = [
    "K_COLL",
    "K_COMP",
    "K_CPU",
    "K_DELAY",
    "K_JOIN",
    "K_MEM",
    "K_RECV",
    "K_SEND",
    "LINK_ITEM",
    "NRES",
    "R_COMM",
    "R_COMP",
    "R_CPU",
    "R_MEM",
    "R_RECV",
    "SUB_TAG_BASE",
]

# op kinds inside the loop
K_COMP, K_CPU, K_SEND, K_RECV, K_COLL, K_JOIN, K_DELAY, K_MEM = range(8)
# resource classes per NPU
R_COMP, R_CPU, R_COMM, R_RECV, R_MEM = range(5)
NRES = 5
SUB_TAG_BASE = 1 << 40  # tags of collective sub-messages live above every trace tag
LINK_ITEM = 1 << 62
"""Loop items ``~(LINK_ITEM + link)`` free a link (store-and-forward; ``LINK_ITEM`` in ``_simstate.h``)."""
