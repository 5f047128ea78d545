"""Commands about the database and its queues: ``migrate``, ``stats``, ``queue
set|show``, ``rekey``, ``maintain``."""

# Annotations are objects here, not strings (no `from __future__ import annotations`):
# typer reads every command's, and would compile and evaluate each string, twice,
# on every command line (some 20 ms).

import json
import re
import sys
from typing import Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from conveyor.cli._common import (
    CONNECT_TIMEOUT,
    EXIT_USAGE,
    CliError,
    JsonOption,
    ReadUrlOption,
    UrlOption,
    age,
    cli,
    database_line,
    err,
    open_store,
    out,
    parse_json,
    print_json,
    shown_url,
    when,
)
from conveyor.connect import resolve_url
from conveyor.errors import (
    InvalidArgument,
    StoreUnavailable,
)
from conveyor.models import QueueStats, Rate, Status


@cli.command()
def migrate(url: UrlOption = None, as_json: JsonOption = False) -> None:
    """Apply pending schema migrations and print the schema revision."""
    from alembic.script import ScriptDirectory

    from conveyor.migrations import SCRIPT_LOCATION
    from conveyor.schema import PROTOCOL_VERSION

    shown = shown_url(url)
    console_err = err()
    before = _current_revisions(url)
    script = ScriptDirectory(SCRIPT_LOCATION)
    known = {rev.revision for rev in script.walk_revisions()}
    pending: list[tuple[str, str]] = []
    if set(before) <= known:
        for rev in reversed(list(script.iterate_revisions("heads", tuple(before) or "base"))):
            pending.append((rev.revision, " ".join((rev.doc or "").split())))
    if not as_json:
        console_err.print(f"database  {escape(shown)}")
        console_err.print(f"current   {', '.join(before) if before else 'none (empty database)'}")
    if pending and not as_json:
        with console_err.status(f"applying {len(pending)} migration(s)…"):
            for revision, title in pending:
                console_err.print(f"  [dim]→[/] {revision}  {escape(title)}")
            with open_store(url):
                pass
    else:
        # Still open the store: it checks the protocol version and refuses an
        # incompatible database with the same exit code as every other command.
        with open_store(url):
            pass
    after = _current_revisions(url)
    heads = sorted(script.get_heads())
    if as_json:
        print_json(
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
    out().print(
        f"[green]✓[/] schema at revision [bold]{', '.join(after)}[/] (head), "
        f"protocol {PROTOCOL_VERSION}: {state}"
    )


def _current_revisions(url: str | None) -> list[str]:
    """The Alembic revisions the database is at (empty before the first migration)."""
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

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
            f"cannot open {shown_url(url)}: {getattr(exc, 'orig', None) or exc}"
        ) from exc
    finally:
        engine.dispose()


