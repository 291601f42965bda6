"""Bisection bandwidth: the least bandwidth across a cut of the NPUs into two halves.

For a cut (A, B) with ``|A| = ⌊N/2⌋`` the crossing bandwidth is
``min(bw(A→B), bw(B→A))``; the bisection is its minimum over all cuts. Intact
built-in shapes use a closed form, small topologies are solved exactly by
enumeration, larger ones get an upper bound from spectral cuts.
"""

from __future__ import annotations

import logging
import math
from itertools import combinations

import numpy as np

from etstore.topology.axes import Dim, require_budget
from etstore.topology.links import LinkArrays

__all__ = ["bisection"]

log = logging.getLogger(__name__)

_EXACT_UP_TO = 16  # NPUs; C(16, 8) = 12870 cuts


def bisection(t: LinkArrays) -> tuple[float, bool]:
    """``(bandwidth_gb_per_s, exact)`` of the bisection of ``t``.

    Notes
    -----
    Built-in shapes without failures use the closed form: the cheapest cut across
    one axis, ``(N / n_k) × cut_k`` with ``cut_k`` = 1 link for a mesh axis, 2 for
    a ring, ``⌊n/2⌋⌈n/2⌉`` for fully connected and ``⌊n/2⌋`` ports for a switch
    (exact when that axis has an even size). Other topologies with N ≤ 16 are
    solved exactly by enumeration (O(C(N, N/2) · E)); larger ones get the best of
    spectral cuts (Fiedler vector mixed with the next eigenvector), an upper bound,
    O(N³). ``exact`` says which.
    """
    n = t.num_npus
    if n < 2:
        return 0.0, True
    if t.is_regular():  # every link there, at its axis's bandwidth
        best, exact = math.inf, False
        for d in t.dims:
            if d.size < 2:  # a 1-NPU axis cannot be cut
                continue
            cut, balanced = _cut_1d(d)
            value = cut * (n // d.size)
            if value < best or (value == best and balanced):
                best, exact = value, balanced
        # a balanced cut along one axis is optimal for the regular shapes we build
        return best, exact
    if n <= _EXACT_UP_TO:
        return _bisection_exact(t), True
    return _bisection_spectral(t), False


def _cut_1d(d: Dim) -> tuple[float, bool]:
    """Bandwidth across the best balanced cut of one axis, and whether the cut is balanced."""
    n = d.size
    if d.kind in ("line", "uniring"):
        links = 1.0
    elif d.kind == "ring":
        links = 2.0 if n > 2 else 1.0
    elif d.kind == "fc":
        links = float((n // 2) * (n - n // 2))
    else:  # switch: ports on the smaller side, at full port bandwidth
        return float(n // 2) * d.bandwidth_gb_per_s, n % 2 == 0
    return links * d.bandwidth_gb_per_s, n % 2 == 0


def _cut_value(t: LinkArrays, side: np.ndarray) -> np.ndarray:
    """min(bw(A→B), bw(B→A)) for each row of a boolean membership matrix (True = in A)."""
    a_src, a_dst = side[:, t.src], side[:, t.dst]
    fwd = (a_src & ~a_dst) @ t.bandwidth_gb_per_s
    back = (~a_src & a_dst) @ t.bandwidth_gb_per_s
    return np.minimum(fwd, back)


def _bisection_exact(t: LinkArrays) -> float:
    """Least crossing bandwidth over every balanced cut (NPU 0 on side A)."""
    n = t.num_npus
    sizes = {n // 2, n - n // 2}
    rows = []
    for size in sizes:
        for rest in combinations(range(1, n), size - 1):
            row = np.zeros(n, dtype=bool)
            row[0] = True
            row[list(rest)] = True
            rows.append(row)
    return float(_cut_value(t, np.array(rows)).min())


def _bisection_spectral(t: LinkArrays) -> float:
    """Least crossing bandwidth over balanced cuts ordered by low Laplacian eigenvectors."""
    n = t.num_npus
    # dense weights, Laplacian, eigenvectors and eigh's workspace: about six float64 N x N arrays
    require_budget(48.0 * n * n, f"topology {t.name}: the {n:,} x {n:,} Laplacian of its bisection")
    w = np.zeros((n, n))
    np.add.at(w, (t.src, t.dst), t.bandwidth_gb_per_s)
    w = w + w.T
    lap = np.diag(w.sum(axis=1)) - w
    _, vecs = np.linalg.eigh(lap)
    sides = []
    # the Fiedler vector, and mixes with the next one (they tie on symmetric shapes)
    angles = np.linspace(0, np.pi, 16, endpoint=False) if n > 2 else np.zeros(1)
    for angle in angles:
        v = np.cos(angle) * vecs[:, 1] + (np.sin(angle) * vecs[:, 2] if n > 2 else 0.0)
        order = np.argsort(v, kind="stable")
        for cut_at in {n // 2, n - n // 2}:
            side = np.zeros(n, dtype=bool)
            side[order[:cut_at]] = True
            sides.append(side)
    return float(_cut_value(t, np.array(sides)).min())
