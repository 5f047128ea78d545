"""``conveyor dashboard``: serve the dashboard with uvicorn."""

from __future__ import annotations

import asyncio
from typing import Any

from conveyor.errors import ConfigurationError
from conveyor.web import WEB_INSTALL, dashboard
from conveyor.web.auth import is_loopback


def check_bind(host: str, auth: str | None, token: str | None) -> None:
    """Refuse to serve beyond this machine without credentials."""
    if not is_loopback(host) and auth is None and token is None:
        raise ConfigurationError(
            f"refusing to serve the dashboard on {host} without authentication: anyone who "
            "can reach it could read every payload. Pass --auth USER:PASSWORD or --token "
            "TOKEN, or bind to 127.0.0.1"
        )


def serve(
    url: str | None,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    allow_actions: bool = False,
    auth: str | None = None,
    token: str | None = None,
    refresh: float = 5.0,
    log_level: str = "info",
    read_url: str | None = None,
) -> None:
    """Open the store at ``url`` and serve its dashboard until interrupted
    (``read_url``: a replica its pages read from, else ``$CONVEYOR_READ_URL``)."""
    check_bind(host, auth, token)
    try:
        import uvicorn
    except ImportError:
        raise ConfigurationError(
            f"the dashboard needs the web extra (uvicorn is missing): run `{WEB_INSTALL}`"
        ) from None
    import conveyor
    from conveyor.connect import resolve_url

    # The dashboard reads (and, with actions, cancels and retries): it never creates
    # or migrates conveyor's schema; a database without it fails at open.
    options: dict[str, Any] = {"migrate": False}
    if read_url is not None:
        options["read_url"] = read_url
    if resolve_url(url)[0] == "postgresql":
        options["listen"] = False  # the dashboard polls; it needs no wake-up channel
    store = conveyor.connect(url, **options)
    app = dashboard(store, allow_actions=allow_actions, auth=auth, token=token, refresh=refresh)
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, lifespan="off", server_header=False
    )
    server = uvicorn.Server(config)

    async def main() -> None:
        await store.open()  # a wrong URL fails here, before the port opens
        try:
            await server.serve()
        finally:
            await store.close()

    asyncio.run(main())
