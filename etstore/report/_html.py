"""HTML pieces of the report's text sections: escaped tables and times for people."""

from __future__ import annotations

import html
from collections.abc import Collection, Sequence
from typing import Any

__all__ = ["Raw", "fmt_ns", "table"]


class Raw(str):
    """Already-escaped HTML for a table cell."""


def fmt_ns(ns: float | None) -> str:
    """Time for people: ns, µs or ms (``–`` for none)."""
    if ns is None:
        return "–"
    a = abs(ns)
    if a < 1e3:
        return f"{ns:,.0f} ns"
    if a < 1e6:
        return f"{ns / 1e3:,.2f} µs"
    return f"{ns / 1e6:,.3f} ms"


def table(
    header: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    left: int = 1,
    text: Collection[int] = (),
    css_class: str = "",
) -> str:
    """An HTML table with every cell escaped (except :class:`Raw` ones), in a ``div.tbl`` (scrolls sideways).

    The first ``left`` columns, and the columns numbered in ``text``, are text (left-aligned);
    the others are numbers (right-aligned). ``None`` shows as ``–``.
    """
    aligned = set(range(left)) | set(text)
    th = "".join(
        f'<th class="{"l" if i in aligned else ""}">{html.escape(str(h))}</th>' for i, h in enumerate(header)
    )
    body = []
    for row in rows:
        tds = []
        for i, v in enumerate(row):
            cls = "l" if i in aligned else ""
            cell = v if isinstance(v, Raw) else html.escape("–" if v is None else str(v))
            tds.append(f'<td class="{cls}">{cell}</td>')
        body.append("<tr>" + "".join(tds) + "</tr>")
    attr = f' class="{css_class}"' if css_class else ""
    # in a container that scrolls sideways (the page's CSS: .tbl), so a wide table is never cut off
    return (
        f'<div class="tbl"><table{attr}><thead><tr>{th}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )
