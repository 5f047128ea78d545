"""``conveyor tasks retry|cancel|purge``: the bulk actions by filter
(``store.retry_where``, ``cancel_where``, ``purge_where``), with a dry run and a
progress bar on long runs."""

# Annotations are objects here, not strings (no `from __future__ import annotations`):
# typer reads every command's, and would compile and evaluate each string, twice,
# on every command line (some 20 ms).

import sys
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.markup import escape

from conveyor.cli._common import (
    EXIT_USAGE,
    CliError,
    GroupOption,
    JsonOption,
    UrlOption,
    cli,
    err,
    open_store,
    out,
    print_json,
)

if TYPE_CHECKING:
    from conveyor.sync_store import SyncStore

Action = Literal["retry", "cancel", "purge"]

#: A run longer than this many rows shows a progress bar (on a terminal).
PROGRESS_FROM = 500

tasks_cli = typer.Typer(
    help="Act on every task of a queue that a filter selects: retry, cancel or purge, "
    "in batches (--dry-run: count only).",
    no_args_is_help=True,
)
cli.add_typer(tasks_cli, name="tasks")

QueueOption = Annotated[
    str, typer.Option("--queue", "-q", help="The queue (required).", show_default=False)
]
NameOption = Annotated[str | None, typer.Option("--name", "-n", help="Only this task name.")]
PartitionOption = Annotated[str | None, typer.Option("--partition", help="Only this partition.")]
AfterOption = Annotated[
    str | None,
    typer.Option(
        "--finished-after",
        metavar="TIME",
        help="Only tasks finished at or after TIME (ISO 8601 with a zone, e.g. "
        "2026-05-01T12:00:00Z).",
    ),
]
BeforeOption = Annotated[
    str | None,
    typer.Option(
        "--finished-before", metavar="TIME", help="Only tasks finished before TIME (ISO 8601)."
    ),
]
LimitOption = Annotated[
    int | None, typer.Option("--limit", "-l", min=1, help="Change at most N tasks.")
]
DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Count what would change; write nothing.")
]


@tasks_cli.command("retry")
def tasks_retry(
    queue: QueueOption,
    status: Annotated[
        str,
        typer.Option(
            "--status", "-s", help="failed, cancelled, evicted, skipped, or any (all four)."
        ),
    ] = "failed",
    name: NameOption = None,
    group: GroupOption = None,
    partition: PartitionOption = None,
    finished_after: AfterOption = None,
    finished_before: BeforeOption = None,
    limit: LimitOption = None,
    reset_attempts: Annotated[
        bool, typer.Option("--reset-attempts", help="Restore each task's attempt budget.")
    ] = False,
    dry_run: DryRunOption = False,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Queue again every failed (--status) task of the queue that the filters
    select, for queue mode or --group; partitions keep their order."""
    _run(
        "retry",
        url,
        as_json,
        dry_run,
        {"reset_attempts": reset_attempts},
        queue=queue,
        group=group,
        status=_status(status),
        name=name,
        partition=partition,
        finished_after=_moment("--finished-after", finished_after),
        finished_before=_moment("--finished-before", finished_before),
        limit=limit,
    )


@tasks_cli.command("cancel")
def tasks_cancel(
    queue: QueueOption,
    status: Annotated[
        str, typer.Option("--status", "-s", help="queued, running, or any (both).")
    ] = "any",
    name: NameOption = None,
    group: GroupOption = None,
    partition: PartitionOption = None,
    limit: LimitOption = None,
    dry_run: DryRunOption = False,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel every queued or running task of the queue that the filters select,
    for queue mode or --group only (other groups keep theirs)."""
    _run(
        "cancel",
        url,
        as_json,
        dry_run,
        {},
        queue=queue,
        group=group,
        status=_status(status),
        name=name,
        partition=partition,
        limit=limit,
    )


@tasks_cli.command("purge")
def tasks_purge(
    queue: QueueOption,
    status: Annotated[
        str,
        typer.Option(
            "--status",
            "-s",
            help="succeeded, failed, cancelled, evicted, skipped, or any (all).",
        ),
    ] = "any",
    name: NameOption = None,
    group: GroupOption = None,
    partition: PartitionOption = None,
    finished_after: AfterOption = None,
    finished_before: BeforeOption = None,
    limit: LimitOption = None,
    dry_run: DryRunOption = False,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Delete the finished tasks of the queue that the filters select (for queue
    mode or --group), with their keys, once every view of them has finished."""
    _run(
        "purge",
        url,
        as_json,
        dry_run,
        {},
        queue=queue,
        group=group,
        status=_status(status),
        name=name,
        partition=partition,
        finished_after=_moment("--finished-after", finished_after),
        finished_before=_moment("--finished-before", finished_before),
        limit=limit,
    )


_DONE = {"retry": "retried", "cancel": "cancelled", "purge": "purged"}


def _run(
    action: Action,
    url: str | None,
    as_json: bool,
    dry_run: bool,
    options: dict[str, Any],
    **filters: Any,
) -> None:
    """Count (``dry_run``) or act, and report how many tasks."""
    watched = not as_json and sys.stderr.isatty()
    with open_store(url, create=False) as store:
        count = 0
        if dry_run or watched:
            count = store.internal.count_where(action, **filters)
        if dry_run:
            changed = count
        elif watched and count > PROGRESS_FROM:
            changed = _with_progress(store, action, count, options, filters)
        else:
            changed = _action(store, action)(**options, **filters)
    view = f"group {filters['group']}" if filters["group"] else "queue mode"
    if as_json:
        print_json(
            {
                "action": action,
                "queue": filters["queue"],
                "group": filters["group"],
                "dry_run": dry_run,
                "count": changed,
            }
        )
        return
    where = f"queue {escape(filters['queue'])} ({escape(view)})"
    if dry_run:
        out().print(
            f"would {action} [bold]{changed}[/] task(s) of {where}; "
            "[dim]nothing written (--dry-run)[/]"
        )
    elif changed:
        out().print(f"[green]{_DONE[action]}[/] [bold]{changed}[/] task(s) of {where}")
    else:
        out().print(f"[dim]no tasks match in {where}: nothing changed[/]")


def _action(store: "SyncStore", action: Action) -> Callable[..., int]:
    """The store's method for ``action``."""
    methods = {
        "retry": store.retry_where,
        "cancel": store.cancel_where,
        "purge": store.purge_where,
    }
    return methods[action]


def _with_progress(
    store: "SyncStore", action: Action, total: int, options: dict[str, Any], filters: dict[str, Any]
) -> int:
    """Run the action with a progress bar on stderr, advanced after each batch."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=err(), transient=True) as progress:
        bar = progress.add_task(f"{action} {filters['queue']}", total=total)

        def advance(n: int) -> None:
            progress.advance(bar, n)

        changed = _action(store, action)(**options, **filters, on_batch=advance)
    return changed


def _status(value: str) -> str | None:
    """``any`` means every status the action applies to."""
    return None if value == "any" else value


def _moment(option: str, value: str | None) -> datetime | None:
    """An ISO 8601 moment with a time zone, or a CliError saying what to give."""
    if value is None:
        return None
    example = f"e.g. {option} 2026-05-01T12:00:00Z"
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise CliError(
            EXIT_USAGE, f"{option} is not an ISO 8601 time: {value!r}", example
        ) from None
    if moment.tzinfo is None:
        raise CliError(EXIT_USAGE, f"{option} needs a time zone: {value!r}", example)
    return moment
