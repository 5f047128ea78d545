"""A task's dependency graph as an inline SVG drawn on the server (no JavaScript):
one row per generation, parents above their children, each task a box coloured
by its status that links to its page, an arrow per edge.

A row holds at most :data:`ROW_CAP` boxes; the rest of a wide fan-out is one
"+N more" box, which the edges of the tasks it stands for point to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

from conveyor.models import Task

ROW_CAP = 12
BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 112, 34, 14, 36, 8
COLORS = {
    "waiting": "#9aa0a6",
    "queued": "#3b82c4",
    "running": "#d39b1c",
    "succeeded": "#2e9d5b",
    "failed": "#d64541",
    "cancelled": "#777777",
    "evicted": "#a23bb0",
    "skipped": "#4d6fd1",
}


def _generations(ids: Sequence[str], edges: Sequence[tuple[str, str]]) -> dict[str, int]:
    """Each task's row: the length of the longest chain of parents above it."""
    parents: dict[str, list[str]] = {i: [] for i in ids}
    for parent, child in edges:
        parents[child].append(parent)
    depth: dict[str, int] = {}

    def of(node: str) -> int:
        # Iterative: a long chain must not hit the recursion limit.
        stack = [node]
        while stack:
            top = stack[-1]
            pending = [p for p in parents[top] if p not in depth]
            if pending:
                stack.extend(pending)
                continue
            depth[top] = 1 + max((depth[p] for p in parents[top]), default=-1)
            stack.pop()
        return depth[node]

    for node in ids:
        of(node)
    return depth


def dag_svg(
    tasks: Mapping[str, Task], edges: Sequence[tuple[str, str]], *, focus: str, base: str = ""
) -> str:
    """The graph of ``tasks`` joined by ``edges`` (``(parent_id, child_id)``), the
    task ``focus`` outlined; links go to ``base/tasks/<id>``."""
    ids = list(tasks)
    rows: dict[int, list[str]] = {}
    for node, gen in sorted(_generations(ids, edges).items(), key=lambda kv: (kv[1], kv[0])):
        rows.setdefault(gen, []).append(node)
    shown: dict[str, tuple[float, float]] = {}  # task -> box centre
    more: dict[int, tuple[int, float, float]] = {}  # row -> (hidden, centre)
    widest = max((min(len(r), ROW_CAP) for r in rows.values()), default=1)
    width = PAD * 2 + widest * BOX_W + (widest - 1) * GAP_X
    height = PAD * 2 + len(rows) * BOX_H + (len(rows) - 1) * GAP_Y
    for gen, row in sorted(rows.items()):
        if focus in row[ROW_CAP - 1 :] and len(row) > ROW_CAP:
            row.remove(focus)
            row.insert(0, focus)  # the focused task is always drawn
        visible = row[: ROW_CAP - 1] if len(row) > ROW_CAP else row
        slots = len(visible) + (1 if len(row) > ROW_CAP else 0)
        left = (width - (slots * BOX_W + (slots - 1) * GAP_X)) / 2
        y = PAD + gen * (BOX_H + GAP_Y) + BOX_H / 2
        for i, node in enumerate(visible):
            shown[node] = (left + i * (BOX_W + GAP_X) + BOX_W / 2, y)
        if len(row) > ROW_CAP:
            more[gen] = (
                len(row) - len(visible),
                left + len(visible) * (BOX_W + GAP_X) + BOX_W / 2,
                y,
            )
    gen_of = {node: gen for gen, row in rows.items() for node in row}

    def centre(node: str) -> tuple[float, float]:
        if node in shown:
            return shown[node]
        _, x, y = more[gen_of[node]]
        return x, y

    parts = [
        f'<svg class="dag" role="img" aria-label="dependency graph of {len(ids)} tasks" '
        f'data-tasks="{len(ids)}" data-edges="{len(edges)}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
        '<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="6" '
        'markerHeight="6" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#888"/></marker></defs>',
    ]
    drawn: set[tuple[tuple[float, float], tuple[float, float]]] = set()
    for parent, child in edges:
        (x1, y1), (x2, y2) = centre(parent), centre(child)
        if ((x1, y1), (x2, y2)) in drawn:
            continue  # several hidden tasks behind one "+N more" box: one arrow
        drawn.add(((x1, y1), (x2, y2)))
        parts.append(
            f'<line class="edge" x1="{x1:.1f}" y1="{y1 + BOX_H / 2:.1f}" x2="{x2:.1f}" '
            f'y2="{y2 - BOX_H / 2:.1f}" stroke="#888" marker-end="url(#arrow)"/>'
        )
    for node, (x, y) in shown.items():
        task = tasks[node]
        status = task.status.value
        label = escape(task.name[:16])
        outline = ' stroke="#111" stroke-width="3"' if node == focus else ""
        fill = COLORS.get(status, "#999")
        parts.append(
            f'<a href="{escape(base)}/tasks/{escape(node)}" class="node" data-id="{escape(node)}" '
            f'data-status="{status}"><rect x="{x - BOX_W / 2:.1f}" y="{y - BOX_H / 2:.1f}" '
            f'width="{BOX_W}" height="{BOX_H}" rx="5" fill="{fill}"{outline}/>'
            f'<text x="{x:.1f}" y="{y - 3:.1f}" text-anchor="middle" font-size="11" fill="#fff">'
            f"{label}</text>"
            f'<text x="{x:.1f}" y="{y + 11:.1f}" text-anchor="middle" font-size="9" fill="#fff">'
            f"{status} · …{escape(node[-6:])}</text>"
            f"<title>{escape(task.name)} {escape(node)}: {status}</title></a>"
        )
    for hidden, x, y in more.values():
        parts.append(
            f'<g class="more" data-hidden="{hidden}"><rect x="{x - BOX_W / 2:.1f}" '
            f'y="{y - BOX_H / 2:.1f}" width="{BOX_W}" height="{BOX_H}" rx="5" fill="#ddd"/>'
            f'<text x="{x:.1f}" y="{y + 4:.1f}" text-anchor="middle" font-size="11">'
            f"+{hidden} more</text></g>"
        )
    parts.append("</svg>")
    return "".join(parts)


__all__ = ["dag_svg"]
