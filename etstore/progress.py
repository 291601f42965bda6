"""The one shape of a progress report: ``progress(phase, done, total)``.

Long library steps (ingest, simulation, synthesis, expansion, removal) take an optional
callback of this type and call it on the caller's thread, every so often rather than per
item; the CLI draws it as a bar (``etstore.cli._common.phase_step``). It lives on the
lowest floor so that every floor names the same type.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["ProgressFn"]

ProgressFn = Callable[[str, int, int], None]
"""``(phase, done, total)``: the step's phase name, items done so far, and items in all."""
