"""What the CLI commands share: exit codes, the typer app, common options, a
store opener, JSON parsing and how tasks are shown."""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

import conveyor
from conveyor.connect import DEFAULT_URL, choose_url, display_url, resolve_url
from conveyor.models import Status, Task

if TYPE_CHECKING:
    from conveyor.sync_store import SyncStore

EXIT_OK = 0
EXIT_NOT_FOUND = 1
EXIT_USAGE = 2
EXIT_CONFLICT = 3
EXIT_UNAVAILABLE = 4
EXIT_PROTOCOL = 5
EXIT_NO_SCHEMA = 6
EXIT_INTERRUPTED = 130

CONNECT_TIMEOUT = 10  # seconds a command waits for a PostgreSQL server to answer

EXIT_CODES_HELP = (
    "Exit codes: 0 ok · 1 not found (or another failure) · 2 bad input or usage · "
    "3 conflict (the idempotency key exists, the task's state leaves it unchanged, or "
    "the queue is full) · "
    "4 database unavailable or configuration error · 5 protocol mismatch · 6 no conveyor "
    "schema, or an older one (run conveyor migrate) · 130 interrupted."
)

_STATUS_STYLE = {
    Status.QUEUED: "cyan",
    Status.RUNNING: "yellow",
    Status.SUCCEEDED: "green",
    Status.FAILED: "red",
    Status.CANCELLED: "dim",
    Status.EVICTED: "magenta",
    Status.SKIPPED: "blue",
    Status.WAITING: "bright_black",
}


class CliError(Exception):
    """A failure the CLI reports as one line on stderr and an exit code;
    ``detail`` (say, the user's traceback) is printed above that line."""

    def __init__(
        self, exit_code: int, message: str, hint: str | None = None, *, detail: str | None = None
    ) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.message = message
        self.hint = hint
        self.detail = detail


#: The order ``conveyor --help`` lists commands in: the way a user meets them.
#: Commands not named here follow, in the order they were registered.
COMMAND_ORDER = (
    "demo",
    "worker",
    "submit",
    "get",
    "list",
    "cancel",
    "retry",
    "tasks",
    "stats",
    "workers",
    "groups",
    "queue",
    "maintain",
    "migrate",
)


class _Commands(TyperGroup):
    """The root command group: lists commands in :data:`COMMAND_ORDER`."""

    def list_commands(self, ctx: Any) -> list[str]:
        names = super().list_commands(ctx)
        rank = {name: i for i, name in enumerate(COMMAND_ORDER)}
        return sorted(names, key=lambda name: rank.get(name, len(rank)))


cli = typer.Typer(
    name="conveyor",
    cls=_Commands,
    help=(
        "conveyor: a durable task queue and message bus on SQLite and PostgreSQL.\n\n"
        "Every command takes --url (default $CONVEYOR_URL, else the App's URL where an "
        "App is loaded, else sqlite:///conveyor.db); data commands take --json for "
        "programs.\n\n" + EXIT_CODES_HELP
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="Database URL (default: $CONVEYOR_URL, else sqlite:///conveyor.db).",
        show_default=False,
    ),
]
ReadUrlOption = Annotated[
    str | None,
    typer.Option(
        "--read-url",
        help="A PostgreSQL streaming replica to read from (default: $CONVEYOR_READ_URL); "
        "it may lag behind the primary.",
        show_default=False,
    ),
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print JSON (for programs) instead of a table.")
]
GroupOption = Annotated[
    str | None,
    typer.Option("--group", "-g", help="Act as this consumer group (default: queue mode)."),
]


# ---------------------------------------------------------------- helpers
def out() -> Console:
    # Piped output has no terminal width to honour; the 80 columns rich assumes
    # would squeeze ids and names into slivers.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def err() -> Console:
    # soft_wrap: an error must stay on one line however narrow the terminal is.
    return Console(stderr=True, highlight=False, soft_wrap=True)


def print_json(data: Any) -> None:
    # Plain print, not rich: a program reads this, so no wrapping and no colour.
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def is_database_error(exc: BaseException) -> bool:
    """Whether ``exc`` is one of SQLAlchemy's errors. Asked without importing
    SQLAlchemy (a command that never opened a database must not pay for it): one
    of its errors exists only once it is imported."""
    errors = sys.modules.get("sqlalchemy.exc")
    return errors is not None and isinstance(exc, errors.SQLAlchemyError)


