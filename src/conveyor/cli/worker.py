"""The ``worker`` command: load the user's App and run it."""

# Annotations are objects here, not strings (no `from __future__ import annotations`):
# typer reads every command's, and would compile and evaluate each string, twice,
# on every command line (some 20 ms).

import importlib
import os
import sys
import traceback
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from conveyor.cli._common import (
    EXIT_USAGE,
    CliError,
    GroupOption,
    cli,
)
from conveyor.errors import ConveyorError, NotFound
from conveyor.worker.logs import FORMATS, LEVELS, setup_logging
from conveyor.worker.unknown import POLICIES, policy

if TYPE_CHECKING:
    from conveyor.app import App
    from conveyor.worker.startup import Start


@cli.command()
def worker(
    app_path: Annotated[
        str, typer.Argument(metavar="MODULE:APP", help="Where the App is, e.g. myapp.tasks:app.")
    ],
    queues: Annotated[
        str, typer.Option("--queues", "-q", help="Comma-separated queues to consume.")
    ] = "default",
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", min=1, help="Tasks run at once, per process.")
    ] = 10,
    processes: Annotated[
        int,
        typer.Option(
            "--processes",
            min=1,
            help="Worker processes under one supervisor (a dead one is restarted).",
        ),
    ] = 1,
    group: GroupOption = None,
    subscribe: Annotated[
        str | None,
        typer.Option(
            "--subscribe",
            metavar="all|new|TIME",
            help="With --group: subscribe the group first if it is not registered, "
            "from 'all' (the retained history too), 'new' (tasks submitted from now on) "
            "or an ISO 8601 time with a time zone. Without it the group must be "
            "subscribed already.",
            show_default=False,
        ),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            help="Database URL (default: $CONVEYOR_URL, else the App's URL, else "
            "sqlite:///conveyor.db).",
            show_default=False,
        ),
    ] = None,
    unknown: Annotated[
        str,
        typer.Option(
            "--unknown",
            metavar="release|fail",
            help="A claimed task whose name the app has no handler for: release hands it "
            "back (no attempt spent, claimable again after a growing delay, for a worker "
            "that knows it); fail fails it for good.",
        ),
    ] = "release",
    grace: Annotated[
        float,
        typer.Option(
            "--grace",
            min=0,
            metavar="SECONDS",
            help="On SIGTERM/SIGINT, how long running tasks may take to finish before "
            "they are handed back.",
        ),
    ] = 30.0,
    lease: Annotated[
        float | None,
        typer.Option(
            "--lease",
            min=0.1,
            metavar="SECONDS",
            help="Lease per claim (default: the queue's setting, else 30 s); "
            "heartbeats renew it every third.",
            show_default=False,
        ),
    ] = None,
    poll_interval: Annotated[
        float,
        typer.Option(
            "--poll-interval",
            min=0.01,
            metavar="SECONDS",
            help="Longest sleep when idle; new work wakes the worker sooner.",
        ),
    ] = 1.0,
    wait_for_db: Annotated[
        float,
        typer.Option(
            "--wait-for-db",
            min=0,
            metavar="SECONDS",
            help="At start, how long to keep trying a database that does not answer "
            "(with backoff, logging each wait) before exiting with code 4.",
        ),
    ] = 60.0,
    log_level: Annotated[
        str, typer.Option("--log-level", help="conveyor's log level: " + ", ".join(LEVELS) + ".")
    ] = "info",
    log_format: Annotated[
        str, typer.Option("--log-format", help="text, or json (one object per line).")
    ] = "text",
    library_log_level: Annotated[
        str,
        typer.Option(
            "--library-log-level", help="Log level of other libraries (SQLAlchemy, drivers)."
        ),
    ] = "warning",
    metrics_port: Annotated[
        str | None,
        typer.Option(
            "--metrics-port",
            metavar="[HOST:]PORT",
            help="Serve Prometheus metrics here (all interfaces unless HOST; with "
            "--processes, process i uses PORT+i).",
        ),
    ] = None,
    supervised_by: Annotated[int | None, typer.Option("--supervised-by", hidden=True)] = None,
) -> None:
    """Run a worker for an App until SIGINT/SIGTERM, then exit 0."""
    # Imported here, not above: every other command line imports this module too.
    from conveyor.worker.signals import PROCESS
    from conveyor.worker.supervisor import Supervisor, watch_parent

    # From here on a signal is a stop request, even while the application is
    # still being imported: the worker (or supervisor) gets it once it exists.
    signals = PROCESS.install()
    for option, value, allowed in (
        ("--unknown", unknown, POLICIES),
        ("--log-level", log_level, LEVELS),
        ("--library-log-level", library_log_level, LEVELS),
        ("--log-format", log_format, FORMATS),
    ):
        if value.lower() not in allowed:
            raise CliError(
                EXIT_USAGE, f"unknown {option} {value!r}", f"use one of {', '.join(allowed)}"
            )
    setup_logging(log_level.lower(), log_format.lower(), library_level=library_log_level.lower())
    names = [q.strip() for q in queues.split(",")]
    if not names or any(not q for q in names):
        raise CliError(
            EXIT_USAGE,
            f"--queues {queues!r} has an empty queue name",
            "give comma-separated names, e.g. --queues emails,default",
        )
    start = subscribe_start(subscribe, group)
    application = load_user_app(app_path)
    if metrics_port is not None:
        metrics_address(metrics_port, 0)  # a bad address fails here, not in each child
    if processes > 1:
        # The app was loaded above only to fail fast, in one place, on a broken app.

        def child_command(index: int) -> list[str]:
            """The argv of child ``index``: this command, one process, supervised."""
            argv = [sys.executable, "-m", "conveyor.cli", "worker", app_path, "--queues", queues]
            argv += ["--concurrency", str(concurrency), "--grace", str(grace)]
            argv += ["--poll-interval", str(poll_interval), "--log-level", log_level]
            argv += ["--wait-for-db", str(wait_for_db), "--unknown", unknown]
            argv += ["--log-format", log_format, "--library-log-level", library_log_level]
            argv += ["--supervised-by", str(os.getpid())]
            given_options = (
                ("--group", group),
                ("--subscribe", subscribe),
                ("--url", url),
                ("--lease", lease),
            )
            for option, given in given_options:
                if given is not None:
                    argv += [option, str(given)]
            if metrics_port is not None:
                argv += ["--metrics-port", metrics_address(metrics_port, index)]
            return argv

        supervisor = Supervisor(child_command, processes)
        signals.forward(supervisor.stop)
        raise typer.Exit(supervisor.run())
    if supervised_by is not None:
        watch_parent(supervised_by)
    if metrics_port is not None:
        serve_metrics(metrics_port, application.database(url).url)
    try:
        application.run_worker(
            queues=names,
            concurrency=concurrency,
            group=group,
            subscribe=start,
            url=url,
            grace=grace,
            lease=lease,
            poll_interval=poll_interval,
            wait_for_db=wait_for_db,
            unknown=policy(unknown.lower()),
        )
    except NotFound as exc:
        # Only the group check raises it: a misspelt --group, or a group not
        # subscribed yet. Restarting would fail the same way: a usage error.
        raise CliError(
            EXIT_USAGE,
            str(exc),
            f"check --group {group} for a typo; to create a group never registered, start "
            "the worker with --subscribe new (tasks submitted from now on) or --subscribe "
            "all (the retained history too)",
        ) from None


