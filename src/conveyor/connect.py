"""Opening a store from a URL, and the blocking facade over the async store."""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, Concatenate, NamedTuple, ParamSpec, TypeVar

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from conveyor.errors import ConfigurationError
from conveyor.store.api_internal import ScheduleInfo
from conveyor.store.base import TaskStore

DEFAULT_URL = "sqlite:///conveyor.db"
POSTGRES_INSTALL = "pip install 'conveyor[postgres]'"

P = ParamSpec("P")
R = TypeVar("R")


#: The environment variable that names the database.
URL_VARIABLE = "CONVEYOR_URL"


class ChosenUrl(NamedTuple):
    """The database URL a command, a worker or an App uses, and where it came from:
    ``"given"`` (``--url``, a ``url=`` argument), ``"env"`` (``$CONVEYOR_URL``),
    ``"app"`` (the URL given to :class:`~conveyor.App`) or ``"default"``."""

    url: str
    origin: str


def choose_url(given: str | None = None, app: str | None = None) -> ChosenUrl:
    """The one precedence rule every command, worker and App follows: a URL given
    for this very call (``--url``, ``url=``) first, then ``$CONVEYOR_URL``, then
    the App's own URL, then ``sqlite:///conveyor.db``.

    ``$CONVEYOR_URL`` comes before the App's URL so that what the deployment says
    wins over what the code says, and so that the commands that load no App
    (``conveyor submit``, ``list``, ``stats``) and those that do (``worker``,
    ``submit --app``) always reach the same database."""
    if given:
        return ChosenUrl(given, "given")
    env = os.environ.get(URL_VARIABLE)
    if env:
        return ChosenUrl(env, "env")
    if app:
        return ChosenUrl(app, "app")
    return ChosenUrl(DEFAULT_URL, "default")


def display_url(url: str) -> str:
    """``url`` as shown to people: the password masked, the driver left out
    (``sqlite+aiosqlite://`` shows as ``sqlite://``)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return url
    backend = parsed.drivername.partition("+")[0]
    return parsed.set(drivername=backend).render_as_string(hide_password=True)


def resolve_url(url: str | None) -> tuple[str, str]:
    """``(dialect, async SQLAlchemy URL)`` for a user's URL, or ConfigurationError."""
    raw = choose_url(url).url
    try:
        parsed = make_url(raw)
    except ArgumentError:
        raise ConfigurationError(
            f"cannot parse the database URL {raw!r}: use sqlite:///path.db or "
            "postgresql://user@host/db"
        ) from None
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "sqlite" and driver in ("", "aiosqlite"):
        return "sqlite", parsed.set(drivername="sqlite+aiosqlite").render_as_string(False)
    if backend in ("postgresql", "postgres") and driver in ("", "psycopg", "psycopg_async"):
        try:
            import psycopg  # noqa: F401  (only to learn whether the extra is installed)
        except ImportError:
            raise ConfigurationError(
                f"PostgreSQL needs the psycopg driver: run `{POSTGRES_INSTALL}`"
            ) from None
        return "postgresql", parsed.set(drivername="postgresql+psycopg").render_as_string(False)
    raise ConfigurationError(
        f"unsupported database URL scheme {parsed.drivername!r}: use sqlite:// "
        "(or sqlite+aiosqlite://) or postgresql:// (or postgresql+psycopg://)"
    )


def connect(url: str | None = None, **options: Any) -> TaskStore:
    """A store for ``url`` (default ``$CONVEYOR_URL``, else ``sqlite:///conveyor.db``).

    No I/O happens here; ``async with store`` (or the first call) opens it.
    Options: ``migrate`` (default True), ``statement_timeout``, ``lock_timeout``,
    ``poll_interval``, ``engine_options``, ``max_payload_size`` and
    ``max_result_size`` (bytes of JSON, default 1 MiB, ``None`` for no limit);
    SQLite also ``busy_timeout`` and ``synchronous``; Postgres also ``listen`` and
    ``timeouts`` (``"connection"``, the default: the timeouts are set once per
    connection; ``"transaction"``: in every transaction, for a transaction-mode
    pooler such as PgBouncer) and ``durable_claims`` (default False: a claim's
    commit does not wait for the WAL flush, so a server crash may forget a lease
    and the task runs again; True waits, like every other write) and
    ``direct_connections`` (default 10: the most connections, beyond the pool,
    kept in autocommit for statements that run by themselves; two stay open, the
    others only while that many such statements run at once). ``gc_freeze``
    (default False): True makes the store's first open collect garbage once and
    freeze what is alive (``gc.freeze()``, once per process), as a worker's start
    does, so the collector's full passes stop walking every module loaded; a
    producer that submits much may want it, the default leaves the collector alone.
    """
    dialect, async_url = resolve_url(url)
    if dialect == "sqlite":
        from conveyor.store.sqlite import SQLiteStore

        return SQLiteStore(async_url, **options)
    from conveyor.store.postgres import PostgresStore

    return PostgresStore(async_url, **options)


