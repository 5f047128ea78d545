"""The SQLite store of a short-lived process (a command line): the same store,
without its connection thread and without an async engine.

A command opens the store, makes a call or two and exits. What the store's
transport costs such a process is most of its run: SQLAlchemy's async layer
and the ORM it imports (about 80 ms of imports, for an engine that on SQLite
is only the store's handle), aiosqlite, and a connection thread to start and
stop. :class:`OneShotSQLiteStore` keeps everything else of
:class:`~conveyor.store.sqlite.SQLiteStore` — every statement, check, retry and
translation of errors is the store's own — and changes only where a
transaction runs: on one blocking connection, on the thread of the event loop
that awaits it (:class:`CallerConnection`), at once, where the connection
thread would have queued it.

What that gives up, and why a command does not miss it: the connection thread's
``data_version`` poll (the wake-up of this process's idle workers and
``wait()`` calls by other processes' commits; a command has none), its timed
WAL checkpoints (SQLite's own, per commit, stay on) and its fair wait for the
write lock (SQLite's busy handler waits instead, up to ``busy_timeout``). Calls
run one at a time, on one thread: the connection is never shared.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, cast

from sqlalchemy.engine import Connection, Engine

from conveyor.store.sqlite.connection import blocking_engine, configure
from conveyor.store.sqlite.store import SQLiteStore

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

T = TypeVar("T")


class CallerConnection:
    """Runs each function at once on one blocking connection, on the calling
    thread: the connection runner of :class:`OneShotSQLiteStore` (the interface of
    :class:`~conveyor.store.sqlite.thread.ConnectionThread` that the store uses)."""

    #: Never: no inline path sends its own BEGIN here (see ConnectionThread.begun).
    begun = False

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        #: The dialect the store's statements are built for.
        self.dialect = engine.dialect
        self._conn: Connection | None = None
        self._closed = False

    async def call(self, fn: Callable[[Connection], T], *, inline: bool = False) -> T:
        """Run ``fn(connection)`` now and return what it returns (or raise what it
        raises); it never suspends. ``inline`` changes nothing: every call is."""
        if self._closed:
            raise RuntimeError("the store's SQLite connection is closed")
        conn = self._conn
        if conn is None or conn.invalidated:
            # A connection found dead is replaced, as the connection thread does,
            # so the store's retry of the transaction runs on a new one.
            if conn is not None:
                conn.close()
            conn = self._conn = self._engine.connect()
        return fn(conn)

    def nudge(self) -> None:
        """Nothing to wake: there is no poll of other processes' commits."""

    def close(self) -> None:
        """Close the connection, then the engine (a file store then holds no
        handle); again, nothing."""
        if self._closed:
            return
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        self._engine.dispose()

    async def wait_closed(self, timeout: float = 5.0) -> None:
        """Closed already: :meth:`close` ends everything before it returns."""


class _EngineHandle:
    """Where the store keeps its engine: the blocking one's dialect (the statements
    are built for it), and disposal, which closes the runner's connection first.
    Nothing connects through it; the store's transactions go to the runner."""

    def __init__(self, runner: CallerConnection) -> None:
        self._runner = runner
        self.dialect = runner.dialect

    async def dispose(self) -> None:
        self._runner.close()


class OneShotSQLiteStore(SQLiteStore):
    """:class:`~conveyor.store.sqlite.SQLiteStore` for a process that makes a few
    calls and exits (conveyor's command line): its transactions run on a blocking
    connection on the thread of the event loop awaiting them (see the module's
    docs). Every call of the store is the same; a worker, or anything that waits
    to be woken by other processes, wants the plain store."""

    def _create_engine(self) -> AsyncEngine:
        engine = blocking_engine(self.url, self._blocking_options())
        # Not `fair`: SQLite's busy handler waits for another process's write lock,
        # and SQLite checkpoints the WAL as it commits (no thread does it on a timer).
        configure(engine, busy_timeout=self.busy_timeout, synchronous=self.synchronous)
        runner = self._thread = CallerConnection(engine)
        return cast("AsyncEngine", _EngineHandle(runner))


__all__ = ["CallerConnection", "OneShotSQLiteStore"]
