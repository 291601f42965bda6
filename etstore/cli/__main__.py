"""``python -m etstore.cli``: the ``etstore`` command where the console script is not installed."""

from __future__ import annotations

import sys

from etstore.cli import _become_the_command, main

__all__: list[str] = []

_become_the_command()
sys.exit(main())
