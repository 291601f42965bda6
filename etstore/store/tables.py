"""What a feature stores in the warehouse, declared next to the feature: a :class:`TableSet`.

The store holds its own tables (:mod:`etstore.store.schema`); every other table and view is a
feature's (simulation runs, measured runs, tuner runs, calibrations, comparisons,
opportunities), and the module of ``app/`` that writes it declares it as a :class:`TableSet`
constant. The store imports no feature, yet every store holds every feature's tables from its
first open (a query of an empty table answers no rows, not "no such table"), so the package
facade (``etstore/__init__.py``) names the declared sets here with :func:`declare` at import,
and a set's module is imported only when a warehouse must create the set
(:meth:`~etstore.store.warehouse.Warehouse.create_schema`, at the open that finds it missing).
A feature also calls :meth:`~etstore.store.warehouse.Warehouse.ensure` before it writes, which
applies its current declaration (a column or view added since) once per connection.

This module imports nothing heavy: the facade loads it at ``import etstore``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from etstore.errors import StoreError

__all__ = ["TableSet", "declare", "declared", "table_set"]


class TableSet(NamedTuple):
    """One feature's warehouse tables and views, created together and recorded by ``name``.

    Every statement is idempotent (``CREATE TABLE IF NOT EXISTS``, ``CREATE OR REPLACE
    VIEW``), so creating a set again brings an older database up to it: tables created when
    absent, then ``upgrade``, then the views re-created with their current columns.
    """

    name: str
    """What the warehouse records the set under (``etstore_table_sets``) and :func:`declare` names."""
    tables: Mapping[str, str]
    """Table name → its ``CREATE TABLE IF NOT EXISTS`` statement, in creation order."""
    views: Mapping[str, str] = MappingProxyType({})
    """View name → its ``CREATE OR REPLACE VIEW`` statement (re-created with the set)."""
    requires: tuple[str, ...] = ()
    """Names of the sets whose tables these views read (created first where absent)."""
    upgrade: Callable[[Any], None] | None = None
    """Called with the warehouse after the tables and before the views, in the same
    transaction: brings rows or columns an older etstore wrote up to this declaration, or
    raises :class:`~etstore.errors.StoreError` for a database a newer etstore wrote."""

    def statements(self) -> tuple[str, ...]:
        """The tables' DDL, then the views' (what ``--explain`` shows)."""
        return (*self.tables.values(), *self.views.values())


_DECLARED: dict[str, str] = {}  # set name -> "module:ATTRIBUTE" (filled by the package facade)


def declare(sets: Mapping[str, str]) -> None:
    """Name where each feature's set is: set name → ``"package.module:ATTRIBUTE"``.

    The module is imported only when a warehouse needs the set (:func:`table_set`), so
    declaring costs nothing at import.
    """
    _DECLARED.update(sets)


def declared() -> tuple[str, ...]:
    """The names of every declared set, in declaration order."""
    return tuple(_DECLARED)


def table_set(name: str) -> TableSet:
    """The declared set ``name``, its module imported on first use.

    Raises
    ------
    StoreError
        No set of that name is declared, or its declaration names no :class:`TableSet` of
        that name (a wrong declaration: a bug, said in one line).
    """
    where = _DECLARED.get(name)
    if where is None:
        raise StoreError(f"no warehouse table set named {name!r} is declared")
    module, _, attribute = where.partition(":")
    found = getattr(importlib.import_module(module), attribute, None)
    if not isinstance(found, TableSet) or found.name != name:
        raise StoreError(f"table set {name!r} is declared at {where}, which holds no TableSet named {name!r}")
    return found
