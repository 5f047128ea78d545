"""How the SQLite store's connections are made and begun: which URLs name a
private in-memory database, the blocking engine of the connection thread, the
pragmas every connection gets, and the choice of ``BEGIN`` (``IMMEDIATE`` for
writes, waited for fairly on the store's own connection)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine, create_engine, make_url
from sqlalchemy.pool import StaticPool

SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
#: Seconds between a write transaction's first two asks for the write lock while
#: another connection holds it; the pause doubles up to LAST_PAUSE.
FIRST_PAUSE = 0.0001
LAST_PAUSE = 0.001
#: Pool settings that mean nothing to the one blocking connection.
_POOL_OPTIONS = (
    "poolclass",
    "pool_size",
    "max_overflow",
    "pool_timeout",
    "pool_recycle",
    "pool_pre_ping",
    "pool_reset_on_return",
    "pool_use_lifo",
)


def is_memory(url: str) -> bool:
    """Whether ``url`` names a private in-memory database rather than a file."""
    parsed = make_url(url)
    database = parsed.database or ""
    return (
        database in ("", ":memory:")
        or database.startswith("file::memory:")
        or parsed.query.get("mode") == "memory"
    )


def blocking_engine(url: str, options: Mapping[str, Any]) -> Engine:
    """The engine of the store's connection thread: one blocking sqlite3
    connection for ``url``, with the engine ``options`` that apply to it."""
    blocking_options = {k: val for k, val in options.items() if k not in _POOL_OPTIONS}
    # The connection is the thread's, but a short write may run on the event
    # loop's thread instead while the thread is idle (the inline fast path of
    # ConnectionThread.call); its lock makes one user at a time, so the driver's
    # same-thread check has nothing left to guard.
    blocking_options["connect_args"] = {
        "check_same_thread": False,
        **blocking_options.get("connect_args", {}),
    }
    return create_engine(
        make_url(url).set(drivername="sqlite+pysqlite"),
        poolclass=StaticPool,
        **blocking_options,
    )


def begin_fairly(conn: Connection, sql: str, timeout: float) -> None:
    """Run ``sql`` (a BEGIN that takes the write lock), asking again while another
    connection holds the lock — after 0.1 ms, then twice as long each time up to a
    millisecond — for up to ``timeout`` seconds.

    A waiter that asks this often finds the lock in the short gaps between another
    process's transactions, so two busy processes on one file take turns. The first
    pauses are short because most transactions are: several processes writing one
    file (a worker per consumer group) hand the lock over within a fraction of a
    millisecond instead of leaving it free for up to one (SQLite's busy handler
    sleeps in whole milliseconds, so the connection asks with none, see
    :func:`configure`).
    """
    raw: Any = conn.connection.driver_connection
    deadline = time.monotonic() + timeout
    pause = FIRST_PAUSE
    while time.monotonic() < deadline:
        try:
            raw.execute(sql)
            return
        except sqlite3.OperationalError as exc:
            message = str(exc).lower()
            if "locked" not in message and "busy" not in message:
                break  # reported below, the way SQLAlchemy reports it
        time.sleep(pause)
        pause = min(pause * 2, LAST_PAUSE)
    # Last try through SQLAlchemy, which raises its own error if it fails too.
    conn.exec_driver_sql(sql)


#: What sqlite3 reports when a function of ours raises (its message is lost).
FUNCTION_RAISED = "user-defined function raised exception"


def refuse_capped(queue: object) -> int:
    # A submit statement met a queue with a max_depth: the statement fails and
    # writes nothing, and the store submits step by step
    # (conveyor.store.protocol.depth).
    raise RuntimeError(f"queue {queue!r} has a max_depth")


def register_functions(dbapi_conn: Any) -> None:
    """The SQL functions conveyor's statements call, on a sqlite3 connection:
    ``conveyor_capped(queue)``, which raises (Postgres has it from the schema)."""
    dbapi_conn.create_function("conveyor_capped", 1, refuse_capped)


def configure(
    engine: Engine,
    *,
    busy_timeout: float,
    synchronous: str,
    fair: bool = False,
    begun: Callable[[], bool] | None = None,
) -> None:
    """Attach the connection set-up and the choice of BEGIN to ``engine``.

    ``fair``: wait for the write lock by asking again after short pauses (see
    :func:`begin_fairly`) instead of in SQLite's busy handler. ``begun``: on the
    engine of the store's connection thread, whether its inline fast path has
    sent its own ``BEGIN IMMEDIATE`` (asked once) before the transaction begins.
    """
    # SQLite's own busy handler backs off to 100 ms sleeps, so a process waiting
    # in it almost never finds the lock free between the transactions of a
    # process that writes back to back, and starves. The fair engine has no
    # handler: a busy BEGIN fails at once and is asked again after a pause
    # (0.1 ms, doubling to 1 ms) until busy_timeout; anything else that meets a
    # busy lock fails the transaction, which the store retries as transient.
    busy_ms = int(busy_timeout * 1000)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control from the driver so BEGIN is ours to choose.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {busy_ms}")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute(f"PRAGMA synchronous = {synchronous}")
        cur.execute("PRAGMA foreign_keys = ON")
        # The dependency release trigger (revision 0017) cancels a failed parent's
        # children by an update that fires it again for their own children: the
        # cascade needs triggers to fire from triggers.
        cur.execute("PRAGMA recursive_triggers = ON")
        # The ephemeral tables a statement builds (an UPDATE … FROM's rows, a
        # DISTINCT, a materialized CTE: a batch's worth) in memory: backed by a
        # temporary file instead, each such statement of an acknowledgement
        # cost as much again as its writes.
        cur.execute("PRAGMA temp_store = MEMORY")
        register_functions(dbapi_conn)
        if fair:
            # The store's own connection checkpoints on a timer instead of in
            # whichever commit finds the WAL long (see thread._checkpoint).
            cur.execute("PRAGMA wal_autocheckpoint = 0")
            # After the set-up, which may wait long (journal_mode on a new file).
            cur.execute("PRAGMA busy_timeout = 0")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if begun is not None and begun():
            return  # begun already, by the inline path (ConnectionThread.call)
        write = conn.get_execution_options().get("conveyor_write", True)
        sql = "BEGIN IMMEDIATE" if write else "BEGIN"
        if fair and write:
            begin_fairly(conn, sql, busy_timeout)
        else:
            conn.exec_driver_sql(sql)


__all__ = [
    "FUNCTION_RAISED",
    "SYNCHRONOUS",
    "begin_fairly",
    "blocking_engine",
    "configure",
    "is_memory",
    "refuse_capped",
    "register_functions",
]
