"""Fixtures shared by the reader tests of this folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def pt(shared_fixture: Any) -> Path:
    """The PyTorch traces under ../shared/fixtures (skips when absent)."""
    return shared_fixture("pytorch")
