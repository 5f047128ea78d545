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
* transport — SQLite runs inside the process, so the store runs each whole
  transaction as one blocking function on one connection owned by a thread of
  its own (:mod:`conveyor.store.sqlite.thread`): one hop from the event loop per
  transaction. The thread's queue is the in-process write lock: this process's
  transactions run one at a time in arrival order, never sleeping in SQLite's
  busy handler for each other. A write transaction waiting for another
  process's lock asks again every millisecond (up to ``busy_timeout``) instead
  of in SQLite's busy handler, whose back-off to 100 ms sleeps lets a process
  that writes back to back starve the other. A short write (a submit) that
  finds the thread idle skips the hop and runs on the event loop's thread, on
  the same connection (check_same_thread off; a lock makes one user at a time),
  asking for the write lock once: the inline fast path of
  :mod:`conveyor.store.sqlite.thread`;
* wake-ups — while idle, the connection thread reads ``PRAGMA data_version``
  every few milliseconds (no lock; it changes when another connection commits)
  and wakes this process's idle workers and ``wait()`` calls when it moves.

In-memory databases (``sqlite:///:memory:``, ``sqlite://``): SQLite gives each
connection its own private in-memory database, so the store must use exactly one
connection, and one connection can run one transaction at a time: the same
connection thread, whose queue makes concurrent calls wait their turn instead of
failing with "cannot start a transaction within a transaction". Such a store is
private to its process and gone when it closes.

Durability: ``journal_mode=WAL`` with ``synchronous=NORMAL`` survives a process
crash (kill -9) but a power cut may lose the last transactions. Pass
``synchronous="FULL"`` to :func:`conveyor.connect` for power-cut durability.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import sqlite3
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Select,
    Update,
    bindparam,
    event,
    literal,
    select,
)
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import StaticPool

from conveyor import _values as v
from conveyor.errors import ConfigurationError, InvalidArgument
from conveyor.schema import deliveries as d
from conveyor.schema import tasks as t
from conveyor.store.base import TaskStore
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import texts
from conveyor.store.protocol.transactions import InlineConnection
from conveyor.store.seam import BatchRunner, Claim, ConnectionRunner, DirectRunner, StepsRunner
from conveyor.store.sqlite import claim as sqlite_claim
from conveyor.store.sqlite.connection import (
    FUNCTION_RAISED,
    SYNCHRONOUS,
    blocking_engine,
    configure,
    is_memory,
    refuse_capped,
)
from conveyor.store.sqlite.thread import CHECKPOINT_EVERY, ConnectionThread

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    from conveyor.store.sqlite.oneshot import CallerConnection

#: Seconds between two looks at ``PRAGMA data_version`` while the store is idle:
#: how soon a commit in another process wakes this one's idle workers.
WAKE_POLL = 0.002
#: The same while nobody in this process waits to be woken.
WAKE_IDLE_POLL = 0.1


