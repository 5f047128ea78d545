"""``conveyor dashboard``: the web dashboard (needs the ``web`` extra)."""

# Annotations are objects here, not strings (no `from __future__ import annotations`):
# typer reads every command's, and would compile and evaluate each string, twice,
# on every command line (some 20 ms).

from typing import Annotated

import typer

from conveyor.cli._common import (
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CliError,
    ReadUrlOption,
    UrlOption,
    check_readable,
    cli,
    database_line,
    err,
)


@cli.command()
def dashboard(
    url: UrlOption = None,
    read_url: ReadUrlOption = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (beyond loopback: needs auth).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port.")] = 8080,
    allow_actions: Annotated[
        bool,
        typer.Option(
            "--allow-actions", help="Enable cancel, retry, subscribe, unsubscribe and bulk actions."
        ),
    ] = False,
    auth: Annotated[
        str | None,
        typer.Option("--auth", metavar="USER:PASSWORD", help="Require HTTP basic auth."),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            "--token", envvar="CONVEYOR_DASHBOARD_TOKEN", help="Require this bearer token."
        ),
    ] = None,
) -> None:
    """Serve the web dashboard (read-only unless --allow-actions) until interrupted."""
    from conveyor.web.auth import is_loopback

    if not is_loopback(host) and auth is None and token is None:
        raise CliError(
            EXIT_USAGE,
            f"refusing to serve the dashboard on {host} without authentication",
            "pass --auth USER:PASSWORD or --token TOKEN, or bind to 127.0.0.1",
        )
    try:
        from conveyor.web.serve import serve
    except ImportError as exc:
        raise CliError(
            EXIT_UNAVAILABLE,
            f"the dashboard needs the web extra ({exc.name} is missing)",
            "run `pip install 'conveyor[web]'`",
        ) from None
    check_readable(url)
    err().print(f"conveyor dashboard on http://{host}:{port}/, {database_line(url)}")
    serve(
        url,
        host=host,
        port=port,
        allow_actions=allow_actions,
        auth=auth,
        token=token,
        read_url=read_url,
    )
