"""Loss curves as a self-contained inline SVG (no script, no external resource: reports are read offline)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 360, 180
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 56, 10, 10, 34


@dataclass(frozen=True)
class Series:
    label: str
    points: tuple[tuple[int, float], ...]
    color: str
    dashed: bool = False


def _ticks(low: float, high: float, count: int = 4) -> list[float]:
    if high <= low:
        return [low]
    return [low + (high - low) * i / count for i in range(count + 1)]


def loss_plot(title: str, series: list[Series], marker_step: int | None = None) -> str:
    """An SVG line chart of loss against step; log scale on y when the losses span over a decade;
    a vertical line at ``marker_step`` (the step the restart restored)."""
    finite = [(s, v) for line in series for s, v in line.points if math.isfinite(v)]
    if not finite:
        return f'<svg class="plot" role="img" width="{WIDTH}" height="40"><title>{escape(title)}</title>' \
               f'<text x="4" y="24" font-size="12">no losses recorded</text></svg>'
    steps = [s for s, _ in finite]
    values = [v for _, v in finite]
    use_log = min(values) > 0 and max(values) / min(values) > 10
    transform = math.log10 if use_log else (lambda v: v)
    y_low, y_high = transform(min(values)), transform(max(values))
    if y_high == y_low:
        y_low, y_high = y_low - 0.5, y_high + 0.5
    x_low, x_high = min(steps), max(max(steps), min(steps) + 1)
    plot_w, plot_h = WIDTH - MARGIN_LEFT - MARGIN_RIGHT, HEIGHT - MARGIN_TOP - MARGIN_BOTTOM

    def x(step: float) -> float:
        return MARGIN_LEFT + (step - x_low) / (x_high - x_low) * plot_w

    def y(value: float) -> float:
        return MARGIN_TOP + (1 - (transform(value) - y_low) / (y_high - y_low)) * plot_h

    parts = [f'<svg class="plot" role="img" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}"><title>{escape(title)}</title>',
             f'<rect x="{MARGIN_LEFT}" y="{MARGIN_TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>']
    for tick in _ticks(y_low, y_high):
        ty = MARGIN_TOP + (1 - (tick - y_low) / (y_high - y_low)) * plot_h
        label = 10 ** tick if use_log else tick
        parts.append(f'<text x="{MARGIN_LEFT - 4}" y="{ty + 4:.1f}" font-size="10" '
                     f'text-anchor="end">{label:.3g}</text>')
    for tick in sorted({round(t) for t in _ticks(x_low, x_high)}):
        parts.append(f'<text x="{x(tick):.1f}" y="{HEIGHT - MARGIN_BOTTOM + 13}" font-size="10" '
                     f'text-anchor="middle">{tick}</text>')
    parts.append(f'<text x="{MARGIN_LEFT + plot_w / 2}" y="{HEIGHT - 4}" font-size="10" text-anchor="middle">'
                 f'step{" (loss on log scale)" if use_log else ""}</text>')
    if marker_step is not None and x_low <= marker_step <= x_high:
        mx = x(marker_step)
        parts.append(f'<line class="restored-at" x1="{mx:.1f}" y1="{MARGIN_TOP}" x2="{mx:.1f}" '
                     f'y2="{MARGIN_TOP + plot_h}" stroke="#2ca02c" stroke-dasharray="2,2"/>'
                     f'<text x="{mx - 3:.1f}" y="{MARGIN_TOP + plot_h - 4}" font-size="10" text-anchor="end" '
                     f'fill="#2ca02c">restored at {marker_step}</text>')
    for index, line in enumerate(series):
        points = [(s, v) for s, v in line.points if math.isfinite(v)]
        if not points:
            continue
        path = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in points)
        dash = ' stroke-dasharray="5,3"' if line.dashed else ""
        parts.append(f'<polyline class="series" data-label="{escape(line.label)}" points="{path}" fill="none" '
                     f'stroke="{line.color}" stroke-width="1.6"{dash}/>')
        for s, v in points:
            parts.append(f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="2" fill="{line.color}">'
                         f'<title>{escape(line.label)}: step {s}, loss {v!r}</title></circle>')
        legend_x = MARGIN_LEFT + 6 + index * 110
        parts.append(f'<line x1="{legend_x}" y1="{MARGIN_TOP + 8}" x2="{legend_x + 14}" y2="{MARGIN_TOP + 8}" '
                     f'stroke="{line.color}" stroke-width="2"{dash}/>'
                     f'<text x="{legend_x + 18}" y="{MARGIN_TOP + 12}" font-size="10">{escape(line.label)}</text>')
    parts.append("</svg>")
    return "".join(parts)