def subscribe_start(subscribe: str | None, group: str | None) -> "Start | None":
    """``--subscribe`` as the worker's ``subscribe``: "all", "new" or an aware time."""
    if subscribe is None:
        return None
    if group is None:
        raise CliError(
            EXIT_USAGE,
            "--subscribe needs --group",
            "name the consumer group to subscribe, e.g. --group billing --subscribe new",
        )
    if subscribe in ("all", "new"):
        return subscribe  # type: ignore[return-value]
    try:
        moment = datetime.fromisoformat(subscribe)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise CliError(
            EXIT_USAGE,
            f"--subscribe {subscribe!r} is not all, new or an ISO 8601 time with a time zone",
            "e.g. --subscribe new, --subscribe all or --subscribe 2026-11-01T00:00:00+00:00",
        )
    return moment


def metrics_address(address: str, offset: int) -> str:
    """``--metrics-port`` for worker process ``offset`` of a supervised set: PORT+offset."""
    from conveyor import metrics
    from conveyor.errors import ConfigurationError

    try:
        host, port = metrics.parse_address(address)
    except ConfigurationError as exc:
        raise CliError(EXIT_USAGE, str(exc)) from None
    return f"[{host}]:{port + offset}"


def serve_metrics(address: str, url: str | None) -> None:
    """Start the worker's metrics endpoint (``--metrics-port``) for this process."""
    from conveyor import metrics
    from conveyor.errors import ConfigurationError

    try:
        metrics.serve_worker_metrics(address, url)
    except ConfigurationError as exc:
        raise CliError(EXIT_USAGE, str(exc)) from None


def load_user_app(app_path: str) -> "App":
    """The App at ``MODULE:APP``, imported from the current directory too; a
    :class:`CliError` with the user's own traceback when their module fails."""
    from conveyor.app import load_app

    if ":" not in app_path:
        raise CliError(
            EXIT_USAGE,
            f"{app_path!r} is not MODULE:APP",
            "name the module and the App in it, e.g. conveyor worker myapp.tasks:app",
        )
    # Like `python -m`, let the app live in the current directory.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return load_app(app_path)
    except Exception as exc:
        raise CliError(
            EXIT_USAGE,
            f"cannot load {app_path!r}: {_describe(exc)}",
            "check that MODULE is importable from the current directory and APP names "
            "a conveyor.App in it",
            detail=_user_traceback(exc),
        ) from None


def _user_traceback(exc: BaseException) -> str | None:
    """The traceback of ``exc`` trimmed to the user's frames (no importlib, no
    conveyor); None when there are none (the module itself was not found)."""
    if isinstance(exc, ConveyorError):
        return None
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _ours(f.filename)]
    if not frames and not isinstance(exc, SyntaxError):
        return None
    lines = ["Traceback (most recent call last; your code only):\n"]
    lines += traceback.format_list(frames)
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines).rstrip()


#: Frames that are not the user's: conveyor's own and the import machinery's.
_NOT_THEIRS = ("<", str(Path(__file__).parent.parent), str(Path(importlib.__file__).parent))


def _ours(filename: str) -> bool:
    return filename.startswith(_NOT_THEIRS)


def _describe(exc: BaseException) -> str:
    """``Type: message (at file:line)`` for an exception raised while loading user code."""
    if isinstance(exc, ConveyorError):
        return " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {exc}"
    # Point at the user's line, not at importlib's or conveyor's.
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _ours(f.filename)]
    # An ImportError names the module and a SyntaxError its file and line already.
    if frames and not isinstance(exc, ImportError | SyntaxError):
        text += f" (at {frames[-1].filename}:{frames[-1].lineno})"
    return " ".join(text.split())
