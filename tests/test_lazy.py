"""Packages whose names are imported on first use (etstore.lazy)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

LAZY_PACKAGES = ("etstore", "etstore.formats", "etstore.store", "etstore.algorithms")


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_no_first_use_name_is_also_a_submodule(package: str) -> None:
    """Importing a submodule sets the package attribute of its name: a first-use name spelled
    like a submodule would then be the module (``from etstore.algorithms import expand``)."""
    pkg = importlib.import_module(package)
    submodules = {m.name for m in pkgutil.iter_modules(pkg.__path__)}
    lazy = set(pkg._LAZY)
    assert lazy and not lazy & submodules


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_every_name_resolves_to_its_homes_own(package: str) -> None:
    pkg = importlib.import_module(package)
    for name, home in pkg._LAZY.items():
        assert getattr(pkg, name) is getattr(importlib.import_module(home), name), name
    assert set(pkg.__all__) <= set(dir(pkg))


def test_the_function_named_like_its_module_stays_the_function() -> None:
    module = importlib.import_module("etstore.algorithms.expand")  # the submodule, imported first
    from etstore.algorithms import expand

    assert expand is module.expand
