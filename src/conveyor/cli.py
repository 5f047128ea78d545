"""The ``conveyor`` command line.

Commands::

    conveyor migrate                      apply the schema migrations, print the revision
    conveyor worker MODULE:APP            run a worker for an App (blocks until SIGINT/SIGTERM)
    conveyor submit NAME                  submit a task
    conveyor get ID                       show one task
    conveyor list                         list tasks, a page at a time
    conveyor cancel ID                    cancel a task
    conveyor retry ID                     queue a failed, cancelled or evicted task again
    conveyor stats                        counts, oldest claimable age, group lag per queue
    conveyor demo                         a self-contained tour on a throwaway SQLite file

Every command takes ``--url`` (default ``$CONVEYOR_URL``, else
``sqlite:///conveyor.db``); the data commands take ``--json`` to print JSON for
programs instead of tables for people.

Exit codes:

    0  success
    1  not found (no such task, for queue mode or the group); also any other
       failure, such as the demo's ordering check or an unexpected error
    2  bad input or usage (malformed JSON, invalid argument, unknown option)
    3  conflict: a task with this idempotency key exists (``submit --conflict reject``)
    4  database unavailable, or a configuration error (bad URL, missing driver)
    5  protocol mismatch: the database was written by an incompatible conveyor
  130  interrupted

Errors are one line on stderr, ``error: ...`` followed by a hint; set
``CONVEYOR_DEBUG=1`` to let unexpected errors raise with their traceback.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from sqlalchemy.exc import SQLAlchemyError

import conveyor
from conveyor.connect import DEFAULT_URL, SyncStore, resolve_url
from conveyor.errors import (
    AlreadyExists,
    ConfigurationError,
    ConveyorError,
    InvalidArgument,
    NotFound,
    ProtocolVersionMismatch,
    StoreUnavailable,
)
from conveyor.models import QueueStats, Status, Task

EXIT_OK = 0
EXIT_NOT_FOUND = 1
EXIT_USAGE = 2
EXIT_CONFLICT = 3
EXIT_UNAVAILABLE = 4
EXIT_PROTOCOL = 5
EXIT_INTERRUPTED = 130

CONNECT_TIMEOUT = 10  # seconds a command waits for a PostgreSQL server to answer

EXIT_CODES_HELP = (
    "Exit codes: 0 ok · 1 not found (or another failure) · 2 bad input or usage · "
    "3 conflict (idempotency key exists) · 4 database unavailable or configuration "
    "error · 5 protocol mismatch · 130 interrupted."
)

_STATUS_STYLE = {
    Status.QUEUED: "cyan",
    Status.RUNNING: "yellow",
    Status.SUCCEEDED: "green",
    Status.FAILED: "red",
    Status.CANCELLED: "dim",
    Status.EVICTED: "magenta",
}


class CliError(Exception):
    """A failure the CLI reports as one line on stderr and an exit code."""

    def __init__(self, exit_code: int, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.message = message
        self.hint = hint


#: The typer application; `main` runs it with conveyor's own error reporting.
cli = typer.Typer(
    name="conveyor",
    help=(
        "conveyor: a durable task queue and message bus on SQLite and PostgreSQL.\n\n"
        "Every command takes --url (default $CONVEYOR_URL, else sqlite:///conveyor.db); "
        "data commands take --json for programs.\n\n" + EXIT_CODES_HELP
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="Database URL (default: $CONVEYOR_URL, else sqlite:///conveyor.db).",
        show_default=False,
    ),
]
_JsonOption = Annotated[
    bool, typer.Option("--json", help="Print JSON (for programs) instead of a table.")
]
_GroupOption = Annotated[
    str | None,
    typer.Option("--group", "-g", help="Act as this consumer group (default: queue mode)."),
]


# ---------------------------------------------------------------- helpers
def _out() -> Console:
    # Piped output has no terminal width to honour; the 80 columns rich assumes
    # would squeeze ids and names into slivers.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def _err() -> Console:
    # soft_wrap: an error must stay on one line however narrow the terminal is.
    return Console(stderr=True, highlight=False, soft_wrap=True)


def _print_json(data: Any) -> None:
    # Plain print, not rich: a program reads this, so no wrapping and no colour.
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _shown_url(url: str | None) -> str:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    raw = url or os.environ.get("CONVEYOR_URL") or DEFAULT_URL
    try:
        return make_url(raw).render_as_string(hide_password=True)
    except ArgumentError:
        return raw


@contextmanager
def _store(url: str | None) -> Iterator[SyncStore]:
    from sqlalchemy.engine import make_url

    dialect, async_url = resolve_url(url)
    options: dict[str, Any] = {}
    if dialect == "postgresql":
        # One short call: no LISTEN connection to set up, and an unreachable host
        # fails within seconds instead of waiting out the TCP timeout.
        options["listen"] = False
        if "connect_timeout" not in make_url(async_url).query:
            options["engine_options"] = {"connect_args": {"connect_timeout": CONNECT_TIMEOUT}}
    store = conveyor.connect_sync(url, **options)
    try:
        store.open()
        yield store
    finally:
        store.close()


def _parse_json(option: str, text: str | None) -> Any:
    if text is None:
        return None
    source = text
    if text == "-":
        source = sys.stdin.read()
    elif text.startswith("@"):
        try:
            source = Path(text[1:]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise CliError(
                EXIT_USAGE,
                f"{option}: cannot read {text[1:]!r}: {reason}",
                f"give {option} @PATH of a readable JSON file, or the JSON itself",
            ) from None
    try:
        return json.loads(source)
    except json.JSONDecodeError as exc:
        raise CliError(
            EXIT_USAGE,
            f"{option} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
            f"""quote it for the shell, e.g. {option} '{{"to": "a@b.c"}}', """
            f"or pass {option} @file.json or {option} - for stdin",
        ) from None


def _when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours:02d}h"


def _status(status: Status) -> str:
    return f"[{_STATUS_STYLE.get(status, '')}]{status.value}[/]"


def _compact(value: Any) -> str:
    return escape(json.dumps(value, ensure_ascii=False))


def _task_table(task: Task) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False, padding=(0, 2, 0, 0))
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    view = f"group {task.group}" if task.group else "queue mode"
    rows: list[tuple[str, str]] = [
        ("id", task.id),
        ("name", escape(task.name)),
        ("queue", escape(task.queue) + f"  [dim]({escape(view)})[/]"),
        ("status", _status(task.status)),
        ("attempt", f"{task.attempt} of {task.max_attempts}"),
        ("priority", str(task.priority)),
    ]
    if task.partition is not None:
        rows.append(("partition", escape(task.partition)))
    if task.key is not None:
        rows.append(("key", escape(task.key)))
    rows.append(("payload", _compact(task.payload)))
    if task.metadata:
        rows.append(("metadata", _compact(task.metadata)))
    rows += [
        ("created", _when(task.created_at)),
        ("run at", _when(task.run_at)),
        ("started", _when(task.started_at)),
        ("finished", _when(task.finished_at)),
    ]
    if task.lease_expires_at is not None:
        rows.append(("lease until", _when(task.lease_expires_at)))
    if task.worker_id is not None:
        rows.append(("worker", escape(task.worker_id)))
    if task.progress is not None or task.progress_message:
        shown = "-" if task.progress is None else f"{task.progress:.0%}"
        if task.progress_message:
            shown += f"  {escape(task.progress_message)}"
        rows.append(("progress", shown))
    if task.result is not None:
        rows.append(("result", _compact(task.result)))
    if task.error is not None:
        err = task.error
        rows.append(
            ("error", f"[red]{escape(str(err.get('type')))}[/]: {escape(str(err.get('message')))}")
        )
        if err.get("traceback"):
            rows.append(("traceback", escape(str(err["traceback"]).rstrip())))
    if task.parent_id is not None:
        rows.append(("parent", task.parent_id))
    if task.root_id != task.id:
        rows.append(("root", task.root_id))
    if task.correlation_id is not None:
        rows.append(("correlation", escape(task.correlation_id)))
    for name, value in rows:
        table.add_row(name, value)
    return table


def _show_task(task: Task, as_json: bool, note: str | None = None) -> None:
    if as_json:
        _print_json(task.as_dict())
        return
    out = _out()
    out.print(_task_table(task))
    if note:
        out.print(note)


def _missing(task_id: str, group: str | None) -> CliError:
    where = f" for group {group!r}" if group else ""
    hint = (
        "the group may not have received it; `conveyor stats` lists the groups"
        if group
        else "`conveyor list` shows the ids of existing tasks"
    )
    return CliError(EXIT_NOT_FOUND, f"task {task_id}{where} not found", hint)


# ---------------------------------------------------------------- commands
@cli.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", help="Print the version and exit.", is_eager=True)
    ] = False,
) -> None:
    """conveyor: a durable task queue and message bus on SQLite and PostgreSQL."""
    if version:
        typer.echo(f"conveyor {conveyor.__version__}")
        raise typer.Exit(EXIT_OK)


@cli.command()
def migrate(url: _UrlOption = None, as_json: _JsonOption = False) -> None:
    """Apply pending schema migrations and print the schema revision."""
    from alembic.script import ScriptDirectory

    from conveyor.migrations import SCRIPT_LOCATION
    from conveyor.schema import PROTOCOL_VERSION

    shown = _shown_url(url)
    err = _err()
    before = _current_revisions(url)
    script = ScriptDirectory(SCRIPT_LOCATION)
    known = {rev.revision for rev in script.walk_revisions()}
    pending: list[tuple[str, str]] = []
    if set(before) <= known:
        for rev in reversed(list(script.iterate_revisions("heads", tuple(before) or "base"))):
            pending.append((rev.revision, " ".join((rev.doc or "").split())))
    if not as_json:
        err.print(f"database  {escape(shown)}")
        err.print(f"current   {', '.join(before) if before else 'none (empty database)'}")
    if pending and not as_json:
        with err.status(f"applying {len(pending)} migration(s)…"):
            for revision, title in pending:
                err.print(f"  [dim]→[/] {revision}  {escape(title)}")
            with _store(url):
                pass
    else:
        # Still open the store: it checks the protocol version and refuses an
        # incompatible database with the same exit code as every other command.
        with _store(url):
            pass
    after = _current_revisions(url)
    heads = sorted(script.get_heads())
    if as_json:
        _print_json(
            {
                "url": shown,
                "before": before,
                "applied": [rev for rev, _ in pending],
                "revision": after[0] if len(after) == 1 else after,
                "head": heads[0] if len(heads) == 1 else heads,
                "protocol_version": PROTOCOL_VERSION,
            }
        )
        return
    state = "up to date" if not pending else f"applied {len(pending)} migration(s)"
    _out().print(
        f"[green]✓[/] schema at revision [bold]{', '.join(after)}[/] (head), "
        f"protocol {PROTOCOL_VERSION}: {state}"
    )


def _current_revisions(url: str | None) -> list[str]:
    """The Alembic revisions the database is at (empty before the first migration)."""
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from conveyor.migrations import VERSION_TABLE

    dialect, async_url = resolve_url(url)
    # A short-lived blocking engine: the store's own engine is async and private.
    sync_url = make_url(async_url)
    connect_args: dict[str, Any] = {}
    if dialect == "sqlite":
        sync_url = sync_url.set(drivername="sqlite")
    elif "connect_timeout" not in sync_url.query:
        connect_args["connect_timeout"] = CONNECT_TIMEOUT
    engine = create_engine(sync_url, connect_args=connect_args)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            return sorted(context.get_current_heads())
    except SQLAlchemyError as exc:
        raise StoreUnavailable(
            f"cannot open {_shown_url(url)}: {getattr(exc, 'orig', None) or exc}"
        ) from exc
    finally:
        engine.dispose()


@cli.command()
def worker(
    app_path: Annotated[
        str, typer.Argument(metavar="MODULE:APP", help="Where the App is, e.g. myapp.tasks:app.")
    ],
    queues: Annotated[
        str, typer.Option("--queues", "-q", help="Comma-separated queues to consume.")
    ] = "default",
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", min=1, help="Tasks run at once.")
    ] = 10,
    group: _GroupOption = None,
    url: Annotated[
        str | None,
        typer.Option("--url", help="Database URL (default: the App's URL).", show_default=False),
    ] = None,
    log_level: Annotated[
        str, typer.Option("--log-level", help="debug, info, warning or error.")
    ] = "info",
) -> None:
    """Run a worker for an App until SIGINT/SIGTERM, then exit 0."""
    level = logging.getLevelName(log_level.upper())
    if not isinstance(level, int):
        raise CliError(
            EXIT_USAGE, f"unknown --log-level {log_level!r}", "use debug, info, warning or error"
        )
    # A worker is watched through its log: timestamps, level, logger, message.
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(max(level, logging.WARNING))
    names = [q.strip() for q in queues.split(",")]
    if not names or any(not q for q in names):
        raise CliError(
            EXIT_USAGE,
            f"--queues {queues!r} has an empty queue name",
            "give comma-separated names, e.g. --queues emails,default",
        )
    if ":" not in app_path:
        raise CliError(
            EXIT_USAGE,
            f"{app_path!r} is not MODULE:APP",
            "name the module and the App in it, e.g. conveyor worker myapp.tasks:app",
        )
    try:
        # Imported here: the other commands must not pay for (or depend on) the worker.
        from conveyor.app import load_app
    except ModuleNotFoundError as exc:
        if exc.name != "conveyor.app":
            raise
        raise CliError(
            EXIT_UNAVAILABLE,
            "this installation of conveyor has no worker (conveyor.app is missing)",
            "install a conveyor release that ships the worker",
        ) from None
    # Like `python -m`, let the app live in the current directory.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        application = load_app(app_path)
    except Exception as exc:
        raise CliError(
            EXIT_USAGE,
            f"cannot load {app_path!r}: {_describe(exc)}",
            "check that MODULE is importable from the current directory and APP names "
            "a conveyor.App in it",
        ) from None
    application.run_worker(queues=names, concurrency=concurrency, group=group, url=url)


def _describe(exc: BaseException) -> str:
    """``Type: message (at file:line)`` for an exception raised while loading user code."""
    if isinstance(exc, ConveyorError):
        return " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {exc}"
    package = str(Path(__file__).parent)
    # Point at the user's line, not at importlib's or conveyor's.
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith(("<", package))
    ]
    # An ImportError names the module and a SyntaxError its file and line already.
    if frames and not isinstance(exc, ImportError | SyntaxError):
        text += f" (at {frames[-1].filename}:{frames[-1].lineno})"
    return " ".join(text.split())


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
    queue: Annotated[str, typer.Option("--queue", "-q", help="Queue.")] = "default",
    priority: Annotated[int, typer.Option("--priority", help="Higher runs first.")] = 0,
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
    url: _UrlOption = None,
    as_json: _JsonOption = False,
) -> None:
    """Submit a task."""
    data = _parse_json("--payload", payload)
    meta = _parse_json("--metadata", metadata)
    if conflict not in ("reuse", "reject", "replace"):
        raise CliError(
            EXIT_USAGE,
            f"--conflict must be reuse, reject or replace, got {conflict!r}",
            "see `conveyor submit --help`",
        )
    with _store(url) as store:
        task = store.submit(
            name,
            data,
            queue=queue,
            priority=priority,
            delay=delay,
            key=key,
            conflict=conflict,  # type: ignore[arg-type]
            partition=partition,
            max_attempts=max_attempts,
            metadata=meta,
        )
    if as_json:
        _print_json(task.as_dict())
        return
    _out().print(
        f"[green]submitted[/] {task.id}  {escape(task.name)} → queue {escape(task.queue)}"
        + (f" partition {escape(task.partition)}" if task.partition else "")
        + f"  {_status(task.status)}"
    )


@cli.command()
def get(
    task_id: Annotated[str, typer.Argument(metavar="ID", help="The task id.")],
    group: _GroupOption = None,
    url: _UrlOption = None,
    as_json: _JsonOption = False,
) -> None:
    """Show one task (as queue mode sees it, or as --group sees it)."""
    with _store(url) as store:
        task = store.get(task_id, group=group)
    if task is None:
        raise _missing(task_id, group)
    _show_task(task, as_json)


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
    group: _GroupOption = None,
    limit: Annotated[int, typer.Option("--limit", "-l", min=1, max=10_000, help="Page size.")] = 50,
    cursor: Annotated[
        str | None, typer.Option("--cursor", help="Continue after a previous page.")
    ] = None,
    url: _UrlOption = None,
    as_json: _JsonOption = False,
) -> None:
    """List tasks in submit order, one page at a time."""
    with _store(url) as store:
        page = store.list(
            queue=queue,
            status=status,
            name=name,
            partition=partition,
            group=group,
            limit=limit,
            cursor=cursor,
        )
    if as_json:
        _print_json({"items": [t.as_dict() for t in page.items], "next_cursor": page.next_cursor})
        return
    out = _out()
    if not page.items:
        out.print("[dim]no tasks match[/]")
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    table.add_column("id", no_wrap=True)
    table.add_column("name", min_width=8, overflow="fold")
    table.add_column("queue", min_width=6, overflow="fold")
    table.add_column("partition", min_width=6, overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("try", justify="right", no_wrap=True)
    table.add_column("created (UTC)", no_wrap=True)
    for t in page.items:
        table.add_row(
            t.id,
            escape(t.name),
            escape(t.queue),
            escape(t.partition or "-"),
            _status(t.status),
            f"{t.attempt}/{t.max_attempts}",
            _when(t.created_at)[5:16],
        )
    out.print(table)
    more = f"  next page: --cursor {page.next_cursor}" if page.next_cursor else ""
    out.print(f"[dim]{len(page.items)} task(s){more}[/]")


@cli.command()
def cancel(
    task_id: Annotated[str, typer.Argument(metavar="ID", help="The task id.")],
    url: _UrlOption = None,
    as_json: _JsonOption = False,
) -> None:
    """Cancel a task, for queue mode and every group."""
    with _store(url) as store:
        before = store.get(task_id)
        if before is None:
            raise _missing(task_id, None)
        task = store.cancel(task_id)
    if task is None:
        raise _missing(task_id, None)
    note = (
        f"[dim]task was already {before.status.value}: unchanged[/]"
        if before.status.terminal
        else None
    )
    _show_task(task, as_json, note)


@cli.command()
def retry(
    task_id: Annotated[str, typer.Argument(metavar="ID", help="The task id.")],
    group: _GroupOption = None,
    reset_attempts: Annotated[
        bool, typer.Option("--reset-attempts", help="Restore the full attempt budget.")
    ] = False,
    url: _UrlOption = None,
    as_json: _JsonOption = False,
) -> None:
    """Queue a failed, cancelled or evicted task again."""
    with _store(url) as store:
        before = store.get(task_id, group=group)
        if before is None:
            raise _missing(task_id, group)
        task = store.retry(task_id, reset_attempts=reset_attempts, group=group)
    if task is None:
        raise _missing(task_id, group)
    note = None
    if before.status not in (Status.FAILED, Status.CANCELLED, Status.EVICTED):
        note = (
            f"[dim]task was {before.status.value}: unchanged (retry applies to failed, "
            "cancelled or evicted tasks)[/]"
        )
    _show_task(task, as_json, note)


@cli.command()
def stats(
    queue: Annotated[str | None, typer.Option("--queue", "-q", help="Only this queue.")] = None,
    url: _UrlOption = None,
    as_json: _JsonOption = False,
) -> None:
    """Per queue: counts by status, oldest claimable age, per-group lag, settings."""
    with _store(url) as store:
        reports = store.stats(queue)
        if queue is not None and not reports:
            empty = {s.value: 0 for s in Status}
            reports = [QueueStats(queue=queue, counts=empty, oldest_claimable_age=None)]
        settings = {r.queue: store.get_queue(r.queue) for r in reports}
        history = store.maintenance_history(limit=1)
    for conf in settings.values():
        conf.pop("queue", None)
    if as_json:
        _print_json([{**r.as_dict(), "settings": settings[r.queue]} for r in reports])
        return
    out = _out()
    if not reports:
        out.print("[dim]no queues yet: submit a task with `conveyor submit NAME`[/]")
        return
    for report in reports:
        out.print(_stats_table(report, settings[report.queue]))
    if history:
        last = history[0]
        out.print(
            f"[dim]last maintenance {_when(last['ran_at'])}: recovered {last['recovered']}, "
            f"expired {last['expired']}, evicted {last['evicted']}, "
            f"deleted {last['deleted']}[/]"
        )


queue_cli = typer.Typer(
    help="Per-queue settings: defaults for submit and claim, eviction and retention.",
    no_args_is_help=True,
)
cli.add_typer(queue_cli, name="queue")


@queue_cli.command("set")
def queue_set(
    queue: Annotated[str, typer.Argument(metavar="QUEUE", help="The queue.")],
    lease: Annotated[
        float | None, typer.Option("--lease", help="Default lease, seconds.", show_default=False)
    ] = None,
    max_attempts: Annotated[
        int | None,
        typer.Option("--max-attempts", help="Default attempts per task.", show_default=False),
    ] = None,
    backoff: Annotated[
        str | None,
        typer.Option(
            "--backoff",
            help='Retry backoff: seconds, or JSON like \'{"base": 2, "max": 600}\'.',
            show_default=False,
        ),
    ] = None,
    retention: Annotated[
        float | None,
        typer.Option(
            "--retention",
            help="Delete finished tasks after this many seconds.",
            show_default=False,
        ),
    ] = None,
    max_wait: Annotated[
        float | None,
        typer.Option(
            "--max-wait",
            help="Evict tasks unclaimed this many seconds after run_at.",
            show_default=False,
        ),
    ] = None,
    queue_mode: Annotated[
        bool | None,
        typer.Option(
            "--queue-mode/--groups-only",
            help="--groups-only: queue-mode state never holds retention back.",
            show_default=False,
        ),
    ] = None,
    url: _UrlOption = None,
    as_json: _JsonOption = False,
) -> None:
    """Store settings for QUEUE; options not given keep their value."""
    parsed_backoff: Any = None
    if backoff is not None:
        parsed_backoff = _parse_json("--backoff", backoff)
    with _store(url) as store:
        settings = store.configure_queue(
            queue,
            lease=lease,
            max_attempts=max_attempts,
            backoff=parsed_backoff,
            retention=retention,
            max_wait=max_wait,
            queue_mode=queue_mode,
        )
    _show_settings(settings, as_json)


@queue_cli.command("show")
def queue_show(
    queue: Annotated[str, typer.Argument(metavar="QUEUE", help="The queue.")],
    url: _UrlOption = None,
    as_json: _JsonOption = False,
) -> None:
    """Show the stored settings of QUEUE."""
    with _store(url) as store:
        settings = store.get_queue(queue)
    _show_settings(settings, as_json)


def _show_settings(settings: dict[str, Any], as_json: bool) -> None:
    if as_json:
        _print_json(settings)
        return
    table = Table(
        box=box.SIMPLE_HEAD,
        title=f"queue [bold]{escape(settings['queue'])}[/]",
        title_justify="left",
    )
    table.add_column("setting")
    table.add_column("value")
    for name, value in settings.items():
        if name != "queue":
            table.add_row(name, "default" if value is None else _setting(value))
    _out().print(table)


@cli.command()
def maintain(url: _UrlOption = None, as_json: _JsonOption = False) -> None:
    """Run one maintenance pass: lease recovery, eviction, retention."""
    with _store(url) as store:
        counts = store.maintain()
    if as_json:
        _print_json(counts)
        return
    if counts.get("skipped"):
        _out().print("[dim]another process is running maintenance right now: skipped[/]")
        return
    _out().print(
        f"recovered {counts['recovered']}, expired {counts['expired']}, "
        f"evicted {counts['evicted']}, deleted {counts['deleted']}"
    )


def _stats_table(report: QueueStats, settings: dict[str, Any]) -> Table:
    table = Table(
        title=f"queue [bold]{escape(report.queue)}[/]",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1, 0, 0),
    )
    table.add_column("consumer", no_wrap=True)
    for status in Status:
        table.add_column(status.value, justify="right")
    table.add_column("lag", justify="right")
    table.add_column("oldest", justify="right", no_wrap=True)

    def row(label: str, counts: dict[str, int], lag: int, oldest: float | None) -> None:
        table.add_row(
            label,
            *(str(counts.get(s.value, 0)) for s in Status),
            str(lag),
            _age(oldest),
        )

    base = report.counts
    row(
        "queue mode",
        base,
        base.get("queued", 0) + base.get("running", 0),
        report.oldest_claimable_age,
    )
    for name, group in sorted(report.groups.items()):
        row(f"group {escape(name)}", group.counts, group.lag, group.oldest_claimable_age)
    shown = [f"{k}={_setting(v)}" for k, v in settings.items() if v is not None]
    table.caption = "settings: " + (", ".join(shown) if shown else "defaults")
    table.caption_justify = "left"
    return table


def _setting(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return escape(json.dumps(value, separators=(",", ":")))
    if isinstance(value, float) and value.is_integer():
        return f"{int(value)}s"
    if isinstance(value, float):
        return f"{value}s"
    return escape(str(value))


@cli.command()
def demo(
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            help="Run on this database (default: a temporary SQLite file).",
            show_default=False,
        ),
    ] = None,
    tasks: Annotated[
        int, typer.Option("--tasks", "-n", min=10, max=100_000, help="How many tasks to submit.")
    ] = 300,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the temporary database and print its URL.")
    ] = False,
) -> None:
    """A tour: a queue, a partitioned stream and two consumer groups, with workers."""
    from conveyor import demo as tour

    code = tour.run(url=url, tasks=tasks, keep=keep, console=_out())
    if code:
        raise typer.Exit(code)


# ---------------------------------------------------------------- entry point
def _classify(exc: BaseException, command: str) -> tuple[int, str, str | None]:
    """Exit code, message and hint for an error that ends ``command``."""
    message = " ".join(str(exc).split())
    if isinstance(exc, CliError):
        return exc.exit_code, " ".join(exc.message.split()), exc.hint
    if isinstance(exc, NotFound):
        return EXIT_NOT_FOUND, message, "`conveyor list` shows the ids of existing tasks"
    if isinstance(exc, InvalidArgument):
        return EXIT_USAGE, f"invalid {message}", f"see `conveyor {command} --help`"
    if isinstance(exc, AlreadyExists):
        return (
            EXIT_CONFLICT,
            message,
            "use --conflict reuse to get the existing task, or --conflict replace",
        )
    if isinstance(exc, ProtocolVersionMismatch):
        return EXIT_PROTOCOL, message, "run a conveyor version that matches the database"
    if isinstance(exc, ConfigurationError):
        return EXIT_UNAVAILABLE, message, "pass --url or set $CONVEYOR_URL"
    if isinstance(exc, StoreUnavailable | SQLAlchemyError):
        # SQLAlchemy's pointer to its error catalogue is noise on a one-line report.
        message = re.sub(r"\s*\(Background on this error at: [^)]*\)", "", message)
        hint = "check that the database is running and that --url / $CONVEYOR_URL is right"
        return EXIT_UNAVAILABLE, message, None if "Check that" in message else hint
    if isinstance(exc, ConveyorError):
        return EXIT_NOT_FOUND, message, None
    return (
        EXIT_NOT_FOUND,
        f"unexpected {type(exc).__name__}: {message}",
        "set CONVEYOR_DEBUG=1 to see the traceback, and please report it",
    )


def _report(code: int, message: str, hint: str | None) -> int:
    line = f"[bold red]error:[/] {escape(message)}"
    if hint:
        line += f" [dim](hint: {escape(hint)})[/]"
    _err().print(line)
    return code


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI on ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    command = typer.main.get_command(cli)
    try:
        rv = command.main(
            args=list(argv) if argv is not None else None,
            prog_name="conveyor",
            standalone_mode=False,
        )
    except typer.Abort:
        return _report(EXIT_INTERRUPTED, "interrupted", None)
    except Exception as exc:
        usage = _usage_problem(exc)
        if usage is not None:
            return usage
        expected = isinstance(exc, CliError | ConveyorError | SQLAlchemyError)
        if not expected and os.environ.get("CONVEYOR_DEBUG"):
            raise
        args = sys.argv[1:] if argv is None else list(argv)
        name = next((a for a in args if not a.startswith("-")), "COMMAND")
        return _report(*_classify(exc, name))
    return rv if isinstance(rv, int) else EXIT_OK


def _usage_problem(exc: Exception) -> int | None:
    """Report a command-line parsing error (typer's click errors) and return its code.

    Recognised by shape rather than class: typer has shipped these classes from
    ``click`` and, lately, from a private copy of it.
    """
    code = getattr(exc, "exit_code", None)
    format_message = getattr(exc, "format_message", None)
    if not isinstance(code, int) or not callable(format_message):
        return None
    if type(exc).__name__ == "NoArgsIsHelpError":
        return EXIT_USAGE  # the help has been printed already
    ctx = getattr(exc, "ctx", None)
    path = getattr(ctx, "command_path", None) or "conveyor"
    return _report(code, str(format_message()), f"see `{path} --help`")


def main() -> NoReturn:
    """The ``conveyor`` console script."""
    sys.exit(run())


if __name__ == "__main__":
    main()
