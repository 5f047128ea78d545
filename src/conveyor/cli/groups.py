"""``conveyor groups``: the consumer groups of the queues."""

# Annotations are objects here, not strings (no `from __future__ import annotations`):
# typer reads every command's, and would compile and evaluate each string, twice,
# on every command line (some 20 ms).

from datetime import datetime
from typing import Annotated, Literal

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from conveyor.cli._common import (
    EXIT_USAGE,
    CliError,
    JsonOption,
    ReadUrlOption,
    UrlOption,
    age,
    cli,
    open_store,
    out,
    print_json,
    when,
)

groups_cli = typer.Typer(
    help="Consumer groups: list them with their state and health; seek one to replay or skip.",
    no_args_is_help=True,
)
cli.add_typer(groups_cli, name="groups")

QueueFilter = Annotated[
    str | None, typer.Option("--queue", "-q", help="Only the groups of this queue.")
]
LaggingAfter = Annotated[
    float | None,
    typer.Option(
        "--lagging-after",
        help="Seconds the oldest claimable task may wait before a group is lagging "
        "(or stalled); default: ten times the queue's lease.",
        show_default=False,
    ),
]
#: How each health state is shown in the table.
STATE_STYLES = {"ok": "green", "lagging": "yellow", "stalled": "bold red"}


@groups_cli.command("list")
def groups_list(
    queue: QueueFilter = None,
    lagging_after: LaggingAfter = None,
    url: UrlOption = None,
    read_url: ReadUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the consumer groups (active and unsubscribed), by queue and name, with
    their health: state (ok, lagging, stalled), lag, the age of the oldest
    claimable task and the last claim (to about a second)."""
    with open_store(url, create=False, read_url=read_url) as store:
        found = store.groups(queue, lagging_after=lagging_after)
    if as_json:
        print_json(
            [
                {
                    "queue": g.queue,
                    "name": g.name,
                    "start": None if g.start is None else g.start.isoformat(),
                    "created_at": g.created_at.isoformat(),
                    "active": g.active,
                    "state": g.state,
                    "lag": g.lag,
                    "oldest_age": g.oldest_age,
                    "last_claim_at": None
                    if g.last_claim_at is None
                    else g.last_claim_at.isoformat(),
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
    for column in ("state", "lag", "oldest", "last claim (UTC)"):
        table.add_column(column, justify="right" if column in ("lag", "oldest") else "left")
    for g in found:
        table.add_row(
            escape(g.queue),
            escape(g.name),
            "yes" if g.active else "no",
            when(g.start)[:19],
            when(g.created_at)[:19],
            f"[{STATE_STYLES[g.state]}]{g.state}[/]",
            str(g.lag),
            age(g.oldest_age),
            when(g.last_claim_at)[:19],
        )
    console.print(table)


# ------------------------------------------------------------------ seek
@groups_cli.command("seek")
def groups_seek(
    queue: Annotated[str, typer.Argument(help="The queue.", show_default=False)],
    group: Annotated[str, typer.Argument(help="The consumer group.", show_default=False)],
    to: Annotated[
        str,
        typer.Option(
            "--to",
            metavar="TIME|start|end",
            help="Replay the group's tasks created at or after TIME (ISO 8601 with a "
            "zone, e.g. 2026-12-01T00:00Z) and skip those queued before it; start: "
            "replay every retained task; end: skip every queued task.",
            show_default=False,
        ),
    ],
    partition: Annotated[
        str | None, typer.Option("--partition", help="Only this partition's tasks.")
    ] = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Move a consumer group's position: finished tasks from the point on are
    queued again for it, tasks still queued before it are skipped, deliveries in
    progress finish as they are. Queue mode and the other groups are untouched."""
    point = _seek_point(to)
    with open_store(url, create=False) as store:
        done = store.seek(queue, group, to=point, partition=partition)
    if as_json:
        print_json({**done.as_dict(), "to": to})
        return
    scope = f" (partition {escape(partition)})" if partition is not None else ""
    out().print(
        f"group [bold]{escape(group)}[/] of queue [bold]{escape(queue)}[/]{scope} moved to "
        f"{escape(to)}: [green]requeued {done.requeued}[/], skipped {done.skipped}, "
        f"left running {done.left_running}"
    )


def _seek_point(value: str) -> datetime | Literal["start", "end"]:
    """``--to``: start, end, or an ISO 8601 moment with a zone (else a CliError)."""
    if value in ("start", "end"):
        return value  # type: ignore[return-value]
    example = "e.g. --to 2026-12-01T00:00Z, --to start or --to end"
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise CliError(
            EXIT_USAGE, f"--to is not start, end or an ISO 8601 time: {value!r}", example
        ) from None
    if moment.tzinfo is None:
        raise CliError(EXIT_USAGE, f"--to needs a time zone: {value!r}", example)
    return moment
