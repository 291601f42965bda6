"""``python -m etstore.cli``: the ``etstore`` command where the console script is not installed."""

from __future__ import annotations

import sys

from etstore.cli import main

__all__: list[str] = []

sys.exit(main())
