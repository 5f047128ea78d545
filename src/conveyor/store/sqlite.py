"""SQLiteStore: the SQLite dialect of the protocol.

What differs from Postgres, and only that:

* clock — the process clock, bound as a parameter (SQLite has no shared server
  clock to defer to, and a single host needs none);
* claim locking — SQLite has one writer. Write transactions start with
  ``BEGIN IMMEDIATE``, so two claimers never read the same ready row and no
  deferred transaction fails on a lock upgrade; read-only calls use a deferred
  ``BEGIN`` and run beside the writer thanks to WAL;
* the claimable probe — an idle worker asks a read-only question before taking
  the write lock, so polling never blocks producers;
* wake-ups — in-process events only (the base class); other processes are seen
  by polling the probe.

In-memory databases (``sqlite:///:memory:``, ``sqlite://``): SQLite gives each
connection its own private in-memory database, so the store must use exactly one
connection, and one connection can run one transaction at a time. The store
therefore queues its transactions on an in-process lock (the single-writer lock
of a file database, moved into the process): concurrent calls wait their turn
instead of failing with "cannot start a transaction within a transaction". Such
a store is private to its process and gone when it closes.

Durability: ``journal_mode=WAL`` with ``synchronous=NORMAL`` survives a process
crash (kill -9) but a power cut may lose the last transactions. Pass
``synchronous="FULL"`` to :func:`conveyor.connect` for power-cut durability.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, ClassVar, TypeVar

from sqlalchemy import BigInteger, ColumnElement, Select, event, literal
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

from conveyor import _values as v
from conveyor.errors import InvalidArgument
from conveyor.store.base import TaskStore

SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")

T = TypeVar("T")


def is_memory(url: str) -> bool:
    """Whether ``url`` names a private in-memory database rather than a file."""
    parsed = make_url(url)
    database = parsed.database or ""
    return (
        database in ("", ":memory:")
        or database.startswith("file::memory:")
        or parsed.query.get("mode") == "memory"
    )


class SQLiteStore(TaskStore):
    """conveyor on a SQLite file (or ``:memory:`` for throwaway use)."""

    probe_before_claim: ClassVar[bool] = True
    # SQLite's RETURNING may only name columns of the updated table.
    returning_joins: ClassVar[bool] = False

    def __init__(
        self, url: str, *, busy_timeout: float = 10.0, synchronous: str = "NORMAL", **options: Any
    ) -> None:
        super().__init__(url, **options)
        self.busy_timeout = v.duration_seconds("busy_timeout", busy_timeout)
        if synchronous.upper() not in SYNCHRONOUS:
            raise InvalidArgument("synchronous", f"must be one of {', '.join(SYNCHRONOUS)}")
        self.synchronous = synchronous.upper()
        #: One private database on one connection: transactions queue in-process.
        self.in_memory = is_memory(url)
        self._serial: asyncio.Lock | None = None

    def _create_engine(self) -> AsyncEngine:
        options = dict(self.engine_options)
        if self.in_memory:
            # Every new connection would open a new, empty database: keep exactly one.
            options["poolclass"] = StaticPool
            options.pop("pool_size", None)
            options.pop("max_overflow", None)
            options.pop("pool_timeout", None)
        engine = create_async_engine(self.url, **options)
        busy_ms = int(self.busy_timeout * 1000)
        synchronous = self.synchronous

        @event.listens_for(engine.sync_engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Take transaction control from the driver so BEGIN is ours to choose.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout = {busy_ms}")
            cur.execute("PRAGMA journal_mode = WAL")
            cur.execute(f"PRAGMA synchronous = {synchronous}")
            cur.execute("PRAGMA foreign_keys = ON")
            cur.close()

        @event.listens_for(engine.sync_engine, "begin")
        def _on_begin(conn: Connection) -> None:
            write = conn.get_execution_options().get("conveyor_write", True)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

        return engine

    async def _run(
        self, work: Callable[[AsyncConnection], Awaitable[T]], *, write: bool = True
    ) -> T:
        if not self.in_memory:
            return await super()._run(work, write=write)
        # The one connection runs one transaction at a time: queue for it.
        if self._serial is None:
            self._serial = asyncio.Lock()
        async with self._serial:
            return await super()._run(work, write=write)

    def _db_now(self) -> ColumnElement[int]:
        return literal(v.now_us(), BigInteger)

    def _lock_candidates(self, stmt: Select[Any]) -> Select[Any]:
        # The whole claim runs under BEGIN IMMEDIATE: the single writer lock is the lock.
        return stmt

    def _lock_rows(self, stmt: Select[Any]) -> Select[Any]:
        # Writes run under BEGIN IMMEDIATE: nothing else can change the rows meanwhile.
        return stmt

    async def _lock_for_backfill(self, conn: AsyncConnection) -> None:
        # One writer at a time: no producer can be in flight beside this transaction.
        return None

    def _lock_for_migration(self, conn: Connection) -> None:
        # The migration transaction began with BEGIN IMMEDIATE, which excludes other writers.
        return None

    @asynccontextmanager
    async def _maintenance_lock(self) -> AsyncIterator[bool]:
        # Every maintenance step is its own BEGIN IMMEDIATE transaction: the single
        # writer lock already serialises concurrent passes, and each step is idempotent.
        yield True

    def _is_transient(self, exc: DBAPIError) -> bool:
        orig = exc.orig
        message = str(orig).lower()
        return isinstance(orig, sqlite3.OperationalError) and (
            "locked" in message or "busy" in message
        )

    def _upsert(self, table: Any) -> Any:
        return sqlite_insert(table)
