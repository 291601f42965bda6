"""Every example in the package's docstrings runs and prints what it says: a docstring that
shows a call shows its real output (modules whose examples need a store or a server mark
them ``+SKIP`` and say why)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import etstore

MODULES = sorted(
    m.name for m in pkgutil.walk_packages(etstore.__path__, "etstore.") if not m.name.endswith("__main__")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, report=False
    )
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"


def test_there_are_examples_to_run() -> None:
    attempted = 0
    for name in MODULES:
        finder = doctest.DocTestFinder()
        attempted += sum(len(t.examples) for t in finder.find(importlib.import_module(name)))
    assert attempted >= 100  # a suite that found none would pass without checking anything
