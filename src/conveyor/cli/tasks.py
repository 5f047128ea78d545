"""Commands about single tasks: ``submit``, ``get``, ``list``, ``cancel``, ``retry``."""

# Annotations are objects here, not strings (no `from __future__ import annotations`):
# typer reads every command's, and would compile and evaluate each string, twice,
# on every command line (some 20 ms).

from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from conveyor.cli._common import (
    EXIT_CONFLICT,
    EXIT_USAGE,
    CliError,
    GroupOption,
    JsonOption,
    ReadUrlOption,
    UrlOption,
    cli,
    err,
    error_summary,
    missing,
    open_store,
    out,
    parse_json,
    print_json,
    show_task,
    status_markup,
    when,
)
from conveyor.cli.worker import load_user_app
from conveyor.errors import ConveyorError
from conveyor.models import Status, Task

if TYPE_CHECKING:
    from conveyor.app import App
    from conveyor.sync_store import SyncStore
    from conveyor.task_functions import TaskFunction


@cli.command()
def submit(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The task name.")],
    payload: Annotated[
        str | None,
        typer.Option(
            "--payload",
            "-p",
            metavar="JSON",
            help="JSON payload; @FILE reads a file, - reads stdin.",
        ),
    ] = None,
    queue: Annotated[
        str | None,
        typer.Option("--queue", "-q", help="Queue (default: the task's with --app, else default)."),
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option("--priority", help="Higher runs first (default: the task's, else 0)."),
    ] = None,
    delay: Annotated[
        float | None,
        typer.Option("--delay", min=0, metavar="SECONDS", help="Seconds before it may run."),
    ] = None,
    key: Annotated[str | None, typer.Option("--key", "-k", help="Idempotency key.")] = None,
    conflict: Annotated[
        str,
        typer.Option(
            "--conflict",
            metavar="reuse|reject|replace",
            help="When --key exists: reuse (return it), reject (exit 3) or replace.",
        ),
    ] = "reuse",
    partition: Annotated[
        str | None, typer.Option("--partition", help="FIFO stream within the queue.")
    ] = None,
    max_attempts: Annotated[
        int | None, typer.Option("--max-attempts", min=1, help="Attempts before failing.")
    ] = None,
    metadata: Annotated[
        str | None, typer.Option("--metadata", metavar="JSON", help="JSON object of metadata.")
    ] = None,
    app_path: Annotated[
        str | None,
        typer.Option(
            "--app",
            metavar="MODULE:APP",
            envvar="CONVEYOR_APP",
            help="Take queue, priority and max attempts from the task registered in this "
            "App ($CONVEYOR_APP), and its URL unless --url or $CONVEYOR_URL is given.",
            show_default=False,
        ),
    ] = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Submit a task. With --app, the task's own settings apply unless overridden."""
    data = parse_json("--payload", payload)
    options: dict[str, Any] = {}
    app_url: str | None = None
    if app_path is not None:
        application = load_user_app(app_path)
        fn = _registered(application, name, app_path)
        options = {"queue": fn.queue, "priority": fn.priority, "max_attempts": fn.max_attempts}
        options["backoff"] = fn.backoff
        app_url = application.url
    given = {"queue": queue, "priority": priority, "max_attempts": max_attempts}
    options.update({k: val for k, val in given.items() if val is not None})
    meta = parse_json("--metadata", metadata)
    if conflict not in ("reuse", "reject", "replace"):
        raise CliError(
            EXIT_USAGE,
            f"--conflict must be reuse, reject or replace, got {conflict!r}",
            "see `conveyor submit --help`",
        )
    with open_store(url, app_url=app_url) as store:
        task = store.submit(
            name,
            data,
            delay=delay,
            key=key,
            conflict=conflict,  # type: ignore[arg-type]
            partition=partition,
            metadata=meta,
            **options,
        )
        unattended = _unattended(store, task.queue)
    if unattended:
        err().print(
            f"[yellow]warning:[/] no worker has taken a task from queue {escape(task.queue)!r} "
            "yet and it has no settings; the task waits until a worker consumes it "
            f"([dim]conveyor worker MODULE:APP --queues {escape(task.queue)}[/])"
        )
    if as_json:
        print_json(task.as_dict())
        return
    out().print(
        f"[green]submitted[/] {task.id}  {escape(task.name)} → queue {escape(task.queue)}"
        + (f" partition {escape(task.partition)}" if task.partition else "")
        + f"  {status_markup(task.status)}"
    )


@cli.command()
def get(
    task_id: Annotated[str, typer.Argument(metavar="ID", help="The task id.")],
    group: GroupOption = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show one task (as queue mode sees it, or as --group sees it)."""
    with open_store(url, create=False) as store:
        task = store.get(task_id, group=group)
    if task is None:
        raise missing(task_id, group)
    show_task(task, as_json)


@cli.command("list")
def list_tasks(
    queue: Annotated[str | None, typer.Option("--queue", "-q", help="Only this queue.")] = None,
    status: Annotated[
        str | None,
        typer.Option(
            "--status",
            "-s",
            help="Only this status: " + ", ".join(s.value for s in Status) + ".",
        ),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", "-n", help="Only this task name.")] = None,
    partition: Annotated[
        str | None, typer.Option("--partition", help="Only this partition.")
    ] = None,
    group: GroupOption = None,
    limit: Annotated[int, typer.Option("--limit", "-l", min=1, max=10_000, help="Page size.")] = 50,
    cursor: Annotated[
        str | None, typer.Option("--cursor", help="Continue after a previous page.")
    ] = None,
    oldest_first: Annotated[
        bool,
        typer.Option("--oldest-first", help="Start from the first task submitted."),
    ] = False,
    url: UrlOption = None,
    read_url: ReadUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """List tasks, newest first (--oldest-first: in submit order), a page at a time."""
    order: Literal["oldest", "newest"] = "oldest" if oldest_first else "newest"
    with open_store(url, create=False, read_url=read_url) as store:
        page = store.list(
            queue=queue,
            status=status,
            name=name,
            partition=partition,
            group=group,
            limit=limit,
            cursor=cursor,
            order=order,
        )
        unknown_group = group is not None and not page.items and not _group_exists(store, group)
    if as_json:
        print_json({"items": [t.as_dict() for t in page.items], "next_cursor": page.next_cursor})
        return
    console = out()
    if not page.items:
        if unknown_group:
            console.print(
                f"[dim]no tasks match: no queue has a consumer group {escape(str(group))!r} "
                "(`conveyor stats` lists the groups)[/]"
            )
        else:
            console.print("[dim]no tasks match[/]")
        return
    console.print(task_list_table(page.items))
    flag = " --oldest-first" if oldest_first else ""
    more = f"  next page: --cursor {page.next_cursor}{flag}" if page.next_cursor else ""
    first = "oldest" if oldest_first else "newest"
    console.print(f"[dim]{len(page.items)} task(s), {first} first{more}[/]")


#: The widest an error message is shown in a list; ``conveyor get ID`` shows all.
ERROR_WIDTH = 60


def task_list_table(tasks: list[Task]) -> Table:
    """The table of ``conveyor list``: a row per task; failed tasks say why in an
    error column (there when the page has one)."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    table.add_column("id", no_wrap=True)
    table.add_column("name", min_width=8, overflow="fold")
    table.add_column("queue", min_width=6, overflow="fold")
    table.add_column("partition", min_width=6, overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("try", justify="right", no_wrap=True)
    table.add_column("created (UTC)", no_wrap=True)
    errors = any(t.status is Status.FAILED and t.error for t in tasks)
    if errors:
        table.add_column("error", no_wrap=True, overflow="ellipsis", max_width=ERROR_WIDTH)
    for t in tasks:
        row = [
            t.id,
            escape(t.name),
            escape(t.queue),
            escape(t.partition or "-"),
            status_markup(t.status),
            f"{t.attempt}/{t.max_attempts}",
            when(t.created_at)[:19],
        ]
        if errors:
            row.append(error_summary(t) if t.status is Status.FAILED else "")
        table.add_row(*row)
    return table


def _group_exists(store: "SyncStore", group: str) -> bool:
    """Whether some queue has the consumer group ``group``."""
    try:
        return any(group in report.groups for report in store.stats())
    except ConveyorError:
        return True  # say nothing rather than something wrong


@cli.command()
def cancel(
    task_id: Annotated[str, typer.Argument(metavar="ID", help="The task id.")],
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel a task, for queue mode and every group. A task that has already
    finished stays as it is (exit 3; 0 if it was cancelled already)."""
    with open_store(url, create=False) as store:
        before = store.get(task_id)
        if before is None:
            raise missing(task_id, None)
        task = store.cancel(task_id)
    if task is None:
        raise missing(task_id, None)
    show_task(task, as_json)
    if before.status.terminal:
        _unchanged(f"the task {_state(before.status)}: unchanged")
        if before.status is not Status.CANCELLED:
            raise typer.Exit(EXIT_CONFLICT)


@cli.command()
def retry(
    task_id: Annotated[str, typer.Argument(metavar="ID", help="The task id.")],
    group: GroupOption = None,
    reset_attempts: Annotated[
        bool, typer.Option("--reset-attempts", help="Restore the full attempt budget.")
    ] = False,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Queue a failed, cancelled, evicted or skipped task again. Any other task
    stays as it is (exit 3)."""
    with open_store(url, create=False) as store:
        before = store.get(task_id, group=group)
        if before is None:
            raise missing(task_id, group)
        task = store.retry(task_id, reset_attempts=reset_attempts, group=group)
    if task is None:
        raise missing(task_id, group)
    show_task(task, as_json)
    if before.status not in (Status.FAILED, Status.CANCELLED, Status.EVICTED, Status.SKIPPED):
        _unchanged(
            f"the task {_state(before.status)}: unchanged (only failed, cancelled, "
            "evicted or skipped tasks are retried)"
        )
        raise typer.Exit(EXIT_CONFLICT)


def _unchanged(note: str) -> None:
    """Say on stderr that a command left the task as it was."""
    err().print(f"[yellow]note:[/] {escape(note)}")


_STATES = {
    Status.QUEUED: "is still queued",
    Status.RUNNING: "is running",
    Status.SUCCEEDED: "has already succeeded",
    Status.FAILED: "has already failed",
    Status.CANCELLED: "is already cancelled",
    Status.EVICTED: "was already evicted",
    Status.SKIPPED: "was skipped",
    Status.WAITING: "is waiting for its parents",
}


def _state(status: Status) -> str:
    """``"has already succeeded"``: a status as the rest of a sentence."""
    return _STATES.get(status, f"is {status.value}")


def _registered(application: "App", name: str, app_path: str) -> "TaskFunction[Any, Any]":
    """The task ``name`` registered in ``application``, or a CliError with the
    names it does have (and the likely one, if only the module part is missing)."""
    fn = application.tasks.get(name)
    if fn is not None:
        return fn
    close = [known for known in application.tasks if known.rsplit(".", 1)[-1] == name]
    hint = (
        f"did you mean {close[0]!r}? task names are module-qualified unless "
        "@app.task(name=...) gives one"
        if close
        else "registered: " + (", ".join(sorted(application.tasks)) or "none")
    )
    raise CliError(EXIT_USAGE, f"{app_path} has no task named {name!r}", hint)


def _unattended(store: "SyncStore", queue: str) -> bool:
    """Whether nothing suggests a worker will ever consume ``queue``: no task of
    it ever ran, no settings were stored for it, no consumer group reads it."""
    try:
        for report in store.stats(queue):
            counts = report.counts
            if any(counts.get(s, 0) for s in ("running", "succeeded", "failed")) or report.groups:
                return False
        settings = store.get_queue(queue)
    except ConveyorError:
        return False  # a warning is not worth failing a submit that worked
    return all(
        settings.get(k) is None
        for k in ("lease", "max_attempts", "backoff", "retention", "max_wait")
    )
