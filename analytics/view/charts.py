"""Charts as inline SVG, drawn on the server: the page needs no script library and nothing from the internet. Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 420, 220, 58, 12, 28, 36


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[tuple[float, float]]
    spread: Sequence[float] | None = None  # ± this around each point: a band
    colour: str = "#2a7"
    bars: bool = False
    dashed: bool = False  # a line told apart from a solid one in the same colour family


def _step(lo: float, hi: float, whole: bool) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) giving about five ticks; at least 1 on a count."""
    raw = (hi - lo) / 4 or 1.0
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return max(step, 1.0) if whole else step


def _ticks(lo: float, hi: float, whole: bool = False) -> list[float]:
    """Round ticks within [lo, hi]; whole numbers only where the axis counts (versions, calls)."""
    step = _step(lo, hi, whole)
    first = math.ceil(lo / step - 1e-9)
    return [round(i * step, 12) for i in range(first, math.floor(hi / step + 1e-9) + 1)]


def _label(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 100 or v == int(v) else f"{v:.3g}"


def chart(title: str, series: Sequence[Series], x_label: str, y_label: str) -> str:
    """One chart: lines with points (hover: the values), a band for a spread, or bars."""
    points = [p for s in series for p in s.points]
    if not points:
        return (f'<figure class="chart"><figcaption>{escape(title)}</figcaption>'
                '<p class="empty">no data yet</p></figure>')
    xs = [x for x, _ in points]
    ys = [y for _, y in points] + [y + d for s in series if s.spread for (_, y), d in zip(s.points, s.spread,
                                                                                            strict=True)] + \
        [y - d for s in series if s.spread for (_, y), d in zip(s.points, s.spread, strict=True)]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min([*ys, 0.0]), max([*ys, 0.0])  # zero in sight: a loss near 0 looks it
    whole = all(float(x).is_integer() for x in xs)
    gaps = [b - a for a, b in zip(sorted(set(xs)), sorted(set(xs))[1:], strict=False)]
    gap = min(gaps, default=1.0)
    if any(s.bars for s in series) or x1 == x0:  # room for the first and last bar
        x0, x1 = x0 - gap / 2, x1 + gap / 2
    if y1 == y0:
        y1 = y0 + 1
    step = _step(y0, y1, False)
    y0, y1 = math.floor(y0 / step + 1e-9) * step, math.ceil(y1 / step - 1e-9) * step  # out to round ticks

    def sx(x: float) -> float:
        return PAD_L + (x - x0) / (x1 - x0) * (W - PAD_L - PAD_R)

    def sy(y: float) -> float:
        return H - PAD_B - (y - y0) / (y1 - y0) * (H - PAD_T - PAD_B)

    out = [f'<figure class="chart" data-chart="{escape(title)}"><svg viewBox="0 0 {W} {H}" role="img" '
           f'aria-label="{escape(title)}">',
           f'<text x="{W / 2}" y="16" class="title">{escape(title)}</text>']
    for t in _ticks(y0, y1):
        out.append(f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" class="grid"/>'
                   f'<text x="{PAD_L - 4}" y="{sy(t) + 4:.1f}" class="tick" text-anchor="end">{_label(t)}</text>')
    for t in _ticks(x0, x1, whole):
        out.append(f'<text x="{sx(t):.1f}" y="{H - PAD_B + 14}" class="tick" text-anchor="middle">{_label(t)}</text>')
    out.append(f'<text x="{W / 2}" y="{H - 4}" class="axis">{escape(x_label)}</text>'
               f'<text x="12" y="{H / 2}" class="axis" transform="rotate(-90 12 {H / 2})">{escape(y_label)}</text>')
    width = max(2.0, gap / (x1 - x0) * (W - PAD_L - PAD_R) * 0.7)
    for s in series:
        colour = escape(s.colour)
        if s.spread:
            upper = [(sx(x), sy(y + d)) for (x, y), d in zip(s.points, s.spread, strict=True)]
            lower = [(sx(x), sy(y - d)) for (x, y), d in zip(s.points, s.spread, strict=True)]
            band = " ".join(f"{a:.1f},{b:.1f}" for a, b in [*upper, *reversed(lower)])
            out.append(f'<polygon points="{band}" fill="{colour}" opacity="0.18"/>')
        if s.bars:
            out += [f'<rect x="{sx(x) - width / 2:.1f}" y="{sy(y):.1f}" width="{width:.1f}" '
                    f'height="{max(sy(y0) - sy(y), 0.0):.1f}" fill="{colour}"><title>{_label(x)}: {_label(y)}'
                    '</title></rect>' for x, y in s.points]
            continue
        line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s.points)
        dash = ' stroke-dasharray="6 3"' if s.dashed else ""
        out.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        for i, (x, y) in enumerate(s.points):
            spread = f" ± {_label(s.spread[i])}" if s.spread else ""
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colour}"><title>{escape(s.name)} '
                       f'at {_label(x)}: {_label(y)}{spread}</title></circle>')
    out.append("</svg>")
    if len(series) > 1:
        out.append('<div class="legend">' + "".join(
            f'<span><i style="background:{escape(s.colour)}"></i>{escape(s.name)}</span>' for s in series) + "</div>")
    out.append(f"<figcaption>{escape(title)}</figcaption></figure>")
    return "".join(out)