def _blocking(
    method: Callable[Concatenate[TaskStore, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[SyncStore, P], R]:
    """The blocking twin of an async store method: same signature, same docstring."""

    @functools.wraps(method)
    def call(self: SyncStore, /, *args: P.args, **kwargs: P.kwargs) -> R:
        if kwargs.get("connection") is not None:
            joined: R = self._in_callers_transaction(method.__name__, args, kwargs)
            return joined
        bound: Callable[P, Coroutine[Any, Any, R]] = getattr(self.store, method.__name__)
        return self._call(bound(*args, **kwargs))

    return call


class SyncInternal:
    """The blocking twin of the store's internal methods that conveyor's CLI
    calls (see :class:`conveyor.store.api_internal.Internal`); not covered by
    semver."""

    def __init__(self, store: TaskStore, call: Callable[[Coroutine[Any, Any, Any]], Any]) -> None:
        self._store = store
        self._call = call

    def schedules(self) -> list[ScheduleInfo]:
        """Internal, for ``conveyor schedules``; not covered by semver. Every
        registered periodic schedule, by name."""
        found: list[ScheduleInfo] = self._call(self._store.internal.schedules())
        return found


class SyncStore:
    """The same API as :class:`TaskStore`, blocking.

    The async store runs on a private event loop in a background thread; each
    call is handed to it and waited for. There is one implementation of the
    protocol — this class only carries calls across.
    """

    def __init__(self, store: TaskStore) -> None:
        self.store = store
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        #: The blocking twin of ``store.internal`` (conveyor's CLI; not covered by semver).
        self.internal = SyncInternal(store, self._call)

    def _call(self, coro: Coroutine[Any, Any, R]) -> R:
        loop = self._ensure_loop()
        future: Future[R] = asyncio.run_coroutine_threadsafe(coro, loop)
        return future.result()

    def _in_callers_transaction(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """``submit``/``submit_many`` with ``connection=``: a blocking Connection or
        Session is used in the caller's thread, where it belongs; the store's one
        submit path runs on it without ever waiting on the store's loop."""
        from conveyor.store.protocol import caller_conn

        sync = caller_conn.sync_connection_of(kwargs["connection"])
        if sync is None:
            raise ConfigurationError(
                "connection: the sync store takes a SQLAlchemy Connection or Session "
                f"(got {type(kwargs['connection']).__name__}); pass an AsyncConnection or "
                "AsyncSession to the async store"
            )
        loop = self._ensure_loop()
        self._call(caller_conn.store_identity(self.store))  # opens the store on its loop
        joined = {**kwargs, "connection": caller_conn.SyncConnection(sync, loop)}
        return caller_conn.run_inline(getattr(self.store, method)(*args, **joined))

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="conveyor-sync", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def open(self) -> None:
        """Connect and migrate (done for you by ``with`` or the first call)."""
        self._call(self.store.open())

    def close(self) -> None:
        """Close the store and stop the background loop."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self.store.close(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()

    def __enter__(self) -> SyncStore:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    submit = _blocking(TaskStore.submit)
    submit_many = _blocking(TaskStore.submit_many)
    get = _blocking(TaskStore.get)
    get_by_key = _blocking(TaskStore.get_by_key)
    list = _blocking(TaskStore.list)
    cancel = _blocking(TaskStore.cancel)
    cancel_by_key = _blocking(TaskStore.cancel_by_key)
    retry = _blocking(TaskStore.retry)
    retry_by_key = _blocking(TaskStore.retry_by_key)
    wait = _blocking(TaskStore.wait)
    claim = _blocking(TaskStore.claim)
    heartbeat = _blocking(TaskStore.heartbeat)
    progress = _blocking(TaskStore.progress)
    succeed = _blocking(TaskStore.succeed)
    succeed_many = _blocking(TaskStore.succeed_many)
    ack_many = _blocking(TaskStore.ack_many)
    fail = _blocking(TaskStore.fail)
    release = _blocking(TaskStore.release)
    snooze = _blocking(TaskStore.snooze)
    subscribe = _blocking(TaskStore.subscribe)
    unsubscribe = _blocking(TaskStore.unsubscribe)
    groups = _blocking(TaskStore.groups)
    stats = _blocking(TaskStore.stats)
    configure_queue = _blocking(TaskStore.configure_queue)
    get_queue = _blocking(TaskStore.get_queue)
    recover = _blocking(TaskStore.recover)
    maintain = _blocking(TaskStore.maintain)
    maintenance_history = _blocking(TaskStore.maintenance_history)
    workers = _blocking(TaskStore.workers)
    deliveries = _blocking(TaskStore.deliveries)
    children = _blocking(TaskStore.children)
    queue_settings = _blocking(TaskStore.queue_settings)
    streams = _blocking(TaskStore.streams)
    throughput = _blocking(TaskStore.throughput)
    finished_totals = _blocking(TaskStore.finished_totals)


def connect_sync(url: str | None = None, **options: Any) -> SyncStore:
    """A blocking store for ``url``; same options as :func:`connect`."""
    return SyncStore(connect(url, **options))
