"""The console every command prints through, made on its first use.

Why: importing rich's console costs ≈ 0.02 s, a tenth of a small simulation's whole
command, and ``--version``, ``--help`` and every command writing JSON or CSV to a pipe
print nothing through it. A :class:`DeferredConsole` answers "is this a terminal?"
(whether to draw progress bars) without rich when plainly not, and is a rich
``Console`` for everything else.

Trace, op and file names reach every line printed, and rich would read ``[/x]`` in them as
a closing tag (a traceback) and ``[pytorch|profiler|execution_graph|thread]`` as a style
(an empty cell). So the console interprets no markup and no ``:emoji:`` codes: what it is
given prints verbatim, and a command that styles part of a line says so with
:func:`styled` instead of tags.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

_VERBATIM: dict[str, Any] = {"markup": False, "emoji": False}
"""Console options that print text as given: names from traces are data, never markup."""

__all__ = ["DeferredConsole", "styled", "warn"]


def _forced_terminal() -> bool:
    """rich's own overrides that make piped output count as a terminal."""
    return "FORCE_COLOR" in os.environ or os.environ.get("TTY_COMPATIBLE", "") == "1"


def _may_be_terminal(stream: TextIO | None) -> bool:
    """Whether ``stream`` is, or rich would treat it as, a terminal (a closed or missing
    stream is not, as rich has it)."""
    try:
        return _forced_terminal() or bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):
        return False


class DeferredConsole:
    """A rich ``Console(**options)`` created when something first needs it, printing text verbatim
    (no markup, no emoji codes) unless ``options`` say otherwise."""

    def __init__(self, **options: Any) -> None:
        self._options = {**_VERBATIM, **options}
        self._console: Console | None = None

    @property
    def console(self) -> Console:
        """The rich console (created on first access)."""
        if self._console is None:
            from rich.console import Console  # lazy: costs ≈ 0.02 s; JSON and CSV output never need it

            self._console = Console(**self._options)
        return self._console

    @property
    def is_terminal(self) -> bool:
        """rich's answer, asked only where stdout is a terminal or rich is told to treat it as one."""
        if not _may_be_terminal(sys.stdout):
            return False
        return self.console.is_terminal

    def __getattr__(self, name: str) -> Any:
        return getattr(self.console, name)


def styled(*parts: str | tuple[str, str]) -> Text:
    """One line of ``parts``, each a plain string or a ``(text, style)`` pair: the way to style part
    of a line that holds names, which are never parsed as markup.

    >>> styled(("[/x]", "bold"), " on ring:4").plain
    '[/x] on ring:4'
    """
    from rich.text import Text  # lazy: as the console

    return Text.assemble(*parts)


def warn(line: str) -> None:
    """``warning: line`` on stderr (so JSON and CSV on stdout stay parseable), in yellow on a
    terminal."""
    if not _may_be_terminal(sys.stderr):
        sys.stderr.write(f"warning: {line}\n")
        sys.stderr.flush()
        return
    from rich.console import Console  # lazy: as above

    Console(stderr=True, markup=False, emoji=False).print(
        f"warning: {line}", style="yellow", highlight=False, soft_wrap=True
    )
