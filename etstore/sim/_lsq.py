"""The linear algebra of a calibration step: bounded least squares and which columns the data separate.

A calibration (:mod:`etstore.sim.calibrate`) models simulated times as affine in its
parameters ``u`` (multiples of their starting values), so each of its rounds is one
small linear least-squares problem with lower bounds. numpy has no bounded solver and
SciPy is not a dependency, so this module carries Lawson and Hanson's active-set
method; the problems have a few columns (two per topology axis and one more) and
tens of rows.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["column_status", "nonneg_lstsq", "pulled_lstsq"]

NO_EFFECT = 1e-9
"""A column whose norm is below this (relative time per unit u) changes nothing."""
SEPARABLE = 1e-4
"""A column whose distance to the span of the others is below this fraction of its norm
cannot be told from them."""


def nonneg_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``argmin ||a x − b||`` over ``x ≥ 0``.

    Parameters
    ----------
    a, b
        An m × n matrix and an m-vector.

    Returns
    -------
    numpy.ndarray
        The n-vector x.

    Notes
    -----
    Lawson and Hanson's active-set method (Solving Least Squares Problems, 1974, ch. 23):
    at most 3n + 3 outer steps, each one ``numpy.linalg.lstsq`` of O(m n²).
    """
    n = a.shape[1]
    x = np.zeros(n)
    z = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    tol = 1e-12 * max(1.0, float(np.abs(a).max(initial=0.0)) * float(np.abs(b).max(initial=0.0)))
    for _ in range(3 * n + 3):
        cand = np.where(~passive, w, -np.inf)
        if not (cand > tol).any():
            break
        passive[int(np.argmax(cand))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                break
            neg = passive & (z <= 0)
            alpha = float(np.min(x[neg] / (x[neg] - z[neg])))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
            x[~passive] = 0.0
        x = z
        w = a.T @ (b - a @ x)
    return x


def pulled_lstsq(
    a: np.ndarray,
    b: np.ndarray,
    lower: np.ndarray,
    groups: list[np.ndarray],
    effect: np.ndarray,
    weight: float,
    *,
    anchor: np.ndarray | None = None,
) -> np.ndarray:
    """``argmin ||a u − b||`` over ``u ≥ lower``, with faint pulls where the data say nothing.

    Parameters
    ----------
    a, b
        The m × n model (relative time per unit u) and its m targets.
    lower
        Lower bound of each u.
    groups
        Boolean masks of columns the data cannot tell apart: each group is pulled towards
        a common value, so its columns move by one common factor.
    effect
        Columns that change the model; the others are pulled towards their ``anchor``
        with ``weight``, these a million times more faintly.
    weight
        Squared weight of the pulls, relative to one row of ``a``.
    anchor
        Where each column is pulled (default u = 1, its start).

    Returns
    -------
    numpy.ndarray
        The n-vector u.

    Notes
    -----
    O(n) extra rows on top of :func:`nonneg_lstsq`.
    """
    n = a.shape[1]
    rows, targets = [a], [b]
    root = math.sqrt(weight)
    for group in groups:
        m = int(group.sum())
        if m >= 2:
            centre = np.zeros((m, n))
            centre[:, group] = np.eye(m) - 1.0 / m
            rows.append(root * centre)
            targets.append(np.zeros(m))
    pin = np.where(effect, root * 1e-3, root)
    rows.append(np.diag(pin))
    targets.append(pin * (1.0 if anchor is None else anchor))
    a_all, b_all = np.vstack(rows), np.concatenate(targets)
    out: np.ndarray = lower + nonneg_lstsq(a_all, b_all - a_all @ lower)
    return out


def column_status(a: np.ndarray) -> list[str]:
    """Per column of ``a``: ``no effect``, ``not separable`` (in the others' span) or ``fitted``.

    Notes
    -----
    O(n) least-squares projections of O(m n²) each.
    """
    norms = np.linalg.norm(a, axis=0)
    effective = norms > NO_EFFECT
    out = []
    for k in range(a.shape[1]):
        if not effective[k]:
            out.append("no effect")
            continue
        others = np.flatnonzero(effective & (np.arange(a.shape[1]) != k))
        rest = 1.0
        if others.size:
            coef = np.linalg.lstsq(a[:, others], a[:, k], rcond=None)[0]
            rest = float(np.linalg.norm(a[:, k] - a[:, others] @ coef) / norms[k])
        out.append("not separable" if rest < SEPARABLE else "fitted")
    return out
