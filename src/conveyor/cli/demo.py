"""The ``demo`` command (the tour itself is :mod:`conveyor.demo`)."""

# Annotations are objects here, not strings (no `from __future__ import annotations`):
# typer reads every command's, and would compile and evaluate each string, twice,
# on every command line (some 20 ms).

from typing import Annotated

import typer

from conveyor.cli._common import (
    cli,
    out,
)


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
    ] = 120,
    keep: Annotated[
        bool,
        typer.Option("--keep/--no-keep", help="Keep the temporary database and print its URL."),
    ] = False,
) -> None:
    """A tour: a queue, a partitioned stream and two consumer groups, with workers."""
    from conveyor import demo as tour

    code = tour.run(url=url, tasks=tasks, keep=keep, console=out())
    if code:
        raise typer.Exit(code)
