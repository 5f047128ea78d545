"""``conveyor schedules``: the periodic schedules of applications, with their last
and next run (see :mod:`conveyor.schedule`)."""

# Annotations are objects here, not strings (no `from __future__ import annotations`):
# typer reads every command's, and would compile and evaluate each string, twice,
# on every command line (some 20 ms).

from rich import box
from rich.markup import escape
from rich.table import Table

from conveyor.cli._common import JsonOption, UrlOption, cli, open_store, out, print_json, when


@cli.command()
def schedules(url: UrlOption = None, as_json: JsonOption = False) -> None:
    """Periodic schedules (@app.periodic): task, cron or interval, last and next run."""
    with open_store(url, create=False) as store:
        infos = store.internal.schedules()
    if as_json:
        print_json([info.as_dict() for info in infos])
        return
    if not infos:
        out().print("[dim]no schedules yet: a worker of an app with @app.periodic adds them[/]")
        return
    table = Table(box=box.SIMPLE_HEAD)
    for column in ("schedule", "task", "queue", "when", "missed", "last run", "next run"):
        table.add_column(column)
    for info in infos:
        table.add_row(
            escape(info.name),
            escape(info.task),
            escape(info.queue),
            escape(info.spec),
            info.catch_up,
            when(info.last_tick),
            when(info.next_tick),
        )
    out().print(table)
