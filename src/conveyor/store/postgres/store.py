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
  connection per store (:mod:`conveyor.store.postgres.listen`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from psycopg.conninfo import make_conninfo
from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Select,
    Update,
    cast,
    event,
    extract,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from conveyor.errors import ConfigurationError, InvalidArgument
from conveyor.schema import deliveries as d
from conveyor.schema import tasks as t
from conveyor.store.base import TaskStore
from conveyor.store.postgres import claim as pg_claim
from conveyor.store.postgres import direct as pg_direct
from conveyor.store.postgres import listen as pg_listen
from conveyor.store.postgres import pooling
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import texts
from conveyor.store.seam import BatchRunner, Claim, DirectRunner, StepsRunner

# Serialization failure and deadlock; and the server ending the session (admin
# shutdown, crash shutdown, cannot connect now): the server sends these instead of
# running the statement, and a transaction it ends is rolled back, so nothing of
# the call took effect, even for a single statement run in autocommit. That is what
# makes a pooled connection found dead safe to retry without a pre-ping.
TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "57P01", "57P02", "57P03", "25006"})
#: "cannot execute ... in a read-only transaction": the server is a standby (a
#: primary demoted by a switchover, or a URL that reached a replica). The statement
#: was refused, nothing of it ran; the connection is dropped with every other pooled
#: one (all to that server) and the transaction retried on a new connection, which
#: a multi-host URL with target_session_attrs=read-write makes to the new primary.
READ_ONLY = "25006"
DISK_FULL = "53100"
#: A submit statement's refusal of a queue with a max_depth (conveyor_capped, migration 0013).
CAPPED = "CVQ01"
# The protocol locks a row and then re-reads what it guards (a stream's head, a
# key's holder) expecting to see what committed meanwhile: READ COMMITTED only.
# Under a snapshot isolation those re-reads would see the transaction's start.
ISOLATION_LEVEL = "READ COMMITTED"
MIGRATION_LOCK = 0x636F6E76  # "conv"
MAINTENANCE_LOCK = MIGRATION_LOCK + 1
TIMEOUT_MODES = ("connection", "transaction")
#: psycopg prepares a statement server-side once it has run this many times on a
#: connection; the hot statements are fixed texts, so they are parsed and planned once.
PREPARE_THRESHOLD = 2
#: The tables whose planner statistics a maintenance pass keeps fresh: those the hot
#: statements filter and that grow with the work.
STATISTICS_TABLES = ("conveyor_deliveries", "conveyor_streams", "conveyor_tasks")
LISTEN_START_WAIT = 2.0  # seconds open() gives the listener before going on without it