def shown_url(url: str | None, app_url: str | None = None) -> str:
    """The database a command uses (``--url``, else ``$CONVEYOR_URL``, else the
    App's URL, else the default), its password masked."""
    return display_url(choose_url(url, app_url).url)


def url_origin(url: str | None, app_url: str | None = None) -> str:
    """Where the URL in use came from, as the user would name it."""
    origin = choose_url(url, app_url).origin
    if origin == "given":
        return "--url"
    if origin == "env":
        return "$CONVEYOR_URL"
    if origin == "app":
        return "the App's URL (no --url, no $CONVEYOR_URL)"
    return f"the default {DEFAULT_URL} (no --url, no $CONVEYOR_URL)"


def database_line(url: str | None, app_url: str | None = None) -> str:
    """``database sqlite:///conveyor.db (from $CONVEYOR_URL)``: which database a
    command reads, for the top of its report."""
    return f"database {shown_url(url, app_url)} (from {url_origin(url, app_url)})"


def sqlite_file(async_url: str) -> Path | None:
    """The file a SQLite URL names; None for in-memory databases and URI forms."""
    from sqlalchemy.engine import make_url

    database = make_url(async_url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def _check_sqlite_file(
    url: str | None, async_url: str, create: bool, app_url: str | None = None
) -> None:
    path = sqlite_file(async_url)
    if path is None:
        return
    origin = url_origin(url, app_url)
    if not create and not path.exists():
        where = "pass --url or set $CONVEYOR_URL" if url is None else "check the path in --url"
        raise CliError(
            EXIT_UNAVAILABLE,
            f"the SQLite database {path} does not exist (from {origin})",
            f"this command does not create a database; {where}, or create it with "
            "`conveyor migrate` or a first `conveyor submit`",
        )
    if create and not path.parent.is_dir():
        raise CliError(
            EXIT_UNAVAILABLE,
            f"cannot create the SQLite database {path}: the folder {path.parent} does not exist",
            f"create the folder first, or fix the path (from {origin})",
        )


def check_readable(url: str | None) -> None:
    """For a command that opens the store itself and only reads: a SQLite file
    that does not exist is an error (opening it would create it)."""
    dialect, async_url = resolve_url(url)
    if dialect == "sqlite":
        _check_sqlite_file(url, async_url, False)


@contextmanager
def open_store(
    url: str | None,
    *,
    create: bool = True,
    app_url: str | None = None,
    read_url: str | None = None,
) -> Iterator[SyncStore]:
    """An open blocking store for a command (``--url``, else ``$CONVEYOR_URL``,
    else ``app_url``, else the default). ``create=False`` (commands that only
    read, or act on tasks that must exist): a SQLite file that does not exist is
    an error, not created, and conveyor's schema is never created or migrated
    (:class:`~conveyor.errors.MigrationRequired` instead). ``read_url``: a
    replica for the inspection reads (``--read-url``; else ``$CONVEYOR_READ_URL``)."""
    with _collector_paused_once():
        store = _connect(url, create, app_url, read_url)
        try:
            store.open()
        except BaseException:
            store.close()
            raise
    try:
        yield store
    finally:
        store.close()


_paused_once = False


@contextmanager
def _collector_paused_once() -> Iterator[None]:
    """The first store a process opens imports SQLAlchemy, the driver and the
    store: tens of thousands of objects that live as long as the process. The
    garbage collector would walk them again and again as they come, and once
    more at the end, freeing none (some 0.05 s of ``conveyor stats``). So the
    first opening runs with the collector paused, and what it made is frozen
    (``gc.freeze()``: never walked again). Later openings find it all imported."""
    global _paused_once
    if _paused_once or not gc.isenabled():
        yield
        return
    _paused_once = True
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def _connect(
    url: str | None, create: bool, app_url: str | None, read_url: str | None = None
) -> SyncStore:
    from sqlalchemy.engine import make_url

    chosen = choose_url(url, app_url).url
    dialect, async_url = resolve_url(chosen)
    if dialect == "sqlite":
        _check_sqlite_file(url, async_url, create, app_url)
    if dialect == "sqlite":
        # A command makes a call or two and exits: the store without its connection
        # thread and async engine, which would cost it more than its calls (the
        # async layer's imports alone, some 80 ms), on an event loop in this very
        # thread. The same store otherwise.
        from conveyor.store.sqlite.oneshot import OneShotSQLiteStore
        from conveyor.sync_store import CallerLoopStore

        return CallerLoopStore(OneShotSQLiteStore(async_url, migrate=create))
    options: dict[str, Any] = {}
    if read_url is not None:
        options["read_url"] = read_url  # SQLite refuses it, naming it
    if dialect == "postgresql":
        # One short call: no LISTEN connection to set up, and an unreachable host
        # fails within seconds instead of waiting out the TCP timeout.
        options["listen"] = False
        if "connect_timeout" not in make_url(async_url).query:
            options["engine_options"] = {"connect_args": {"connect_timeout": CONNECT_TIMEOUT}}
    return conveyor.connect_sync(chosen, migrate=create, **options)


def parse_json(option: str, text: str | None) -> Any:
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


def when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def age(seconds: float | None) -> str:
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


def status_markup(status: Status) -> str:
    return f"[{_STATUS_STYLE.get(status, '')}]{status.value}[/]"


def compact(value: Any) -> str:
    return escape(json.dumps(value, ensure_ascii=False))


def error_summary(task: Task) -> str:
    """``Type: message`` of the task's error, on one line, as markup."""
    if not task.error:
        return ""
    kind = str(task.error.get("type") or "error")
    message = " ".join(str(task.error.get("message") or "").split())
    return f"[red]{escape(kind)}[/]: {escape(message)}"


def task_table(task: Task) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False, padding=(0, 2, 0, 0))
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    view = f"group {task.group}" if task.group else "queue mode"
    rows: list[tuple[str, str]] = [
        ("id", task.id),
        ("name", escape(task.name)),
        ("queue", escape(task.queue) + f"  [dim]({escape(view)})[/]"),
        ("status", status_markup(task.status)),
        ("attempt", f"{task.attempt} of {task.max_attempts}"),
        ("priority", str(task.priority)),
    ]
    if task.partition is not None:
        rows.append(("partition", escape(task.partition)))
    if task.key is not None:
        rows.append(("key", escape(task.key)))
    rows.append(("payload", compact(task.payload)))
    if task.metadata:
        rows.append(("metadata", compact(task.metadata)))
    rows += [
        ("created", when(task.created_at)),
        ("run at", when(task.run_at)),
        ("started", when(task.started_at)),
        ("finished", when(task.finished_at)),
    ]
    if task.lease_expires_at is not None:
        rows.append(("lease until", when(task.lease_expires_at)))
    if task.worker_id is not None:
        rows.append(("worker", escape(task.worker_id)))
    # Progress describes a run: shown while one is going on, and as the last word
    # of an unfinished one; a task that succeeded is simply done.
    if (task.progress is not None or task.progress_message) and task.status not in (
        Status.SUCCEEDED,
        Status.QUEUED,
    ):
        shown = "-" if task.progress is None else f"{task.progress:.0%}"
        if task.progress_message:
            shown += f"  {escape(task.progress_message)}"
        rows.append(("progress" if task.status is Status.RUNNING else "last progress", shown))
    if task.result is not None:
        rows.append(("result", compact(task.result)))
    if task.error is not None:
        envelope = task.error
        kind, message = escape(str(envelope.get("type"))), escape(str(envelope.get("message")))
        # A task that did not fail for good shows the error of an earlier attempt.
        label = "error" if task.status is Status.FAILED else "last error"
        rows.append((label, f"[red]{kind}[/]: {message}"))
        if envelope.get("traceback"):
            rows.append(("traceback", escape(str(envelope["traceback"]).rstrip())))
    if task.parent_id is not None:
        rows.append(("parent", task.parent_id))
    if task.root_id != task.id:
        rows.append(("root", task.root_id))
    if task.correlation_id is not None:
        rows.append(("correlation", escape(task.correlation_id)))
    for name, value in rows:
        table.add_row(name, value)
    return table


def show_task(task: Task, as_json: bool, note: str | None = None) -> None:
    if as_json:
        print_json(task.as_dict())
        return
    console = out()
    console.print(task_table(task))
    if note:
        console.print(note)


def missing(task_id: str, group: str | None) -> CliError:
    where = f" for group {group!r}" if group else ""
    hint = (
        "the group may not have received it; `conveyor stats` lists the groups"
        if group
        else "`conveyor list` shows the ids of existing tasks"
    )
    return CliError(EXIT_NOT_FOUND, f"task {task_id}{where} not found", hint)
