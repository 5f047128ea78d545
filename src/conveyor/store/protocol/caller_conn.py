"""Writing in the caller's own transaction: ``submit(..., connection=conn)``.

The producer's one submit path (:func:`conveyor.store.protocol.producer.submit_tx`) runs on
the caller's connection instead of one of the store's: the task rows become
visible when the caller commits and vanish if it rolls back. This module only
brings the caller's connection to that path:

* :func:`resolve` accepts an ``AsyncConnection`` or ``AsyncSession`` (the sync
  store: a ``Connection`` or ``Session``, through :class:`SyncConnection`) and
  refuses, with :class:`ConfigurationError`, a connection in autocommit mode (no
  transaction to join) or one to another database or dialect than the store's;
* :func:`after_commit` wakes this process's idle workers once the caller's
  transaction has committed, and never for a rollback. On Postgres the producer's
  NOTIFY rides in the caller's transaction and reaches other processes at commit.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sqlalchemy import event
from sqlalchemy.engine import Connection, make_url

from conveyor.errors import ConfigurationError
from conveyor.store.protocol import transactions as tx
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

T = TypeVar("T")

#: How long a wake waits for the caller's commit to finish (then it wakes anyway).
COMMIT_WAIT = 2.0
_IDENTITY = "conveyor_database_identity"


class SyncConnection:
    """A blocking ``Connection`` seen through the few awaitable methods the producer
    uses. Its statements run at once in the calling thread; nothing ever suspends,
    so :func:`run_inline` can drive the whole submit without an event loop."""

    def __init__(self, connection: Connection, wake_loop: asyncio.AbstractEventLoop) -> None:
        self.sync_connection = connection
        self.dialect = connection.dialect
        #: The loop of the store behind the sync facade: its waiters are woken there.
        self.wake_loop = wake_loop

    async def execute(self, statement: Any, parameters: Any = None) -> Any:
        """Run one statement on the caller's connection."""
        return self.sync_connection.execute(statement, parameters)

    async def exec_driver_sql(self, statement: str, parameters: Any = None) -> Any:
        """Run one statement text as it is (with the driver's parameters)."""
        return self.sync_connection.exec_driver_sql(statement, parameters)

    async def get_raw_connection(self) -> Any:
        """The pooled driver connection."""
        return self.sync_connection.connection

    @asynccontextmanager
    async def begin_nested(self) -> AsyncIterator[None]:
        """A savepoint: released on success, rolled back on an exception."""
        with self.sync_connection.begin_nested():
            yield


