"""``conveyor workers``: the live workers, busy or idle, and the tasks they hold."""

# Annotations are objects here, not strings (no `from __future__ import annotations`):
# typer reads every command's, and would compile and evaluate each string, twice,
# on every command line (some 20 ms).

from datetime import UTC, datetime

from rich import box
from rich.markup import escape
from rich.table import Table

from conveyor.cli._common import JsonOption, UrlOption, age, cli, open_store, out, print_json, when


@cli.command()
def workers(url: UrlOption = None, as_json: JsonOption = False) -> None:
    """Live workers: where they run, what they consume, what they hold, when last seen."""
    with open_store(url, create=False) as store:
        found = store.workers()
    if as_json:
        print_json([w.as_dict() for w in found])
        return
    console = out()
    if not found:
        console.print(
            "[dim]no live worker: start one with `conveyor worker MODULE:APP --queues ...`[/]"
        )
        return
    now = datetime.now(UTC)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for column in ("worker", "where", "queues", "consumer", "tasks", "started (UTC)", "seen"):
        table.add_column(column, justify="right" if column == "tasks" else "left")
    for w in found:
        held = str(len(w.tasks)) + ("" if w.concurrency is None else f"/{w.concurrency}")
        table.add_row(
            escape(w.worker_id),
            escape(f"{w.host}:{w.pid}") if w.host else "-",
            escape(",".join(w.queues) or ",".join(sorted({t.queue for t in w.tasks}))),
            escape(f"group {w.group}") if w.group else ("queue mode" if w.host else "-"),
            held,
            when(w.started_at)[:19],
            age((now - w.last_seen).total_seconds()) + " ago",
        )
    console.print(table)
    busy = sum(1 for w in found if w.tasks)
    console.print(f"[dim]{len(found)} live worker(s), {busy} busy[/]")
