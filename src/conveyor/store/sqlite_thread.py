"""The SQLite store's connection thread: one blocking connection, one thread, and
whole transactions handed to it in arrival order.

Why: SQLite runs in the calling process, so the cost of a transaction is almost
all Python. Run statement by statement through an async driver, every statement
is a hop to the driver's thread and back plus several event-loop turns; here a
whole transaction (BEGIN, the protocol's statements, COMMIT) is one function
run on the connection's thread, one hop from the event loop and one back.

The thread's queue is the store's in-process write lock: transactions run one
at a time, first come first served, so this process's own writers never wait
on each other through SQLite's busy handler (which sleeps). ``busy_timeout``
still guards against writers in other processes, and the store retries what
stays busy.

While idle, the thread asks its connection for ``PRAGMA data_version`` every
``poll`` seconds: the value changes when another connection (another process, or
another store in this one) has committed, and never for this connection's own
commits. It reads a counter in the WAL's shared memory and takes no lock. A
change calls ``on_change`` — the store's cross-process wake-up. It looks that
often only while ``listening()`` says someone waits to be woken (every
``idle_poll`` seconds otherwise; :meth:`nudge` when a wait begins), so an idle
store nobody waits on costs next to nothing.
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

T = TypeVar("T")

#: Seconds between the WAL checkpoints the thread runs after its transactions
#: (the store's connection turns SQLite's own, per-commit checkpoint off).
CHECKPOINT_EVERY = 0.5

_Job = tuple[Callable[[Connection], Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]
#: The queue had nothing for ``poll`` seconds.
_IDLE: Any = object()


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    # The caller may have been cancelled while its transaction ran; the transaction
    # still ran to its end (commit or rollback), as one sent to a server does.
    if future.cancelled():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class ConnectionThread:
    """One SQLite connection owned by one thread; :meth:`call` runs a function on
    it, after every function handed over before (FIFO)."""

    def __init__(
        self,
        engine: Engine,
        *,
        name: str = "conveyor-sqlite",
        poll: float | None = None,
        on_change: Callable[[], None] | None = None,
        listening: Callable[[], bool] = lambda: True,
        idle_poll: float | None = None,
        checkpoint_every: float | None = None,
    ) -> None:
        self._engine = engine
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._poll = poll
        self._on_change = on_change
        self._listening = listening
        self._idle_poll = idle_poll or poll
        self._nudged = 0.0
        self._checkpoint_every = checkpoint_every
        self._closed = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    async def call(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn(connection)`` on the thread and return what it returns (or raise
        what it raises). One hop there, one back."""
        if self._closed:
            raise RuntimeError("the store's SQLite connection is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((fn, loop, future))
        return await future

    def nudge(self) -> None:
        """Look at ``data_version`` now and poll at the fast rate from now on (a
        waiter has just begun to listen)."""
        self._nudged = time.monotonic()
        self._jobs.put(_IDLE)

    def close(self) -> None:
        """Let the queued functions finish, then close the connection and end the
        thread; returns at once (:meth:`wait_closed` waits)."""
        if not self._closed:
            self._closed = True
            self._jobs.put(None)

    async def wait_closed(self, timeout: float = 5.0) -> None:
        """Wait (up to ``timeout`` seconds) until the thread has closed the
        connection, so a closed store holds no file handle and runs nothing."""
        deadline = time.monotonic() + timeout
        while self._thread.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.001)

    # ------------------------------------------------------------ the thread
    def _main(self) -> None:
        conn: Connection | None = None
        seen: Any = None
        polled = 0.0
        checkpointed = 0.0
        pending = False  # transactions ran since the last checkpoint
        try:
            while True:
                # Fast for a while after a nudge too: the waiter it announced may
                # not have registered yet when the thread first asks.
                fast = self._listening() or time.monotonic() - self._nudged < 1.0
                wait = self._poll if fast else self._idle_poll
                try:
                    job = self._jobs.get(timeout=wait) if wait else self._jobs.get()
                except queue.Empty:
                    job = _IDLE
                if self._poll and conn is not None and (fast or job is _IDLE):
                    # Also between transactions when they never stop coming, so a
                    # busy process still hears the others within about ``poll`` —
                    # but only while someone waits to hear: a busy worker that waits
                    # on nothing would pay a read per ``poll`` for no one. ``seen``
                    # is then older, so the first look after a wait begins reports
                    # a change (a spare wake-up, never a missed one).
                    moment = time.monotonic()
                    if job is _IDLE or moment - polled >= self._poll:
                        polled = moment
                        seen = self._watch(conn, seen)
                if pending and self._checkpoint_every is not None and conn is not None:
                    moment = time.monotonic()
                    if moment - checkpointed >= self._checkpoint_every:
                        checkpointed, pending = moment, False
                        _checkpoint(conn)
                if job is _IDLE:
                    continue
                if job is None:
                    return
                fn, loop, future = job
                if future.cancelled():
                    # Its caller gave up while it queued: nothing of it has run, and
                    # nothing will (a cancelled claim leases nothing).
                    continue
                try:
                    if conn is None or conn.invalidated:
                        if conn is not None:
                            conn.close()
                        conn = self._engine.connect()
                    pending = True
                    result: tuple[bool, Any] = (True, fn(conn))
                except BaseException as exc:  # handed to the caller, whatever it is
                    result = (False, exc)
                try:
                    loop.call_soon_threadsafe(_settle, future, *result)
                except RuntimeError:  # the caller's loop is closed: nobody waits
                    pass
        finally:
            if conn is not None:
                try:
                    conn.close()
                except SQLAlchemyError:  # pragma: no cover - closing a broken connection
                    pass
            self._engine.dispose()

    def _watch(self, conn: Connection, seen: Any) -> Any:
        """Read ``data_version``; call ``on_change`` when it moved since ``seen``.

        On the driver connection itself: through SQLAlchemy the read would begin a
        transaction (``BEGIN IMMEDIATE``, the write lock), which a poll must not take.
        """
        try:
            raw: Any = conn.connection.driver_connection
            now = raw.execute("PRAGMA data_version").fetchone()[0]
        except (sqlite3.Error, SQLAlchemyError):
            # A busy or broken connection: the next transaction reports it; the
            # waiters still poll on their own.
            return seen
        if seen is not None and now != seen and self._on_change is not None:
            self._on_change()
        return now


def _checkpoint(conn: Connection) -> None:
    """Copy what the WAL holds into the database, as far as readers allow, without
    waiting for anyone (``PASSIVE``), on the driver connection outside any
    transaction.

    Why not SQLite's automatic checkpoint: it runs in whichever commit finds the
    WAL over 1,000 pages. When several processes keep the file busy, some reader
    always holds the WAL's start, so the checkpoint never lets the WAL restart;
    it stays over the threshold and every commit of every process runs another
    checkpoint (a copy and two fsyncs). On a timer each process pays for one
    every :data:`CHECKPOINT_EVERY` seconds at most."""
    try:
        raw: Any = conn.connection.driver_connection
        raw.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    except (sqlite3.Error, SQLAlchemyError):
        pass  # busy or broken: the next one tries again; the WAL only grows meanwhile