@cli.command()
def stats(
    queue: Annotated[str | None, typer.Option("--queue", "-q", help="Only this queue.")] = None,
    url: UrlOption = None,
    read_url: ReadUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Per queue: counts by status, oldest claimable age, per-group lag, settings."""
    with open_store(url, create=False, read_url=read_url) as store:
        reports = store.stats(queue)
        if queue is not None and not reports:
            on = store.get_queue(queue)["queue_mode"]
            empty = {s.value: 0 for s in Status} if on else {}
            reports = [
                QueueStats(queue=queue, counts=empty, oldest_claimable_age=None, queue_mode=on)
            ]
        settings = {r.queue: store.get_queue(r.queue) for r in reports}
        history = store.maintenance_history(limit=1)
    for conf in settings.values():
        conf.pop("queue", None)
        conf.pop("paused", None)  # the report's own field, not a setting
    if as_json:
        print_json([{**r.as_dict(), "settings": _plain(settings[r.queue])} for r in reports])
        return
    console = out()
    console.print(f"[dim]{escape(database_line(url))}[/]")
    if not reports:
        console.print("[dim]no queues yet: submit a task with `conveyor submit NAME`[/]")
        return
    for report in reports:
        console.print(_stats_table(report, settings[report.queue]))
    if history:
        last = history[0]
        console.print(
            f"[dim]last maintenance {when(last['ran_at'])}: recovered {last['recovered']}, "
            f"expired {last['expired']}, evicted {last['evicted']}, "
            f"deleted {last['deleted']}[/]"
        )


queue_cli = typer.Typer(
    help="Per-queue settings: defaults for submit and claim, eviction, retention and flow control.",
    no_args_is_help=True,
)
cli.add_typer(queue_cli, name="queue")
# The same commands under the plural, as `conveyor queues pause` reads naturally.
cli.add_typer(queue_cli, name="queues", hidden=True)


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
    delay: Annotated[
        float | None,
        typer.Option(
            "--delay",
            help="Default delay, seconds, of submits that give no delay or run_at.",
            show_default=False,
        ),
    ] = None,
    dead_letter: Annotated[
        str | None,
        typer.Option(
            "--dead-letter",
            metavar="QUEUE",
            help="Send tasks that fail for good or are evicted to QUEUE ('' clears).",
            show_default=False,
        ),
    ] = None,
    encrypt: Annotated[
        bool | None,
        typer.Option(
            "--encrypt/--no-encrypt",
            help="Store the queue's payloads, metadata, results, errors and progress "
            "messages encrypted (AES-256-GCM; keys from $CONVEYOR_ENCRYPTION_KEYS).",
            show_default=False,
        ),
    ] = None,
    debounce: Annotated[
        float | None,
        typer.Option(
            "--debounce",
            metavar="SECONDS",
            help="Quiet period: a partition is claimable once its newest task is this "
            "old (0 clears).",
            show_default=False,
        ),
    ] = None,
    max_depth: Annotated[
        int | None,
        typer.Option(
            "--max-depth",
            metavar="N",
            help="Refuse submits beyond N queued tasks (QueueFull; 0 clears).",
            show_default=False,
        ),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency",
            metavar="N",
            help="Flow control: at most N of the queue's tasks running at once, per "
            "consumer group (0 clears).",
            show_default=False,
        ),
    ] = None,
    key_concurrency: Annotated[
        int | None,
        typer.Option(
            "--key-concurrency",
            metavar="N",
            help="At most N running at once per concurrency key (0 clears).",
            show_default=False,
        ),
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option(
            "--rate",
            metavar="LIMIT/PER",
            help="At most LIMIT starts per PER, per consumer group: 100/1s, 100/s, "
            "5/60 (seconds), 5/1m, 1000/1h, 10/500ms (0 clears).",
            show_default=False,
        ),
    ] = None,
    key_rate: Annotated[
        str | None,
        typer.Option(
            "--key-rate",
            metavar="LIMIT/PER",
            help="At most LIMIT starts per PER per concurrency key, as --rate (0 clears).",
            show_default=False,
        ),
    ] = None,
    fair: Annotated[
        bool | None,
        typer.Option(
            "--fair/--no-fair",
            help="Claims take tasks round-robin across concurrency keys.",
            show_default=False,
        ),
    ] = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Store settings for QUEUE; options not given keep their value."""
    parsed_backoff: Any = None
    if backoff is not None:
        parsed_backoff = parse_json("--backoff", backoff)
    parsed_rate, parsed_key_rate = parse_rate("--rate", rate), parse_rate("--key-rate", key_rate)
    with open_store(url) as store:
        settings = store.configure_queue(
            queue,
            lease=lease,
            max_attempts=max_attempts,
            backoff=parsed_backoff,
            retention=retention,
            max_wait=max_wait,
            queue_mode=queue_mode,
            dead_letter=dead_letter,
            delay=delay,
            max_depth=max_depth,
            debounce=debounce,
            encrypt=encrypt,
            concurrency=concurrency,
            key_concurrency=key_concurrency,
            rate=parsed_rate,
            key_rate=parsed_key_rate,
            fair=fair,
        )
    _show_settings(settings, as_json)


#: ``--rate``'s LIMIT/PER: a whole LIMIT; PER a number of seconds, or a number
#: (1 if left out) with a unit.
_RATE = re.compile(r"(\d+)/(\d+(?:\.\d*)?|\.\d+)?(ms|s|m|min|h|d)?")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_rate(option: str, text: str | None) -> Rate | int | None:
    """``--rate`` / ``--key-rate``: ``LIMIT/PER`` (``100/1s``, ``100/s``, ``5/60``
    in seconds, ``5/1m``, ``1000/1h``, ``10/500ms``) as a :class:`~conveyor.Rate`,
    ``0`` (clear the setting) as 0, not given as ``None``."""
    if text is None:
        return None
    given = text.strip()
    if given == "0":
        return 0
    hint = (
        f"give {option} LIMIT/PER: a whole number of starts per a number of seconds or "
        f"a duration with a unit (ms, s, m, h, d), e.g. {option} 100/1s, 100/s, 5/60, "
        f"1000/1h; {option} 0 clears it"
    )
    match = _RATE.fullmatch(given)
    if match is None or (match.group(2) is None and match.group(3) is None):
        raise CliError(EXIT_USAGE, f"{option}: {text!r} is not a rate LIMIT/PER", hint)
    amount = 1.0 if match.group(2) is None else float(match.group(2))
    per = amount * _UNITS[match.group(3) or "s"]
    try:
        return Rate(int(match.group(1)), per=per)
    except InvalidArgument as exc:
        raise CliError(EXIT_USAGE, f"{option}: {text!r}: {exc.problem}", hint) from None


def _plain(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` as JSON can hold them: a :class:`~conveyor.Rate` as
    ``{"limit": ..., "per": seconds}``."""
    return {
        name: {"limit": value.limit, "per": value.per} if isinstance(value, Rate) else value
        for name, value in settings.items()
    }


@queue_cli.command("show")
def queue_show(
    queue: Annotated[str, typer.Argument(metavar="QUEUE", help="The queue.")],
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show the stored settings of QUEUE."""
    with open_store(url, create=False) as store:
        settings = store.get_queue(queue)
    _show_settings(settings, as_json)


PauseGroup = Annotated[
    str | None,
    typer.Option(
        "--group", "-g", help="Only this consumer group's claims (default: the whole queue)."
    ),
]


@queue_cli.command("pause")
def queue_pause(
    queue: Annotated[str, typer.Argument(metavar="QUEUE", help="The queue.")],
    group: PauseGroup = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Pause QUEUE (or one --group of it): submits go on, claims lease nothing,
    running tasks finish; workers keep running and pick up at resume."""
    with open_store(url) as store:
        changed = store.pause(queue, group=group)
    _paused_line(queue, group, changed, paused=True, as_json=as_json)


@queue_cli.command("resume")
def queue_resume(
    queue: Annotated[str, typer.Argument(metavar="QUEUE", help="The queue.")],
    group: PauseGroup = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Resume QUEUE (or one --group of it) after `conveyor queue pause`; idle
    workers are woken at once."""
    with open_store(url) as store:
        changed = store.resume(queue, group=group)
    _paused_line(queue, group, changed, paused=False, as_json=as_json)


def _paused_line(
    queue: str, group: str | None, changed: bool, *, paused: bool, as_json: bool
) -> None:
    if as_json:
        print_json({"queue": queue, "group": group, "paused": paused, "changed": changed})
        return
    what = f"queue [bold]{escape(queue)}[/]" + (
        "" if group is None else f" for group [bold]{escape(group)}[/]"
    )
    state = "paused" if paused else "resumed"
    if changed:
        out().print(f"{what}: {state}")
    else:
        out().print(f"{what}: {'already paused' if paused else 'was not paused'}")


#: Flow control's settings, shown as "none" rather than "default" when unset.
_LIMITS = ("concurrency", "key_concurrency", "rate", "key_rate")


def _show_settings(settings: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(_plain(settings))
        return
    table = Table(
        box=box.SIMPLE_HEAD,
        title=f"queue [bold]{escape(settings['queue'])}[/]",
        title_justify="left",
    )
    table.add_column("setting")
    table.add_column("value")
    for name, value in settings.items():
        if name in ("dead_letter", "max_depth"):
            table.add_row(name, "none" if value is None else escape(str(value)))
        elif name in _LIMITS:
            table.add_row(name, "none" if value is None else _setting(value))
        elif name != "queue":
            table.add_row(name, "default" if value is None else _setting(value))
    out().print(table)


@cli.command()
def rekey(
    queue: Annotated[
        str | None, typer.Option("--queue", "-q", help="Only this queue.", show_default=False)
    ] = None,
    batch: Annotated[int, typer.Option("--batch", help="Tasks per transaction.")] = 500,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Seal again under the current key every task sealed under an older one, and
    every task of an encrypted queue stored before it was encrypted. Keys from
    $CONVEYOR_ENCRYPTION_KEYS (id=base64key,..., the first one current). In
    batches, each its own transaction: an interrupted run is resumed by running it
    again."""
    watched = not as_json and sys.stderr.isatty()
    with open_store(url) as store:
        total = store.internal.count_rekey(queue) if watched else 0
        if total > PROGRESS_FROM:
            done = _rekey_with_progress(store, queue, batch, total)
        else:
            done = store.rekey(queue, batch=batch)
        current = store.encryption.current if store.encryption is not None else None
    if as_json:
        print_json({"rekeyed": done, "current": current})
        return
    where = f" of queue {escape(queue)}" if queue is not None else ""
    out().print(f"rekeyed {done} task{'s' if done != 1 else ''}{where} to key {current}")


#: A rekey of more tasks than this shows a progress bar (on a terminal).
PROGRESS_FROM = 500


def _rekey_with_progress(store: Any, queue: str | None, batch: int, total: int) -> int:
    """The rekey with a progress bar on stderr, advanced after each batch."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=err(), transient=True) as progress:
        bar = progress.add_task(f"rekey {queue or 'all queues'}", total=total)
        done: int = store.rekey(queue, batch=batch, on_batch=lambda n: progress.advance(bar, n))
    return done


@cli.command()
def maintain(url: UrlOption = None, as_json: JsonOption = False) -> None:
    """Run one maintenance pass: lease recovery, eviction, retention."""
    with open_store(url) as store:
        counts = store.maintain()
    if as_json:
        print_json(counts)
        return
    if counts.get("skipped"):
        out().print("[dim]another process is running maintenance right now: skipped[/]")
        return
    out().print(
        f"recovered {counts['recovered']}, expired {counts['expired']}, "
        f"evicted {counts['evicted']}, deleted {counts['deleted']}"
    )


def _stats_table(report: QueueStats, settings: dict[str, Any]) -> Table:
    # A queue consumed by groups only has no queue-mode row: nobody claims its
    # queue-mode state, so its "backlog" would never drain.
    only = "" if report.queue_mode else " [dim](groups only: no queue mode)[/]"
    if report.paused:
        only += " [bold yellow]paused[/] [dim](claims lease nothing: conveyor queue resume)[/]"
    table = Table(
        title=f"queue [bold]{escape(report.queue)}[/]{only}",
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
            age(oldest),
        )

    base = report.counts
    if report.queue_mode:
        row(
            "queue mode",
            base,
            base.get("queued", 0) + base.get("running", 0),
            report.oldest_claimable_age,
        )
    for name, group in sorted(report.groups.items()):
        label = f"group {escape(name)}" + (
            " [yellow](paused)[/]" if group.paused and not report.paused else ""
        )
        row(label, group.counts, group.lag, group.oldest_claimable_age)
    # encrypt and fair are shown only where on (every other queue would say "no").
    shown = [
        f"{k}={_setting(v)}"
        for k, v in settings.items()
        if v is not None and not (k in ("encrypt", "fair") and v is False)
    ]
    table.caption = "settings: " + (", ".join(shown) if shown else "defaults")
    table.caption_justify = "left"
    return table


def _setting(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Rate):
        return f"{value.limit}/{value.per:g}s"  # what --rate takes
    if isinstance(value, dict):
        return escape(json.dumps(value, separators=(",", ":")))
    if isinstance(value, float) and value.is_integer():
        return f"{int(value)}s"
    if isinstance(value, float):
        return f"{value}s"
    return escape(str(value))