def _follow_primary(engine: AsyncEngine) -> AsyncEngine:
    """``engine``, with a read-only refusal (:data:`READ_ONLY`) taken as a lost
    connection: SQLAlchemy then drops that connection and every other one its pool
    made before it (all to the same server, now a standby), so the retry connects
    anew and a multi-host URL finds the primary."""

    @event.listens_for(engine.sync_engine, "handle_error")
    def _read_only_is_gone(context: Any) -> None:
        if getattr(context.original_exception, "sqlstate", None) == READ_ONLY:
            context.is_disconnect = True

    return engine


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

    def __init__(
        self,
        url: str,
        *,
        isolation_level: str = "READ COMMITTED",
        listen: bool = True,
        timeouts: str | None = None,
        durable_claims: bool = False,
        direct_connections: int = pg_direct.MOST,
        pooler: str | None = None,
        listen_url: str | None = None,
        read_url: str | None = None,
        **options: Any,
    ):
        super().__init__(url, **options)
        engine_url, pooler = pooling.split_pooler(url, pooler)
        #: The pooler between the store and the server: ``"transaction"`` or
        #: ``"session"`` (PgBouncer's pool modes), or ``None`` (a direct connection);
        #: see :mod:`conveyor.store.postgres.pooling`.
        self.pooler = pooler
        # The URL the driver gets (without ?pooler=); self.url stays as given, so the
        # processes a worker starts from it go through the pooler alike.
        self._engine_url = engine_url
        if timeouts is None:
            timeouts = "transaction" if pooler == "transaction" else "connection"
        elif pooler == "transaction" and timeouts != "transaction":
            raise InvalidArgument(
                "timeouts",
                f'must be "transaction" behind a transaction-mode pooler (each transaction '
                f"may run on another server connection), got {timeouts!r}; leave it out",
            )
        given_listen = pooling.from_env(listen_url, pooling.LISTEN_URL_VARIABLE)
        #: A direct connection to the same database for LISTEN (``listen_url=`` or
        #: ``$CONVEYOR_LISTEN_URL``), for a store behind a transaction-mode pooler.
        self.listen_url = (
            None if given_listen is None else pooling.driver_url("listen_url", given_listen)
        )
        given_read = pooling.from_env(read_url, pooling.READ_URL_VARIABLE)
        #: A streaming replica the inspection reads go to (``read_url=`` or
        #: ``$CONVEYOR_READ_URL``); ``None``: every read goes to ``url``.
        self.read_url = None if given_read is None else pooling.driver_url("read_url", given_read)
        if timeouts not in TIMEOUT_MODES:
            raise InvalidArgument(
                "timeouts",
                f'must be "connection" (set once per connection) or "transaction" (set in '
                f"every transaction, for a transaction-mode pooler), got {timeouts!r}",
            )
        #: Where statement_timeout and lock_timeout are set: "connection" (once, when a
        #: connection is made: no round trip per transaction) or "transaction" (SET
        #: LOCAL in each transaction, for transaction-mode poolers such as PgBouncer,
        #: which share server connections and refuse startup options).
        self.timeouts = timeouts
        # The timeouts hold outside transactions only when set on the connection.
        self.autocommit_single = timeouts == "connection"
        #: Whether to hold a LISTEN connection for wake-ups, from the store's first
        #: claim or wait on (False: waiters only poll). NOTIFY is sent either way.
        self.listen = listen
        if not isinstance(durable_claims, bool):
            raise InvalidArgument(
                "durable_claims", f"must be True or False, got {durable_claims!r}"
            )
        #: Whether a claim's commit waits for the WAL flush. Off by default: a lease
        #: lost with a server crash only means the task runs again (at-least-once),
        #: and the claim's commit costs about half as much server time.
        self.durable_claims = durable_claims
        if (
            not isinstance(direct_connections, int)
            or isinstance(direct_connections, bool)
            or direct_connections < 1
        ):
            raise InvalidArgument(
                "direct_connections",
                f"must be a whole number of connections, 1 or more, got {direct_connections!r}",
            )
        #: The most connections, beyond the pool, the store keeps in autocommit for
        #: statements that run by themselves (claims, acknowledgements, plain
        #: submits): two always, more while that many such statements run at once,
        #: each closed again after 10 s idle (pg_direct).
        self.direct_connections = direct_connections
        self._listener: pg_listen.Listener | None = None
        self._direct: pg_direct.Direct | None = None
        self.isolation_level = _read_committed("isolation_level", isolation_level)
        if "isolation_level" in self.engine_options:
            _read_committed("engine_options", self.engine_options["isolation_level"])

    def _create_engine(self) -> AsyncEngine:
        return _follow_primary(self._make_engine(self._engine_url))

    def _create_read_engine(self) -> AsyncEngine | None:
        # The replica's connections are set up as the primary's (same pooler, same
        # timeouts); nothing is migrated there (it follows the primary).
        return None if self.read_url is None else self._make_engine(self.read_url)

    def _make_engine(self, url: str) -> AsyncEngine:
        # No pool_pre_ping: it costs a round trip per transaction. A connection found
        # dead is replaced and the transaction retried once (transactions.run).
        options: dict[str, Any] = dict(self.engine_options)
        statement_ms = round(self.statement_timeout * 1000)
        lock_ms = round(self.lock_timeout * 1000)
        connect_args = dict(options.get("connect_args") or {})
        if self.timeouts == "connection" and self.pooler is None:
            # Set once when the connection is made; every transaction then starts with
            # a plain BEGIN. (Numbers and a fixed level only: nothing user-typed.)
            startup = (
                f"-c statement_timeout={statement_ms} -c lock_timeout={lock_ms} "
                "-c default_transaction_isolation=read\\ committed"
            )
            given = connect_args.get("options")
            connect_args["options"] = f"{given} {startup}" if given else startup
            connect_args.setdefault("prepare_threshold", PREPARE_THRESHOLD)
            options["connect_args"] = connect_args
            return create_async_engine(url, **options)
        if self.timeouts == "connection":
            # A session-mode pooler refuses startup options: the same settings, by a
            # statement when each connection is made.
            connect_args.setdefault("prepare_threshold", PREPARE_THRESHOLD)
            options["connect_args"] = connect_args
            engine = create_async_engine(url, **options)
            pooling.set_on_connect(
                engine,
                {
                    "statement_timeout": f"{statement_ms}ms",
                    "lock_timeout": f"{lock_ms}ms",
                    "default_transaction_isolation": "read committed",
                },
            )
            return engine
        # from the whitelist above; never user text spliced into SQL
        options.setdefault("isolation_level", self.isolation_level)
        # A transaction-mode pooler may hand each transaction another server
        # connection: statements prepared on one are unknown on the next.
        connect_args.setdefault("prepare_threshold", None)
        options["connect_args"] = connect_args
        engine = create_async_engine(url, **options)
        pooling.set_per_transaction(
            engine, {"statement_timeout": f"{statement_ms}ms", "lock_timeout": f"{lock_ms}ms"}
        )
        return engine

    async def _database_identity(self, conn: AsyncConnection) -> tuple[Any, ...]:
        # The cluster (its system identifier, made by initdb and shared by its
        # streaming replicas: host names, sockets and ports vary by client, and a
        # restart or a failover to a standby changes the server but not the data)
        # and the database in it.
        row = (
            await conn.execute(
                text(
                    "SELECT (SELECT system_identifier FROM pg_control_system())::text, "
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

    async def _refresh_statistics(self, conn: AsyncConnection) -> list[str]:
        # Without statistics (a young table that autovacuum has not analysed yet, or
        # a server with autovacuum off) the planner guesses that an equality on any
        # indexed column finds about one row, and may then walk the partial index
        # of leased rows for a heartbeat or a fail, or the status index for a
        # claim's expiry check: work that grows with the queue. So a maintenance
        # pass analyses these tables when they changed by autovacuum's own
        # threshold (50 rows + 10 %) since their last analysis, or were never
        # analysed; where autovacuum keeps up, there is nothing left to do.
        rows = await conn.execute(
            text(
                "SELECT relname FROM pg_stat_user_tables "
                "WHERE schemaname = current_schema() AND relname = ANY(:tables) "
                "AND n_mod_since_analyze > :base + :scale * n_live_tup "
                "ORDER BY relname"
            ),
            {"tables": list(STATISTICS_TABLES), "base": 50, "scale": 0.1},
        )
        stale = [row.relname for row in rows]
        if stale:
            # SKIP_LOCKED: a table autovacuum (or another ANALYZE) holds is skipped,
            # not waited for. The names come from the list above, never from input.
            await conn.execute(text(f"ANALYZE (SKIP_LOCKED) {', '.join(stale)}"))
        return stale

    @asynccontextmanager
    async def _maintenance_lock(self) -> AsyncIterator[bool]:
        # A session-level advisory lock on a connection held for the whole pass: one
        # worker maintains, the others skip instead of queueing behind it.
        assert self._engine is not None
        if self.pooler == "transaction":
            async with pooling.maintenance_lock_in_transaction(
                self._engine, MAINTENANCE_LOCK
            ) as got:
                yield got
            return
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

    def _is_capped(self, exc: DBAPIError) -> bool:
        return getattr(exc.orig, "sqlstate", None) == CAPPED

    def _is_full(self, exc: DBAPIError) -> bool:
        return getattr(exc.orig, "sqlstate", None) == DISK_FULL

    def _is_transient(self, exc: DBAPIError) -> bool:
        return getattr(exc.orig, "sqlstate", None) in TRANSIENT_SQLSTATES

    def _is_read_only(self, exc: DBAPIError) -> bool:
        return getattr(exc.orig, "sqlstate", None) == READ_ONLY

    def _upsert(self, table: Any) -> Any:
        return pg_insert(table)

    def _returning_view(self, stmt: Update) -> Update:
        # Postgres's RETURNING may read the joined table: one UPDATE … FROM tasks.
        return stmt.where(t.c.seq == d.c.task_seq).returning(*q.view_columns())

    def _claim_probe(
        self, grp: str, queues: Sequence[str], partition: str | None
    ) -> Select[Any] | None:
        # An idle claim takes no lock worth sparing (SKIP LOCKED, row locks only).
        return None

    async def _claim(self, ask: Claim) -> Sequence[Any] | None:
        # One statement (conveyor.store.postgres.claim), durable or not as the store
        # was opened.
        return await pg_claim.claim(self, self.durable_claims, ask)

    async def _claim_in(self, conn: AsyncConnection, ask: Claim) -> Sequence[Any] | None:
        return await pg_claim.claim(self, self.durable_claims, ask, conn)

    def _statement_texts(self) -> Mapping[str, str]:
        return texts.load("conveyor.store.postgres")

    def _direct_runner(self) -> DirectRunner | None:
        # Outside a transaction the timeouts hold only when set on the connection.
        return self._run_direct if self.autocommit_single else None

    async def _run_direct(self, sql: str, params: Mapping[str, Any]) -> list[Any]:
        # On a psycopg connection kept in autocommit (pg_direct): no SQLAlchemy
        # Connection, execution context, result wrapping or pool round trip.
        return await self._kept().run(sql, params)

    def _steps_runner(self) -> StepsRunner | None:
        # The same kept connections, the statements pipelined between BEGIN and COMMIT.
        return self._run_steps if self.autocommit_single else None

    async def _run_steps(
        self, steps: Sequence[tuple[str, Mapping[str, Any]]], rows_of: int = -1
    ) -> list[Any] | None:
        return await self._kept().run_steps(steps, rows_of)

    def _batch_runner(self) -> BatchRunner:
        # The same kept connections, the runs pipelined between BEGIN and COMMIT.
        return self._run_batch

    async def _run_batch(
        self, statements: Sequence[str], runs: Iterable[Mapping[str, Any]]
    ) -> list[Any] | None:
        if not self.autocommit_single:
            # Timeouts set per transaction: a kept connection would run without them.
            return None
        return await self._kept().run_batch(statements, runs)

    def _kept(self) -> pg_direct.Direct:
        direct = self._direct
        if direct is None:
            assert self._engine is not None
            direct = self._direct = pg_direct.Direct(self._engine, self.direct_connections)
        return direct

    async def close(self) -> None:
        """Release every connection. The store can be opened again afterwards."""
        direct, self._direct = self._direct, None
        if direct is not None:
            await direct.close()
        await super().close()

    async def _start_wake(self) -> None:
        if not self.listen:
            return
        conninfo = pooling.listen_conninfo(self._conninfo, self.listen_url, self.pooler)
        if conninfo is None:
            return  # behind a transaction-mode pooler without listen_url: waiters poll
        connect_args = self.engine_options.get("connect_args")
        self._listener = pg_listen.Listener(
            conninfo,
            on_work=lambda queue: self._wake(queues=[queue]),
            on_done=lambda task_id: self._wake(task_ids=None if task_id is None else [task_id]),
            on_reset=lambda: self._wake(queues=None, task_ids=None),
            connect_kwargs=connect_args if isinstance(connect_args, dict) else None,
        )
        await self._listener.start(wait=LISTEN_START_WAIT)

    def _conninfo(self) -> str:
        """The libpq connection string of the store's URL, as the engine's dialect
        reads it: every host and port of a multi-host URL (``host=h1,h2 port=p1,p2``),
        ``target_session_attrs`` and the other query options, the password."""
        assert self._engine is not None
        _, params = self._engine.dialect.create_connect_args(self._engine.url)
        return make_conninfo(
            **{k: v for k, v in params.items() if k != "context" and v is not None}
        )

    async def _stop_wake(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            await listener.stop()

    async def _add_waiter(self, task_id: str, token: str, ttl_us: int) -> None:
        add = await texts.get(self, "wake.waiter_add")
        assert add is not None
        await texts.alone(self, add, {"task_id": task_id, "token": token, "ttl_us": ttl_us})

    async def _drop_waiter(self, task_id: str, token: str) -> None:
        drop = await texts.get(self, "wake.waiter_drop")
        assert drop is not None
        await texts.alone(self, drop, {"task_id": task_id, "token": token})

    async def _notify(
        self,
        conn: AsyncConnection,
        queues: Iterable[str],
        done: bool,
        task_ids: Iterable[str] = (),
    ) -> None:
        params = pg_listen.notify_params(queues, done, task_ids)
        if params is None:
            return
        # Built once (sql/wake.sql), in the style of the connection's driver.
        await texts.execute(conn, self, texts.on(self, conn)["wake.notify"], params)
