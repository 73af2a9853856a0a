"""Line charts as inline SVG strings: no plotting stack, no script, readable without JS."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

COLORS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2")
WIDTH, HEIGHT = 520, 220
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 26, 36


@dataclass
class Series:
    label: str
    points: Sequence[tuple[float, float]]


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high]."""
    if high <= low:
        return [low]
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step) * step
    return [round(first + i * step, 10) for i in range(int((high - first) / step) + 1)]


def _fmt(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.2e}"


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    y_range: tuple[float, float] | None = None,
    chart_id: str = "",
) -> str:
    """An SVG chart of `series`; an empty chart says there is no data yet."""
    drawn = [s for s in series if s.points]
    esc = html.escape
    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}"'
        + (f' id="{esc(chart_id)}"' if chart_id else "")
        + f' aria-label="{esc(title)}">',
        f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" class="title">{esc(title)}</text>',
    ]
    if not drawn:
        parts.append(
            f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" class="empty">no data yet</text>'
        )
        return "".join(parts) + "</svg>"
    xs = [x for s in drawn for x, _ in s.points]
    ys = [y for s in drawn for _, y in s.points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = y_range if y_range is not None else (min(ys), max(ys))
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return TOP + (1 - (y - y0) / (y1 - y0)) * plot_h

    for t in _ticks(y0, y1):
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py(t):.1f}" y2="{py(t):.1f}" class="grid"/>'
        )
        parts.append(f'<text x="{LEFT - 4}" y="{py(t) + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    for t in _ticks(x0, x1):
        parts.append(
            f'<text x="{px(t):.1f}" y="{HEIGHT - BOTTOM + 14}" text-anchor="middle">{_fmt(t)}</text>'
        )
    parts.append(
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 4}" text-anchor="middle" class="axis">{esc(x_label)}</text>'
    )
    parts.append(
        f'<text x="12" y="{TOP + plot_h / 2}" text-anchor="middle" class="axis" '
        f'transform="rotate(-90 12 {TOP + plot_h / 2})">{esc(y_label)}</text>'
    )
    for i, s in enumerate(drawn):
        color = COLORS[i % len(COLORS)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        if len(s.points) <= 60:
            parts.extend(
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{color}">'
                f"<title>{esc(s.label)}: {_fmt(x)}, {_fmt(y)}</title></circle>"
                for x, y in s.points
            )
        parts.append(
            f'<text x="{LEFT + 6}" y="{TOP + 12 + 13 * i}" fill="{color}" class="legend">{esc(s.label)}</text>'
        )
    return "".join(parts) + "</svg>"
