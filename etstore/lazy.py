"""Package names imported on first access (PEP 562), one implementation for every package.

Why: ``import etstore`` and the CLI's light commands (``--help``, ``ls``) must not load the
engines, numpy or pyarrow that the names of ``etstore``, ``etstore.store`` and
``etstore.formats`` bring; each package lists which module defines each name and gets its
module-level ``__getattr__``/``__dir__`` from :func:`lazy_exports`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, homes: Mapping[str, str], names: Sequence[str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: a name of ``homes`` is imported from its
    module on first access and kept as a module global; any other name raises AttributeError
    (so ``from package import submodule`` still imports the submodule as usual).

    Parameters
    ----------
    package
        The package's ``__name__``.
    homes
        Name → the module that defines it.
    names
        The package's ``__all__`` (what ``dir()`` lists besides its globals).
    """

    def getattr_(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names})

    return getattr_, dir_
