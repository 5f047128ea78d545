"""PostgresStore: the PostgreSQL dialect of the protocol.

What differs from SQLite, and only that:

* clock — the database's ``statement_timestamp()``, so hosts need not agree on time;
* claim locking — candidate rows are selected ``FOR UPDATE SKIP LOCKED`` so
  concurrent claimers pass each other instead of queueing;
* no probe — an idle claim takes no lock worth avoiding;
* RETURNING of the joined task row (an UPDATE … FROM the tasks table);
* the lock a new consumer group's backfill takes to wait out producers in flight,
  and the advisory lock that serialises migrations;
* transient errors — serialization failures (40001) and deadlocks (40P01);
* the wake channel — ``pg_notify`` in committing transactions and one LISTEN
  connection per store (:mod:`conveyor.store.pg_listen`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any, ClassVar

from sqlalchemy import BigInteger, ColumnElement, Select, Update, cast, event, extract, func, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from conveyor import statements as q
from conveyor.errors import ConfigurationError, InvalidArgument
from conveyor.schema import deliveries as d
from conveyor.schema import tasks as t
from conveyor.store import pg_listen
from conveyor.store.base import TaskStore

TRANSIENT_SQLSTATES = frozenset({"40001", "40P01"})
DISK_FULL = "53100"
# The protocol locks a row and then re-reads what it guards (a stream's head, a
# key's holder) expecting to see what committed meanwhile: READ COMMITTED only.
# Under a snapshot isolation those re-reads would see the transaction's start.
ISOLATION_LEVEL = "READ COMMITTED"
MIGRATION_LOCK = 0x636F6E76  # "conv"
MAINTENANCE_LOCK = MIGRATION_LOCK + 1
LISTEN_START_WAIT = 2.0  # seconds open() gives the listener before going on without it


def _read_committed(field: str, level: object) -> str:
    if str(level).upper().replace("_", " ") != ISOLATION_LEVEL:
        raise InvalidArgument(
            field,
            f"isolation_level must be {ISOLATION_LEVEL!r}, got {level!r}: the protocol "
            "re-reads rows after locking them and relies on seeing what committed "
            "meanwhile; leave isolation_level out",
        )
    return ISOLATION_LEVEL


class PostgresStore(TaskStore):
    """conveyor on PostgreSQL (psycopg 3)."""

    row_locks: ClassVar[bool] = True

    def __init__(
        self,
        url: str,
        *,
        isolation_level: str = "READ COMMITTED",
        listen: bool = True,
        **options: Any,
    ):
        super().__init__(url, **options)
        #: Whether to hold a LISTEN connection for wake-ups (False: waiters only poll;
        #: for short-lived producers such as a CLI call). NOTIFY is sent either way.
        self.listen = listen
        self._listener: pg_listen.Listener | None = None
        self.isolation_level = _read_committed("isolation_level", isolation_level)
        if "isolation_level" in self.engine_options:
            _read_committed("engine_options", self.engine_options["isolation_level"])

    def _create_engine(self) -> AsyncEngine:
        options: dict[str, Any] = {
            "pool_pre_ping": True,
            # from the whitelist above; never user text spliced into SQL
            "isolation_level": self.isolation_level,
            **self.engine_options,
        }
        engine = create_async_engine(self.url, **options)
        timeouts = {
            "statement": f"{round(self.statement_timeout * 1000)}ms",
            "lock": f"{round(self.lock_timeout * 1000)}ms",
        }

        @event.listens_for(engine.sync_engine, "begin")
        def _on_begin(conn: Connection) -> None:
            # SET LOCAL semantics (is_local=true): the limits die with the transaction,
            # so they hold behind a transaction-mode pooler and never leak to others.
            conn.exec_driver_sql(
                "SELECT set_config('statement_timeout', %(statement)s, true), "
                "set_config('lock_timeout', %(lock)s, true)",
                timeouts,
            )

        return engine

    async def _database_identity(self, conn: AsyncConnection) -> tuple[Any, ...]:
        # The server (its start time and port: host names and sockets vary by client)
        # and the database on it.
        row = (
            await conn.execute(
                text(
                    "SELECT pg_postmaster_start_time()::text, current_setting('port'), "
                    "current_database()"
                )
            )
        ).one()
        return ("postgresql", *row)

    async def _join_transaction(self, conn: AsyncConnection) -> None:
        # psycopg outside autocommit begins a transaction with the first statement;
        # a driver connection switched to autocommit behind SQLAlchemy's back has none.
        raw: Any = (await conn.get_raw_connection()).driver_connection
        if getattr(raw, "autocommit", False) is True:
            raise ConfigurationError(
                "connection: its psycopg connection is in autocommit mode, so there is no "
                "transaction to join; leave autocommit off"
            )

    def _db_now(self) -> ColumnElement[int]:
        # statement_timestamp(), not now(): each statement of a longer transaction sees
        # the moment it runs; and unlike clock_timestamp() it is stable within the
        # statement, so comparisons with it can be index conditions.
        return cast(
            func.floor(extract("epoch", func.statement_timestamp()) * 1_000_000), BigInteger
        )

    def _lock_candidates(self, stmt: Select[Any]) -> Select[Any]:
        return stmt.with_for_update(skip_locked=True)

    def _lock_rows(self, stmt: Select[Any]) -> Select[Any]:
        return stmt.with_for_update()

    def _share_rows(self, stmt: Select[Any]) -> Select[Any]:
        # FOR KEY SHARE: the lightest row lock; many producers hold it at once, and
        # unsubscribe's FOR UPDATE of the group row still waits for them.
        return stmt.with_for_update(read=True, key_share=True)

    async def _lock_for_backfill(self, conn: AsyncConnection) -> None:
        # Producers take the stream rows (partitioned submits) and then insert tasks.
        # SHARE ROW EXCLUSIVE on both, in that order, waits for every producer in
        # flight and holds new ones back until the subscribe commits. It is
        # self-exclusive, so two subscribes (both write stream rows) queue instead of
        # deadlocking; readers and FOR UPDATE row locks pass, writes to these two
        # tables wait for the length of the backfill.
        await conn.execute(text("LOCK TABLE conveyor_streams IN SHARE ROW EXCLUSIVE MODE"))
        await conn.execute(text("LOCK TABLE conveyor_tasks IN SHARE ROW EXCLUSIVE MODE"))

    def _lock_for_migration(self, conn: Connection) -> None:
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})

    @asynccontextmanager
    async def _maintenance_lock(self) -> AsyncIterator[bool]:
        # A session-level advisory lock on a connection held for the whole pass: one
        # worker maintains, the others skip instead of queueing behind it.
        assert self._engine is not None
        async with self._engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            got = bool(
                (
                    await conn.execute(
                        text("SELECT pg_try_advisory_lock(:key)"), {"key": MAINTENANCE_LOCK}
                    )
                ).scalar()
            )
            try:
                yield got
            finally:
                if got:
                    await conn.execute(
                        text("SELECT pg_advisory_unlock(:key)"), {"key": MAINTENANCE_LOCK}
                    )

    @asynccontextmanager
    async def _transaction_gate(self, write: bool) -> AsyncIterator[None]:
        # Concurrent transactions each take their own pooled connection; the server
        # orders them.
        yield

    def _is_full(self, exc: DBAPIError) -> bool:
        return getattr(exc.orig, "sqlstate", None) == DISK_FULL

    def _is_transient(self, exc: DBAPIError) -> bool:
        return getattr(exc.orig, "sqlstate", None) in TRANSIENT_SQLSTATES

    def _upsert(self, table: Any) -> Any:
        return pg_insert(table)

    def _returning_view(self, stmt: Update) -> Update:
        # Postgres's RETURNING may read the joined table: one UPDATE … FROM tasks.
        return stmt.where(t.c.seq == d.c.task_seq).returning(*q.view_columns())

    def _claim_probe(
        self, grp: str, queues: Sequence[str], partition: str | None, now: ColumnElement[int]
    ) -> Select[Any] | None:
        # An idle claim takes no lock worth sparing (SKIP LOCKED, row locks only).
        return None

    async def _start_wake(self) -> None:
        if not self.listen:
            return
        url = make_url(self.url).set(drivername="postgresql")
        connect_args = self.engine_options.get("connect_args")
        self._listener = pg_listen.Listener(
            url.render_as_string(hide_password=False),
            on_work=lambda queue: self._wake(queues=[queue]),
            on_done=lambda task_id: self._wake(task_ids=None if task_id is None else [task_id]),
            on_reset=lambda: self._wake(queues=None, task_ids=None),
            connect_kwargs=connect_args if isinstance(connect_args, dict) else None,
        )
        await self._listener.start(wait=LISTEN_START_WAIT)

    async def _stop_wake(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            await listener.stop()

    async def _notify(
        self,
        conn: AsyncConnection,
        queues: Iterable[str],
        done: bool,
        task_ids: Iterable[str] = (),
    ) -> None:
        params = pg_listen.notify_params(queues, done, task_ids)
        if params is not None:
            await conn.execute(pg_listen.NOTIFY, params)
