"""The cyclic garbage collector paused while a phase allocates many small acyclic objects.

A trace read, a simulation or a finder's passes make millions of small dicts, lists and
tuples, none in a cycle; each allocation burst would set off a collection that walks every
object of the process again (it doubled to tripled those phases' time). Reference counting
still frees them; the collector runs again once the phase ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic collector off inside the block, back as it was after it.

    >>> with gc_paused():
    ...     gc.isenabled()
    False
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