class SQLiteStore(TaskStore):
    """conveyor on a SQLite file (or ``:memory:`` for throwaway use)."""

    # No server clock: the process's, bound to each statement when it runs.
    process_clock: ClassVar[bool] = True

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
        self._thread: ConnectionThread | CallerConnection | None = None
        self._probes: dict[tuple[Any, ...], Select[Any]] = {}
        self._wake_loop: asyncio.AbstractEventLoop | None = None

    def _create_engine(self) -> AsyncEngine:
        # Imported when a store opens, not with the module: the async layer (and
        # the ORM it imports) would cost every command line about 80 ms.
        from sqlalchemy.ext.asyncio import create_async_engine

        options = self._blocking_options()
        # The store's own transactions run on one blocking connection in a thread
        # of its own (conveyor.store.sqlite.thread), which gets the engine options;
        # the async engine stays the store's handle (opened, disposed) and connects
        # only if asked to (a private in-memory database: to one of its own).
        engine = create_async_engine(self.url, poolclass=StaticPool if self.in_memory else None)
        blocking = blocking_engine(self.url, options)
        configure(engine.sync_engine, busy_timeout=self.busy_timeout, synchronous=self.synchronous)
        configure(
            blocking,
            busy_timeout=self.busy_timeout,
            synchronous=self.synchronous,
            fair=not self.in_memory,
            begun=self._inline_begun,
        )
        self._thread = ConnectionThread(
            blocking,
            # Not with synchronous FULL or EXTRA: each commit then waits for the disk,
            # which the event loop must not.
            inline=self.synchronous in ("OFF", "NORMAL"),
            # A private in-memory database has nobody else to hear from.
            poll=None if self.in_memory else WAKE_POLL,
            on_change=None if self.in_memory else self._changed_elsewhere,
            listening=self._listening,
            idle_poll=WAKE_IDLE_POLL,
            # (a private in-memory database has no WAL)
            checkpoint_every=None if self.in_memory else CHECKPOINT_EVERY,
        )
        thread = self._thread

        @event.listens_for(engine.sync_engine, "engine_disposed")
        def _on_dispose(_engine: Any) -> None:
            thread.close()

        return engine

    def _blocking_options(self) -> dict[str, Any]:
        """The engine options, for the blocking engine of the store's connection."""
        options = dict(self.engine_options)
        if "async_creator" in options:
            raise InvalidArgument(
                "engine_options",
                "async_creator: the SQLite store runs on a blocking sqlite3 connection; "
                "pass creator (a function returning a sqlite3 connection) instead",
            )
        return options

    def _inline_begun(self) -> bool:
        # The inline fast path (ConnectionThread.call) sends its own BEGIN IMMEDIATE.
        return self._thread is not None and self._thread.begun

    def _connection_runner(self) -> ConnectionRunner | None:
        # In-process, a transaction's statements cost microseconds each and a hop
        # to a driver thread per statement costs more: the whole transaction runs
        # as one function on the store's connection thread, whose queue is also
        # the in-process write lock (FIFO, no busy sleeps between our own writers).
        return self._thread

    def _listening(self) -> bool:
        # Read on the connection thread; a stale answer costs at most one slow poll.
        work, done = self._work_waker, self._done_waker
        return bool((work is not None and work.watched()) or (done is not None and done.watched()))

    async def wait_for_work(self, queues: Sequence[str], timeout: float) -> bool:
        """Sleep until new work may be claimable in ``queues`` or ``timeout`` passes
        (see :meth:`TaskStore.wait_for_work`)."""
        # The wake channel polls fast only while someone listens: tell it at once.
        if self._thread is not None:
            self._thread.nudge()
        return await super().wait_for_work(queues, timeout)

    def _changed_elsewhere(self) -> None:
        # On the connection thread: another connection committed. Wake every
        # waiter here on the store's loop; each looks again, which is cheap.
        loop = self._wake_loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(partial(self._wake, queues=None, task_ids=None))

    @asynccontextmanager
    async def _transaction_gate(self, write: bool) -> AsyncIterator[None]:
        # Transactions queue on the connection thread instead (one at a time, in
        # arrival order), which is also what one in-memory connection needs.
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
        # The statements call conveyor_capped, which the caller's connection, not
        # one of ours, has not registered: sqlite3's is a quick call, aiosqlite's a
        # hop to its thread, made once per connection.
        if not inspect.iscoroutinefunction(raw.create_function):
            raw.create_function("conveyor_capped", 1, refuse_capped)
        elif not getattr(raw, "_conveyor_functions", False):
            await raw.create_function("conveyor_capped", 1, refuse_capped)
            raw._conveyor_functions = True
        # The dependency release trigger cascades by firing itself (as on the
        # store's own connections): a flag of the connection, which SQLite lets a
        # transaction set; it stays on for the caller's connection.
        await conn.exec_driver_sql("PRAGMA recursive_triggers = ON")
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

    async def _lock_for_backfill(self, conn: AsyncConnection) -> None:
        # One writer at a time: no producer can be in flight beside this transaction.
        return None

    def _lock_for_migration(self, conn: Connection) -> None:
        # The migration transaction began with BEGIN IMMEDIATE, which excludes other writers.
        return None

    async def _refresh_statistics(self, conn: AsyncConnection) -> list[str]:
        # SQLite's planner needs none here: every single-row write names all the
        # columns of a primary key, which it knows to be unique and always prefers,
        # and the claim's plans are pinned by the partial indexes (statuses written
        # inline). Gathered statistics (sqlite_stat1) could move plans the tests pin.
        return []

    @asynccontextmanager
    async def _maintenance_lock(self) -> AsyncIterator[bool]:
        # Every maintenance step is its own BEGIN IMMEDIATE transaction: the single
        # writer lock already serialises concurrent passes, and each step is idempotent.
        yield True

    def _is_capped(self, exc: DBAPIError) -> bool:
        # conveyor_capped is the one function of ours a statement may see raise.
        return str(exc.orig) == FUNCTION_RAISED

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
        return stmt.returning(*_returned_view())

    def _claim_probe(
        self, grp: str, queues: Sequence[str], partition: str | None
    ) -> Select[Any] | None:
        # A claim takes the single write lock (BEGIN IMMEDIATE) and would block every
        # producer while an idle worker polls; a read beside the writer (WAL) does not.
        # An idle worker asks this on every wake-up, so it is built once per question,
        # its clock read when it runs.
        key = (grp, tuple(queues), partition, self.clock_offset)
        probe = self._probes.get(key)
        if probe is None:
            if len(self._probes) >= 256:  # queues named on the fly: stay bounded
                self._probes.clear()
            offset = round(self.clock_offset * v.US)
            clock = bindparam("probe_now", type_=BigInteger, callable_=lambda: v.now_us() + offset)
            probe = self._probes[key] = q.claim_probe(grp, queues, clock, partition)
        return probe

    async def _claim(self, ask: Claim) -> Sequence[Any] | None:
        # No data-modifying CTEs, arrays or LATERAL: a claim is a few statements in
        # one transaction on the connection thread (conveyor.store.sqlite.claim).
        return await sqlite_claim.claim(self, ask)

    async def _claim_in(self, conn: AsyncConnection, ask: Claim) -> Sequence[Any] | None:
        return await sqlite_claim.claim_tx(self, conn, await texts.of(self), ask)

    def _statement_texts(self) -> Mapping[str, str]:
        # No data-modifying CTEs, arrays, LATERAL or UPDATE … FROM a set-returning
        # function: a statement Postgres writes as one may be a script here, its
        # statements run on the one connection that holds the write lock, so they
        # cost no extra round trips to a server. Lists are JSON text read by
        # json_each (an IN list would be rebuilt per size); why each differs is in
        # the comments of sql/*.sql.
        return texts.load("conveyor.store.sqlite")

    def _direct_runner(self) -> DirectRunner | None:
        return None

    def _steps_runner(self) -> StepsRunner | None:
        # Statements cost microseconds on the connection thread: no round trips to
        # save.
        return None

    def _batch_runner(self) -> BatchRunner:
        return self._run_batch

    async def _run_batch(
        self, statements: Sequence[str], runs: Iterable[Mapping[str, Any]]
    ) -> list[Any] | None:
        # No server beside the caller to overlap with: every run's parameters are
        # taken first, here on the caller's thread, so the work that makes them (the
        # requests' validation) stays outside the write lock; then the runs one
        # after another on the connection thread, one hop.
        bound = list(runs)
        thread = self._thread
        assert thread is not None
        return await thread.call(partial(_run_runs, statements, bound))

    async def _start_wake(self) -> None:
        # The channel is the connection thread's data_version poll (see
        # conveyor.store.sqlite.thread); it wakes waiters on this loop.
        self._wake_loop = asyncio.get_running_loop()

    async def _stop_wake(self) -> None:
        self._wake_loop = None

    async def close(self) -> None:
        """Release the connection: when this returns, the store's connection thread
        has ended and the database file is closed."""
        thread = self._thread
        await super().close()
        if thread is not None:
            thread.close()  # also done by the engine's disposal; harmless twice
            await thread.wait_closed()

    async def _add_waiter(self, task_id: str, token: str, ttl_us: int) -> None:
        # The wake channel (data_version) wakes every waiter of this process on any
        # commit: no registration to keep.
        return None

    async def _drop_waiter(self, task_id: str, token: str) -> None:
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


