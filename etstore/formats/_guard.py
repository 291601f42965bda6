"""One guard for numbers a file declares beyond what the columns can hold.

Readers check what they can name precisely (an id, a size, a field) themselves; this
guard turns what is left — an integer past int64 reaching numpy, a value Arrow refuses —
into a :class:`~etstore.errors.TraceFormatError` naming the file, never a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa

from etstore.errors import TraceFormatError

__all__ = ["values_in_range"]


@contextmanager
def values_in_range(source: object) -> Iterator[None]:
    """Re-raise numeric overflow and Arrow conversion errors as one-line TraceFormatErrors."""
    try:
        yield
    except (OverflowError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TraceFormatError(f"{source}: a value does not fit its column ({first[:120]})") from exc
