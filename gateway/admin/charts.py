"""Server-rendered SVG charts for the admin pages (no script, no build step, nothing fetched).

Only numbers and escaped labels go into the markup; colours are presentation attributes (the admin
pages' Content-Security-Policy allows no inline styles). Each chart has a ``<title>`` and a
``<desc>`` listing its figures, so it reads without the picture too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from html import escape

from markupsafe import Markup

WIDTH, HEIGHT = 720, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 16, 40
COLOURS = ("#3b6ea8", "#d9822b", "#3f8f5b", "#a8443b", "#7a5aa8", "#8c7a3b", "#3b8c8c", "#666666")
"""Series colours in order (the legend names them; distinguishable in greyscale by order)."""


def _frame(title: str, desc: str, body: list[str], top: float, label: Callable[[float], str],
           days: Sequence[str]) -> Markup:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" '
             f'width="{WIDTH}" height="{HEIGHT}"><title>{escape(title)}</title><desc>{escape(desc)}</desc>']
    for step in range(5):  # horizontal grid lines with their values
        y = TOP + plot_h - plot_h * step / 4
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#dddddd"/>'
                     f'<text x="{LEFT - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end" fill="#444444">'
                     f'{escape(label(top * step / 4))}</text>')
    every = max(1, len(days) // 10)
    slot = plot_w / max(1, len(days))
    for index, day in enumerate(days):
        if index % every == 0 or index == len(days) - 1:
            x = LEFT + slot * (index + 0.5)
            parts.append(f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" font-size="11" text-anchor="middle" '
                         f'fill="#444444">{escape(day[5:])}</text>')
    parts += body
    parts.append("</svg>")
    return Markup("".join(parts))


def _scale(peak: float) -> float:
    """A round top for the y axis at or above ``peak``: 1, 2 or 5 times a power of ten."""
    if peak <= 0:
        return 1.0
    magnitude = 10.0 ** math.floor(math.log10(peak))
    return next(magnitude * f for f in (1, 2, 5, 10) if magnitude * f >= peak * 0.999999)


def bar_chart(values: Mapping[str, float], *, title: str, label: Callable[[float], str]) -> Markup:
    """One bar per day: ``values`` is ``{YYYY-MM-DD: figure}`` oldest first; ``label`` formats a
    figure (axis, ``<desc>``, each bar's tooltip)."""
    days = list(values)
    top = _scale(max(values.values(), default=0.0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(1, len(days))
    body = []
    for index, day in enumerate(days):
        height = plot_h * values[day] / top
        body.append(f'<rect x="{LEFT + slot * index + slot * 0.15:.1f}" y="{TOP + plot_h - height:.1f}" '
                    f'width="{slot * 0.7:.1f}" height="{height:.1f}" fill="{COLOURS[0]}">'
                    f'<title>{escape(day)}: {escape(label(values[day]))}</title></rect>')
    desc = "; ".join(f"{day}: {label(v)}" for day, v in values.items())
    return _frame(title, desc, body, top, label, days)


def stacked_chart(series: Mapping[str, Mapping[str, int]], days: Sequence[str], *, title: str) -> Markup:
    """Stacked bars per day, one colour per series (``{name: {YYYY-MM-DD: count}}``), with a legend."""
    totals = [sum(s.get(day, 0) for s in series.values()) for day in days]
    top = float(max(4, math.ceil(max(totals, default=0) / 4) * 4))  # whole numbers on the axis
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(1, len(days))
    body = []
    for index, day in enumerate(days):
        base = 0.0
        for number, (name, counts) in enumerate(series.items()):
            count = counts.get(day, 0)
            if not count:
                continue
            height = plot_h * count / top
            body.append(f'<rect x="{LEFT + slot * index + slot * 0.15:.1f}" y="{TOP + plot_h - base - height:.1f}" '
                        f'width="{slot * 0.7:.1f}" height="{height:.1f}" fill="{COLOURS[number % len(COLOURS)]}">'
                        f'<title>{escape(day)} {escape(name)}: {count}</title></rect>')
            base += height
    for number, name in enumerate(series):  # the legend, along the top right
        x = WIDTH - RIGHT - 110 * (len(series) - number)
        body.append(f'<rect x="{x}" y="2" width="10" height="10" fill="{COLOURS[number % len(COLOURS)]}"/>'
                    f'<text x="{x + 14}" y="11" font-size="11" fill="#222222">{escape(name)}</text>')
    desc = "; ".join(f"{name}: " + ", ".join(f"{day} {counts.get(day, 0)}" for day in days if counts.get(day))
                     for name, counts in series.items()) or "no turns"
    return _frame(title, desc, body, top, lambda v: f"{v:g}", days)