def _run_runs(
    statements: Sequence[str], runs: list[Mapping[str, Any]], conn: Connection
) -> list[Any]:
    """``statements`` once per parameters of ``runs``, in order, in one write
    transaction on ``conn`` (the connection thread's); the last one's rows of each."""
    if conn.get_execution_options().get("conveyor_write") is not True:
        conn.execution_options(conveyor_write=True)  # BEGIN IMMEDIATE (see _configure)
    run = InlineConnection(conn).run_text
    *before, last = statements
    rows: list[Any] = []
    with conn.begin():
        for params in runs:
            one = dict(params)
            for sql in before:
                run(sql, one)
            rows += run(last, one)
    return rows


@functools.cache
def _returned_view() -> tuple[Any, ...]:
    """The task view as SQLite's RETURNING can give it, built once (a claim or
    fenced write needs it every time, and building it cost a tenth of a claim).

    SQLite's RETURNING may name only the updated table's columns (an UPDATE …
    FROM table may not appear there), so each task column is a correlated lookup
    by primary key. Same names and values as Postgres's joined form.
    """
    columns: list[Any] = []
    for col in q.view_columns():
        if col.table is d:
            columns.append(col)
        elif col.name == "seq":
            columns.append(d.c.task_seq.label("seq"))
        else:
            lookup = select(col).where(t.c.seq == d.c.task_seq).correlate(d)
            columns.append(lookup.scalar_subquery().label(col.name))
    return tuple(columns)
