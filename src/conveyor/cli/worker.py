"""The ``worker`` command: load the user's App and run it."""

from __future__ import annotations

import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Annotated

import typer

from conveyor.cli._common import (
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CliError,
    GroupOption,
    cli,
)
from conveyor.errors import (
    ConveyorError,
)


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
    group: GroupOption = None,
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
    package = str(Path(__file__).parent.parent)
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
