"""PostgresStore: the PostgreSQL dialect of the protocol.

What differs from SQLite, and only that:

* clock — the database's ``clock_timestamp()``, so hosts need not agree on time;
* claim locking — candidate rows are selected ``FOR UPDATE SKIP LOCKED`` so
  concurrent claimers pass each other instead of queueing;
* no probe — an idle claim takes no lock worth avoiding;
* the lock a new consumer group's backfill takes to wait out producers in flight,
  and the advisory lock that serialises migrations;
* transient errors — serialization failures (40001) and deadlocks (40P01).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, ColumnElement, Select, cast, extract, func, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from conveyor.store.base import TaskStore

TRANSIENT_SQLSTATES = frozenset({"40001", "40P01"})
MIGRATION_LOCK = 0x636F6E76  # "conv"


class PostgresStore(TaskStore):
    """conveyor on PostgreSQL (psycopg 3)."""

    def _create_engine(self) -> AsyncEngine:
        options: dict[str, Any] = {"pool_pre_ping": True, **self.engine_options}
        return create_async_engine(self.url, **options)

    def _db_now(self) -> ColumnElement[int]:
        return cast(func.floor(extract("epoch", func.clock_timestamp()) * 1_000_000), BigInteger)

    def _lock_candidates(self, stmt: Select[Any]) -> Select[Any]:
        return stmt.with_for_update(skip_locked=True)

    async def _lock_for_backfill(self, conn: AsyncConnection) -> None:
        # Producers take the stream rows (partitioned submits) and then insert tasks.
        # SHARE locks on both, in that order, wait for every producer in flight and
        # hold new ones back until the backfill commits; claims and acks are paused
        # only for the length of the backfill.
        await conn.execute(text("LOCK TABLE conveyor_streams IN SHARE MODE"))
        await conn.execute(text("LOCK TABLE conveyor_tasks IN SHARE MODE"))

    def _lock_for_migration(self, conn: Connection) -> None:
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})

    def _is_transient(self, exc: DBAPIError) -> bool:
        return getattr(exc.orig, "sqlstate", None) in TRANSIENT_SQLSTATES

    def _upsert(self, table: Any) -> Any:
        return pg_insert(table)
