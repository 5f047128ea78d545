"""The throughput plot: an inline SVG drawn on the server (no JavaScript library).

One bar pair per minute: succeeded stacked under failed, with a ``<title>`` on
each bar so hovering shows the minute and the numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from conveyor.models import ThroughputPoint

COLORS = {"succeeded": "#2e9d5b", "failed": "#d64541"}


def throughput_svg(
    points: Sequence[ThroughputPoint], *, width: int = 360, height: int = 64, label: str = ""
) -> str:
    """Succeeded and failed tasks per minute as a small stacked bar chart."""
    n = max(len(points), 1)
    peak = max(
        (p.counts.get("succeeded", 0) + p.counts.get("failed", 0) for p in points), default=0
    )
    top = max(peak, 1)
    plot_h = height - 14  # room for the axis caption
    slot = width / n
    bar_w = max(slot - 1, 1)
    total_ok = sum(p.counts.get("succeeded", 0) for p in points)
    total_failed = sum(p.counts.get("failed", 0) for p in points)
    title = (
        f"{escape(label)} throughput, last {len(points)} min: "
        f"{total_ok} succeeded, {total_failed} failed"
    )
    parts = [
        f'<svg class="plot" role="img" aria-label="{title}" data-points="{len(points)}" '
        f'data-succeeded="{total_ok}" data-failed="{total_failed}" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'xmlns="http://www.w3.org/2000/svg">',
        f"<title>{title}</title>",
        f'<line x1="0" y1="{plot_h + 0.5}" x2="{width}" y2="{plot_h + 0.5}" stroke="#bbb"/>',
    ]
    for i, point in enumerate(points):
        ok = point.counts.get("succeeded", 0)
        failed = point.counts.get("failed", 0)
        if not ok and not failed:
            continue
        x = i * slot
        when = point.minute.strftime("%H:%M")
        y = float(plot_h)
        for status, value in (("succeeded", ok), ("failed", failed)):
            if not value:
                continue
            h = max(value / top * (plot_h - 2), 1.0)
            y -= h
            parts.append(
                f'<rect class="bar {status}" x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" '
                f'height="{h:.1f}" fill="{COLORS[status]}">'
                f"<title>{when} UTC: {ok} succeeded, {failed} failed</title></rect>"
            )
    first = points[0].minute.strftime("%H:%M") if points else ""
    last = points[-1].minute.strftime("%H:%M") if points else ""
    parts.append(
        f'<text x="0" y="{height - 2}" font-size="10" fill="#777">{first}</text>'
        f'<text x="{width}" y="{height - 2}" font-size="10" fill="#777" '
        f'text-anchor="end">{last} UTC · peak {peak}/min</text>'
    )
    parts.append("</svg>")
    return "".join(parts)