def run_inline(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (one working on a :class:`SyncConnection`)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    coro.close()
    raise RuntimeError("a submit on a blocking connection waited for I/O")  # pragma: no cover


def sync_connection_of(connection: Any) -> Connection | None:
    """The ``Connection`` behind a blocking ``Connection`` or ``Session``, else None."""
    # Imported here, not with the module: the ORM costs a command line that never
    # passes a connection= about 80 ms.
    from sqlalchemy.orm import Session

    if isinstance(connection, Session):
        return connection.connection()
    if isinstance(connection, Connection):
        return connection
    return None


async def resolve(st: Seam, connection: Any) -> AsyncConnection:
    """The caller's connection, checked: same dialect and database, in a transaction.

    Returns an ``AsyncConnection`` (or, for a blocking one, a :class:`SyncConnection`
    standing in for it).
    """
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

    if isinstance(connection, AsyncSession):
        conn: Any = await connection.connection()
    elif isinstance(connection, AsyncConnection | SyncConnection):
        conn = connection
    elif isinstance(connection, Connection | Session):
        raise ConfigurationError(
            "connection: the async store takes an AsyncConnection or AsyncSession; "
            "pass a blocking Connection or Session to the sync store (connect_sync)"
        )
    else:
        raise ConfigurationError(
            "connection: must be a SQLAlchemy AsyncConnection or AsyncSession (the sync "
            f"store: Connection or Session), got {type(connection).__name__}"
        )
    sync: Connection = conn.sync_connection
    ours = make_url(st.url).get_backend_name()
    theirs = sync.dialect.name
    if theirs != ours:
        raise ConfigurationError(
            f"connection: it is to a {theirs} database but the store is on {ours}; pass a "
            "connection to the store's own database"
        )
    if _autocommit(sync):
        raise ConfigurationError(
            "connection: it is in autocommit mode, so there is no transaction to join; "
            "use a connection without isolation_level='AUTOCOMMIT'"
        )
    expected = await store_identity(st)
    found = sync.info.get(_IDENTITY)
    if found is None:
        found = await st._database_identity(conn)
        sync.info[_IDENTITY] = found
    if found != expected:
        raise ConfigurationError(
            f"connection: it is to another database ({_show(found)}) than the store's "
            f"({_show(expected)}); pass a connection to the store's own database"
        )
    await st._join_transaction(conn)
    return cast(AsyncConnection, conn)


def _autocommit(sync: Connection) -> bool:
    check = getattr(sync, "_is_autocommit_isolation", None)
    if check is not None:
        return bool(check())
    return sync.get_execution_options().get("isolation_level") == "AUTOCOMMIT"  # pragma: no cover


def _show(identity: tuple[Any, ...]) -> str:
    return ", ".join(str(part) for part in identity if part not in (None, ""))


_identities: weakref.WeakKeyDictionary[Seam, tuple[Any, ...]] = weakref.WeakKeyDictionary()


async def store_identity(st: Seam) -> tuple[Any, ...]:
    """Which database the store is on, as :meth:`Seam._database_identity` tells it."""
    known = _identities.get(st)
    if known is None:
        known = await tx.run(st, st._database_identity, write=False)
        _identities[st] = known
    return known


# ------------------------------------------------------------------ wake-ups
_pending: weakref.WeakKeyDictionary[Connection, list[Callable[[Connection], None]]] = (
    weakref.WeakKeyDictionary()
)


def after_commit(conn: Any, wake: Callable[[], None]) -> None:
    """Call ``wake`` on the store's event loop once the caller's transaction on
    ``conn`` has committed; never if it rolls back."""
    sync: Connection = conn.sync_connection
    loop = getattr(conn, "wake_loop", None) or asyncio.get_running_loop()
    call_soon = _scheduler(loop)
    # On the caller's engine, once: a pool hands out a new Connection object per
    # checkout, and listening on each cost about a tenth of a submit in a
    # transaction of its own.
    engine = sync.engine
    if not event.contains(engine, "commit", _on_commit):
        event.listen(engine, "commit", _on_commit)
        event.listen(engine, "rollback", _on_rollback)

    def committing(connection: Connection) -> None:
        # The event fires just before the driver commits: wait for the transaction
        # object to end, so a woken worker finds the rows.
        transaction = connection.get_transaction()
        deadline = time.monotonic() + COMMIT_WAIT

        def check() -> None:
            done = transaction is None or not transaction.is_active
            done = done or connection.get_transaction() is not transaction
            if done or time.monotonic() > deadline:
                wake()
            else:
                call_soon(check, delay=0.002)

        call_soon(check)

    _pending.setdefault(sync, []).append(committing)


def _on_commit(connection: Connection) -> None:
    for callback in _pending.pop(connection, []):
        callback(connection)


def _on_rollback(connection: Connection) -> None:
    _pending.pop(connection, None)


def _scheduler(loop: asyncio.AbstractEventLoop) -> Callable[..., None]:
    """``call_soon(fn, delay=0)`` on ``loop``, callable from any thread (the commit
    of a blocking connection happens in the caller's)."""

    def call_soon(fn: Callable[[], None], delay: float = 0.0) -> None:
        if loop.is_closed():
            return
        if delay:
            loop.call_soon_threadsafe(loop.call_later, delay, fn)
        else:
            loop.call_soon_threadsafe(fn)

    return call_soon


__all__ = [
    "SyncConnection",
    "after_commit",
    "resolve",
    "run_inline",
    "store_identity",
    "sync_connection_of",
]
