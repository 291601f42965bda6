"""Shared fixtures: the third-party files in ../shared/fixtures and a fresh store per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from etstore.store import EmbeddedStore

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "fixtures"
EXAMPLES = ROOT / "examples"


def fixture_path(*parts: str) -> Path:
    """A path under ../shared/fixtures; skips the test when the fixtures are absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"fixture {path} not available (../shared/fixtures missing)")
    return path


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EmbeddedStore]:
    with EmbeddedStore(tmp_path / "store") as s:
        yield s


@pytest.fixture
def feeder() -> Path:
    return fixture_path("chakra", "feeder_tests_trace.0.et")


@pytest.fixture
def rt_template() -> Path:
    return fixture_path("astra-sim", "tests", "rt_template", "inputs", "workload")


@pytest.fixture
def custom_allreduce() -> Path:
    return fixture_path(
        "astra-sim", "examples", "system", "custom_collectives", "custom_ring_allreduce_8npus_1MB"
    )
