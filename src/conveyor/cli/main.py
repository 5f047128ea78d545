"""The entry point: ``--version``, running the typer app, and turning every error
into one line on stderr and an exit code."""

# Annotations are objects here, not strings (no `from __future__ import annotations`):
# typer reads every command's, and would compile and evaluate each string, twice,
# on every command line (some 20 ms).

import gc
import os
import re
import sys
from collections.abc import Sequence
from typing import Annotated, Any, NoReturn

import typer
from rich.markup import escape

import conveyor
from conveyor.cli._coercion import check_plain_value_directly
from conveyor.cli._common import (
    EXIT_CONFLICT,
    EXIT_INTERRUPTED,
    EXIT_NO_SCHEMA,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_PROTOCOL,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CliError,
    cli,
    err,
    is_database_error,
    shown_url,
    url_origin,
)
from conveyor.connect import resolve_url
from conveyor.errors import (
    AlreadyExists,
    ConfigurationError,
    ConveyorError,
    InvalidArgument,
    MigrationRequired,
    NotFound,
    ProtocolVersionMismatch,
    QueueFull,
    StoreUnavailable,
)


def _print_version(value: bool) -> None:
    # An eager option's callback runs while the command line is parsed, before
    # click looks for a command: `conveyor --version` needs none.
    if value:
        typer.echo(f"conveyor {conveyor.__version__}")
        raise typer.Exit(EXIT_OK)


@cli.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print the version and exit.",
            is_eager=True,
            expose_value=False,
            callback=_print_version,
        ),
    ] = False,
) -> None:
    """conveyor: a durable task queue and message bus on SQLite and PostgreSQL."""


def _prepare_params(command: Any, parent: Any = None) -> None:
    """Show flags as flags in ``--help``: no ``<bool>`` type column for options
    that take no value (typer lists one for every option); and check string and
    flag values without Pydantic (:mod:`conveyor.cli._coercion`)."""
    # The context (a child of its parent's, as when parsing) makes the help
    # option with the inherited names (-h, --help); it is cached on the command.
    ctx = command.context_class(
        command, parent=parent, info_name=command.name, **command.context_settings
    )
    for param in [*command.params, command.get_help_option(ctx)]:
        if param is None:
            continue
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
        check_plain_value_directly(param)
    for sub in getattr(command, "commands", {}).values():
        _prepare_params(sub, ctx)


# ---------------------------------------------------------------- entry point
def _classify(exc: BaseException, command: str, url: str | None) -> tuple[int, str, str | None]:
    """Exit code, message and hint for an error that ends ``command`` (``url``: the
    one given with --url, if any)."""
    message = " ".join(str(exc).split())
    if isinstance(exc, CliError):
        return exc.exit_code, " ".join(exc.message.split()), exc.hint
    if isinstance(exc, NotFound):
        # A NotFound that says what to do next needs no hint about task ids.
        hint = None if exc.hint else "`conveyor list` shows the ids of existing tasks"
        return EXIT_NOT_FOUND, message, hint
    if isinstance(exc, InvalidArgument):
        return EXIT_USAGE, f"invalid {message}", f"see `conveyor {command} --help`"
    if isinstance(exc, AlreadyExists):
        return (
            EXIT_CONFLICT,
            message,
            "use --conflict reuse to get the existing task, or --conflict replace",
        )
    if isinstance(exc, QueueFull):
        return EXIT_CONFLICT, message, None  # the message says what to do
    if isinstance(exc, ProtocolVersionMismatch):
        return EXIT_PROTOCOL, message, "run a conveyor version that matches the database"
    origin = url_origin(url)
    if isinstance(exc, MigrationRequired):
        return EXIT_NO_SCHEMA, *_needs_migration(exc, url, origin)
    if isinstance(exc, ConfigurationError):
        if any(what in message for what in ("pip install", "conveyor migrate", "ENCRYPTION_KEYS")):
            return EXIT_UNAVAILABLE, message, None  # the message names what to do
        return EXIT_UNAVAILABLE, message, f"fix the database URL (from {origin})"
    if isinstance(exc, StoreUnavailable) or is_database_error(exc):
        # SQLAlchemy's pointer to its error catalogue is noise on a one-line report.
        message = re.sub(r"\s*\(Background on this error at: [^)]*\)", "", message)
        if _is_sqlite(url):
            hint = f"check the file's path and permissions (from {origin})"
        else:
            hint = f"check that the database server is running and the URL is right (from {origin})"
        return EXIT_UNAVAILABLE, message, None if "Check that" in message else hint
    if isinstance(exc, ConveyorError):
        return EXIT_NOT_FOUND, message, None
    return (
        EXIT_NOT_FOUND,
        f"unexpected {type(exc).__name__}: {message}",
        "set CONVEYOR_DEBUG=1 to see the traceback, and please report it",
    )


def _needs_migration(exc: MigrationRequired, url: str | None, origin: str) -> tuple[str, str]:
    """Message and hint for a database this command will not migrate."""
    where = f"{shown_url(url)}, from {origin}"
    run = "`conveyor migrate`" + ("" if url is None else " with the same --url")
    if not exc.current:
        message = f"no conveyor schema here ({where}); run {run}"
    else:
        message = (
            f"the conveyor schema here ({where}) is at revision {', '.join(exc.current)} "
            f"and this conveyor needs {exc.head}; run {run}"
        )
    return message, "this command never creates or migrates conveyor's tables"


def _report(code: int, message: str, hint: str | None) -> int:
    line = f"[bold red]error:[/] {escape(message)}"
    if hint:
        line += f" [dim](hint: {escape(hint)})[/]"
    err().print(line)
    return code


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI on ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    command = typer.main.get_command(cli)
    _prepare_params(command)
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
        expected = isinstance(exc, CliError | ConveyorError) or is_database_error(exc)
        if not expected and os.environ.get("CONVEYOR_DEBUG"):
            raise
        args = sys.argv[1:] if argv is None else list(argv)
        name = next((a for a in args if not a.startswith("-")), "COMMAND")
        if isinstance(exc, CliError) and exc.detail:
            sys.stderr.write(exc.detail + "\n")
        return _report(*_classify(exc, name, _given_url(args)))
    return rv if isinstance(rv, int) else EXIT_OK


def _given_url(args: Sequence[str]) -> str | None:
    """The value of ``--url`` on the command line, if given."""
    for i, arg in enumerate(args):
        if arg == "--url" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--url="):
            return arg.removeprefix("--url=")
    return None


def _is_sqlite(url: str | None) -> bool:
    try:
        return resolve_url(url)[0] == "sqlite"
    except ConveyorError:
        return False


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
    code = run()
    # The process ends here. The interpreter's last act would be a full garbage
    # collection that walks every object alive (SQLAlchemy's modules and all),
    # about 0.13 s after a command that opened a store, to free nothing that
    # matters: the command has closed what it opened. Frozen, they are not walked.
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    main()
