"""The entry point: ``--version``, running the typer app, and turning every error
into one line on stderr and an exit code."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from typing import Annotated, NoReturn

import typer
from rich.markup import escape
from sqlalchemy.exc import SQLAlchemyError

import conveyor
from conveyor.cli._common import (
    EXIT_CONFLICT,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_PROTOCOL,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CliError,
    cli,
    err,
)
from conveyor.errors import (
    AlreadyExists,
    ConfigurationError,
    ConveyorError,
    InvalidArgument,
    NotFound,
    ProtocolVersionMismatch,
    StoreUnavailable,
)


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
    err().print(line)
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
