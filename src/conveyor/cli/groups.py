"""``conveyor groups``: the consumer groups of the queues."""

# Annotations are objects here, not strings (no `from __future__ import annotations`):
# typer reads every command's, and would compile and evaluate each string, twice,
# on every command line (some 20 ms).

from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from conveyor.cli._common import JsonOption, UrlOption, cli, open_store, out, print_json, when

groups_cli = typer.Typer(
    help="Consumer groups: list them with their state.",
    no_args_is_help=True,
)
cli.add_typer(groups_cli, name="groups")

QueueFilter = Annotated[
    str | None, typer.Option("--queue", "-q", help="Only the groups of this queue.")
]


@groups_cli.command("list")
def groups_list(
    queue: QueueFilter = None, url: UrlOption = None, as_json: JsonOption = False
) -> None:
    """List the consumer groups (active and unsubscribed), by queue and name."""
    with open_store(url, create=False) as store:
        found = store.groups(queue)
    if as_json:
        print_json(
            [
                {
                    "queue": g.queue,
                    "name": g.name,
                    "start": None if g.start is None else g.start.isoformat(),
                    "created_at": g.created_at.isoformat(),
                    "active": g.active,
                }
                for g in found
            ]
        )
        return
    console = out()
    if not found:
        console.print("[dim]no consumer group: subscribe one with store.subscribe(queue, group)[/]")
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for column in ("queue", "group", "active", "start (UTC)", "created (UTC)"):
        table.add_column(column)
    for g in found:
        table.add_row(
            escape(g.queue),
            escape(g.name),
            "yes" if g.active else "no",
            when(g.start)[:19],
            when(g.created_at)[:19],
        )
    console.print(table)
