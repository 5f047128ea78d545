"""The conveyor dashboard: an ASGI app showing queues, groups, partitions, tasks and
workers, with Prometheus metrics at ``/metrics``.

Needs the ``web`` extra (``pip install 'conveyor[web]'``). Mount it in your own
ASGI app, or run it with ``conveyor dashboard``::

    from starlette.applications import Starlette
    from starlette.routing import Mount
    import conveyor
    from conveyor.web import dashboard

    store = conveyor.connect("sqlite:///conveyor.db")
    app = Starlette(routes=[Mount("/conveyor", dashboard(store))])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from conveyor.errors import ConfigurationError

if TYPE_CHECKING:
    from conveyor.store.base import TaskStore

WEB_INSTALL = "pip install 'conveyor[web]'"


def dashboard(
    store: TaskStore,
    *,
    allow_actions: bool = False,
    auth: str | None = None,
    token: str | None = None,
    refresh: float = 5.0,
) -> Any:
    """The dashboard for ``store`` as an ASGI application.

    Read-only unless ``allow_actions=True`` (cancel, retry, subscribe,
    unsubscribe, and retry, cancel or purge every task of the task list's
    filter). ``auth="user:password"`` requires HTTP basic credentials,
    ``token=...`` a bearer token (or ``?token=`` once, remembered in a cookie);
    with neither, anyone who can reach it can read it. The live parts of each
    page refresh every ``refresh`` seconds. The store is opened on first use.
    """
    from conveyor.store.base import TaskStore

    if not isinstance(store, TaskStore):
        inner = getattr(store, "store", None)
        hint = (
            " (this is a blocking store: pass conveyor.connect(url), not connect_sync)"
            if isinstance(inner, TaskStore)
            else ""
        )
        raise ConfigurationError(f"dashboard() needs a conveyor store, got {store!r}{hint}")
    if not refresh > 0:
        raise ConfigurationError(f"refresh must be a positive number of seconds, got {refresh!r}")
    try:
        from conveyor.web.app import build
        from conveyor.web.auth import Credentials, RequireCredentials
    except ImportError as exc:
        raise ConfigurationError(
            f"the dashboard needs the web extra ({exc.name} is missing): run `{WEB_INSTALL}`"
        ) from None
    app: Any = build(store, allow_actions=allow_actions, refresh=refresh)
    credentials = Credentials.parse(auth, token)
    if credentials is not None:
        app = RequireCredentials(app, credentials)
    return app


__all__ = ["dashboard"]
