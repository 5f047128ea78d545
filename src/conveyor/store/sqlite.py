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
* RETURNING — SQLite's may name only columns of the updated table, so the task
  columns of a fenced write or claim come from correlated subqueries;
* wake-ups — in-process events only (the store wakes its own waiters); other
  processes are seen by polling the probe.

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
import os
import sqlite3
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, ClassVar

from sqlalchemy import BigInteger, ColumnElement, Select, Update, event, literal, select
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

from conveyor import _values as v
from conveyor import statements as q
from conveyor.errors import ConfigurationError, InvalidArgument
from conveyor.schema import deliveries as d
from conveyor.schema import tasks as t
from conveyor.store.base import TaskStore
from conveyor.store.seam import DirectRunner

SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


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

    # One writer holds the whole database: there are no row locks to order.
    row_locks: ClassVar[bool] = False

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

    @asynccontextmanager
    async def _transaction_gate(self, write: bool) -> AsyncIterator[None]:
        if not self.in_memory:
            yield
            return
        # The one connection runs one transaction at a time: queue for it.
        if self._serial is None:
            self._serial = asyncio.Lock()
        async with self._serial:
            yield

    async def _database_identity(self, conn: AsyncConnection) -> tuple[Any, ...]:
        # The file behind the connection, as SQLite resolved it.
        rows = (await conn.exec_driver_sql("PRAGMA database_list")).all()
        path = next((str(row.file) for row in rows if row.name == "main"), "")
        if not path:
            raise ConfigurationError(
                "connection: an in-memory SQLite database belongs to one connection and "
                "cannot be shared; use a SQLite file"
            )
        return ("sqlite", os.path.realpath(path))

    async def _join_transaction(self, conn: AsyncConnection) -> None:
        # sqlite3's default (legacy) transaction control begins a transaction only
        # before the first INSERT/UPDATE/DELETE: a SAVEPOINT before that would open,
        # and its RELEASE commit, a transaction of its own. Begin the caller's now.
        raw: Any = (await conn.get_raw_connection()).driver_connection
        if not raw.in_transaction:
            await conn.exec_driver_sql("BEGIN")

    def _db_now(self) -> ColumnElement[int]:
        return literal(v.now_us(), BigInteger)

    def _lock_candidates(self, stmt: Select[Any]) -> Select[Any]:
        # The whole claim runs under BEGIN IMMEDIATE: the single writer lock is the lock.
        return stmt

    def _lock_rows(self, stmt: Select[Any]) -> Select[Any]:
        # Writes run under BEGIN IMMEDIATE: nothing else can change the rows meanwhile.
        return stmt

    def _share_rows(self, stmt: Select[Any]) -> Select[Any]:
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

    def _is_full(self, exc: DBAPIError) -> bool:
        # SQLITE_FULL: the disk, or the file's max_page_count, has no room left.
        return "database or disk is full" in str(exc.orig)

    def _is_transient(self, exc: DBAPIError) -> bool:
        orig = exc.orig
        message = str(orig).lower()
        return isinstance(orig, sqlite3.OperationalError) and (
            "locked" in message or "busy" in message
        )

    def _upsert(self, table: Any) -> Any:
        return sqlite_insert(table)

    def _returning_view(self, stmt: Update) -> Update:
        # SQLite's RETURNING may name only the updated table's columns (an UPDATE …
        # FROM table may not appear there), so each task column is a correlated
        # lookup by primary key. Same names and values as Postgres's joined form.
        columns: list[Any] = []
        for col in q.view_columns():
            if col.table is d:
                columns.append(col)
            elif col.name == "seq":
                columns.append(d.c.task_seq.label("seq"))
            else:
                lookup = select(col).where(t.c.seq == d.c.task_seq).correlate(d)
                columns.append(lookup.scalar_subquery().label(col.name))
        return stmt.returning(*columns)

    def _claim_probe(
        self, grp: str, queues: Sequence[str], partition: str | None, now: ColumnElement[int]
    ) -> Select[Any] | None:
        # A claim takes the single write lock (BEGIN IMMEDIATE) and would block every
        # producer while an idle worker polls; a read beside the writer (WAL) does not.
        return q.claim_probe(grp, queues, now, partition)

    def _statement_texts(self) -> Mapping[str, str]:
        # No data-modifying CTEs, arrays or UPDATE … FROM a set-returning function:
        # claim, plain submit and ack run step by step, on the one connection that
        # holds the write lock, so it costs no extra round trips to a server.
        return {}

    def _direct_runner(self) -> DirectRunner | None:
        return None

    async def _start_wake(self) -> None:
        # No cross-process channel: waiters in other processes poll.
        return None

    async def _stop_wake(self) -> None:
        return None

    async def _notify(
        self,
        conn: AsyncConnection,
        queues: Iterable[str],
        done: bool,
        task_ids: Iterable[str] = (),
    ) -> None:
        # Nobody outside this process listens; the store wakes its own waiters.
        return None
