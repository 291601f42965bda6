"""The one shape of a progress report: ``progress(phase, done, total)``.

Long library steps (ingest, simulation, synthesis, expansion, removal) take an optional
callback of this type and call it on the caller's thread, every so often rather than per
item; the CLI draws it as a bar (``etstore.cli._common.phase_step``). It lives on the
lowest floor so that every floor names the same type.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["CountFn", "ProgressFn", "in_phase"]

ProgressFn = Callable[[str, int, int], None]
"""``(phase, done, total)``: the step's phase name, items done so far, and items in all."""

CountFn = Callable[[int, int], None]
"""``(done, total)``: a step that has one phase, or one phase of a longer step."""


def in_phase(progress: ProgressFn | None, phase: str) -> CountFn | None:
    """``progress`` for one named phase: what a step with phases hands to a part that counts.

    >>> seen = []
    >>> in_phase(lambda *s: seen.append(s), "points")(3, 8)
    >>> seen, in_phase(None, "points")
    ([('points', 3, 8)], None)
    """
    return None if progress is None else (lambda done, total: progress(phase, done, total))
