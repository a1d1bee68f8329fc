"""Charts drawn on the server as inline SVG: no JavaScript, no CDN, so the console works offline.

Each function takes plain numbers and returns markup; every text that reaches the markup goes
through format_html, so a label can never inject anything.
"""

from collections.abc import Sequence
from datetime import datetime

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT = 720, 220
LEFT, RIGHT, TOP, BOTTOM = 44, 12, 14, 34  # room for the axis labels


def _nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5 x 10^n at or above value: round numbers on the y axis."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= value:
                return step * factor
        step *= 10


def _y_axis(top_value: int) -> SafeString:
    plot_height = HEIGHT - TOP - BOTTOM
    ticks = [(f"{top_value * i / 4:g}", TOP + plot_height - plot_height * i / 4) for i in range(5)]
    return format_html_join(
        "",
        '<line x1="{}" x2="{}" y1="{}" y2="{}" class="grid"/>'
        '<text x="{}" y="{}" class="axis" text-anchor="end">{}</text>',
        ((LEFT, WIDTH - RIGHT, y, y, LEFT - 6, y + 4, value) for value, y in ticks),
    )


def line_chart(
    *, name: str, slots: Sequence[datetime], series: Sequence[tuple[str, Sequence[int], str]]
) -> SafeString:
    """One polyline per series over time slots (e.g. minutes), with a legend and hour marks."""
    top_value = _nice_ceiling(max([1, *(max(values, default=0) for _, values, _ in series)]))
    plot_width, plot_height = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_width / max(len(slots) - 1, 1)

    def point(index: int, value: int) -> str:
        return f"{LEFT + index * step:.1f},{TOP + plot_height * (1 - value / top_value):.1f}"

    lines = format_html_join(
        "",
        '<polyline points="{}" fill="none" stroke="{}" stroke-width="1.6" data-series="{}">'
        "<title>{}: {} in all</title></polyline>",
        (
            (" ".join(point(i, v) for i, v in enumerate(values)), color, label, label, sum(values))
            for label, values, color in series
        ),
    )
    marks = format_html_join(
        "",
        '<text x="{}" y="{}" class="axis" text-anchor="middle">{}</text>',
        (
            (f"{LEFT + i * step:.1f}", HEIGHT - BOTTOM + 16, slot.strftime("%H:%M"))
            for i, slot in enumerate(slots)
            if slot.minute % 30 == 0
        ),
    )
    legend = format_html_join(
        "",
        '<rect x="{}" y="{}" width="10" height="10" fill="{}"/>'
        '<text x="{}" y="{}" class="axis">{}</text>',
        (
            (LEFT + 150 * i, HEIGHT - 12, color, LEFT + 150 * i + 14, HEIGHT - 3, label)
            for i, (label, _, color) in enumerate(series)
        ),
    )
    return _svg(name, mark_safe(_y_axis(top_value) + lines + marks + legend))  # noqa: S308


def bar_chart(*, name: str, bars: Sequence[tuple[str, int]], color: str = "#a15c00") -> SafeString:
    """Vertical bars with their count above and their label below."""
    top_value = _nice_ceiling(max([1, *(count for _, count in bars)]))
    plot_width, plot_height = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_width / max(len(bars), 1)
    rects = format_html_join(
        "",
        '<rect x="{}" y="{}" width="{}" height="{}" fill="{}" data-label="{}" data-count="{}">'
        "<title>{}: {}</title></rect>"
        '<text x="{}" y="{}" class="axis" text-anchor="middle">{}</text>'
        '<text x="{}" y="{}" class="axis" text-anchor="middle">{}</text>',
        (
            (
                f"{LEFT + i * slot + slot * 0.15:.1f}",
                f"{TOP + plot_height * (1 - count / top_value):.1f}",
                f"{slot * 0.7:.1f}",
                f"{plot_height * count / top_value:.1f}",
                color,
                label,
                count,
                label,
                count,
                f"{LEFT + (i + 0.5) * slot:.1f}",
                f"{TOP + plot_height * (1 - count / top_value) - 4:.1f}",
                count,
                f"{LEFT + (i + 0.5) * slot:.1f}",
                HEIGHT - BOTTOM + 16,
                label,
            )
            for i, (label, count) in enumerate(bars)
        ),
    )
    return _svg(name, mark_safe(_y_axis(top_value) + rects))  # noqa: S308


def _svg(name: str, inner: SafeString) -> SafeString:
    return format_html(
        '<svg class="chart" data-chart="{}" viewBox="0 0 {} {}" role="img" aria-label="{}"'
        ' xmlns="http://www.w3.org/2000/svg">{}</svg>',
        name,
        WIDTH,
        HEIGHT,
        name,
        inner,
    )
