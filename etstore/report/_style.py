"""The report figures' shared look: template and colours, panel titles that fit, byte-size log axes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from etstore.report._data import COMPUTE, IDLE, RunInfo

__all__ = [
    "COLORS",
    "FALLBACK",
    "MAX_SIZE_TICKS",
    "TEMPLATE",
    "category_color",
    "fmt_bytes",
    "integer_ticks",
    "label_panels",
    "panel_titles",
    "size_axis",
]

TEMPLATE = "plotly_white"
COLORS = {
    COMPUTE: "#4C78A8",
    "ALL_REDUCE": "#E45756",
    "ALL_GATHER": "#F58518",
    "REDUCE_SCATTER": "#B279A2",
    "ALL_TO_ALL": "#9D755D",
    "send/recv": "#54A24B",
    IDLE: "#D0D0D0",
    "critical path": "#000000",
}
FALLBACK = ["#72B7B2", "#EECA3B", "#FF9DA6", "#BAB0AC", "#439894"]
# labelled ticks on a byte-size axis at most; the spacing between them is a whole number of bits
MAX_SIZE_TICKS = 8
_TICK_BITS = (1, 2, 5, 10, 20)
# characters of panel title per figure: a row of n panels gives each about 1/n of them. At the
# report's 13 px title font a character is ~7.5 px, so 84 characters fill ~630 px, the width of
# a page 900 px wide once the plot margins are gone.
_TITLE_CHARS = 84
_TITLE_FONT = {"size": 13}
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def category_color(name: str, k: int) -> str:
    """The colour of a category (a collective type, compute, ...), else the k-th fallback colour."""
    return COLORS.get(name, FALLBACK[k % len(FALLBACK)])


def fmt_bytes(n: int) -> str:
    """A power-of-two byte count as people read it: ``512 B``, ``64 KiB``, ``1 MiB``."""
    k = 0
    while n >= 1024 and n % 1024 == 0 and k < len(_UNITS) - 1:
        n //= 1024
        k += 1
    return f"{n:,} {_UNITS[k]}"


def size_axis(sizes: Sequence[float] | np.ndarray, title: str) -> dict[str, Any]:
    """A log x axis for message sizes in bytes, labelled only at powers of two.

    Plotly's own log axis labels the 2× and 5× minor ticks of each decade ("2", "5")
    without units; this one labels ``2^b`` bytes (``1 KiB``, ``4 MiB``) every ``step`` bits,
    the smallest step of 1, 2, 5, 10, 20 bits that keeps at most :data:`MAX_SIZE_TICKS`
    labels, over the range from the power of two at or below the smallest size to the one
    at or above the largest (one bit wider on each side when they coincide).

    Parameters
    ----------
    sizes
        The sizes drawn, bytes (non-positive values are ignored).
    title
        The axis title.

    Returns
    -------
    dict
        A plotly axis (``type`` log, ``range``, ``tickvals``, ``ticktext``, ``title``).

    Notes
    -----
    O(n) over the sizes.
    """
    arr = np.asarray(sizes, dtype=np.float64)
    arr = arr[np.isfinite(arr) & (arr > 0)]
    if len(arr) == 0:
        return {"title": title, "type": "log"}
    lo = math.floor(math.log2(float(arr.min())) + 1e-9)
    hi = math.ceil(math.log2(float(arr.max())) - 1e-9)
    if hi <= lo:
        lo, hi = max(lo - 1, 0), hi + 1
    step = next((s for s in _TICK_BITS if (hi - lo) // s + 1 <= MAX_SIZE_TICKS), _TICK_BITS[-1])
    bits = [b for b in range(lo, hi + 1) if b % step == 0] or [lo]
    pad = 0.08  # decades each side, so markers on the end ticks are drawn whole
    return {
        "title": title,
        "type": "log",
        "range": [lo * math.log10(2) - pad, hi * math.log10(2) + pad],
        "tickvals": [float(2**b) for b in bits],
        "ticktext": [fmt_bytes(2**b) for b in bits],
        "showgrid": True,
    }


def integer_ticks(n: int) -> dict[str, Any]:
    """Axis ticks for ranks or NPUs ``0 .. n-1``: whole numbers only, about 16 labels at most."""
    return {"tickmode": "linear", "tick0": 0, "dtick": max(1, math.ceil(n / 16))}


def panel_titles(runs: Sequence[RunInfo]) -> list[str]:
    """One short title per run panel: ``run N · trace``, then the topology and congestion where runs differ.

    Each keeps to its share of :data:`_TITLE_CHARS` (the trace name is cut with ``…``; a
    topology or congestion that does not fit whole is left out) so that a row of panels
    never has titles running into each other; :func:`label_panels` puts the full label in
    the hover.
    """
    if not runs:
        return []
    width = max(14, _TITLE_CHARS // len(runs))
    topologies = {r.topology for r in runs}
    congestions = {r.congestion for r in runs}
    out = []
    for r in runs:
        text = f"run {r.run_id} · {r.trace}"
        text = text if len(text) <= width else text[: width - 1] + "…"
        # what tells the runs apart, each part only when it fits whole
        extra = ([r.topology] if len(topologies) > 1 else []) + (
            [r.congestion] if len(congestions) > 1 else []
        )
        for part in extra:
            if len(text) + 3 + len(part) <= width:
                text += " · " + part
        out.append(text)
    return out


def label_panels(fig: go.Figure, runs: Sequence[RunInfo]) -> None:
    """Give the subplot titles of ``make_subplots`` (one per run) the title font and the full label."""
    for ann, run in zip(fig.layout.annotations, runs, strict=False):
        ann.update(font=_TITLE_FONT, hovertext=run.label)
