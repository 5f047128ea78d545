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

The inline fast path: a short write transaction (a submit) that finds the thread
idle — nothing queued, nothing running — runs on the caller's own thread, on
the same connection, skipping the hop there and back (most of what a submit cost:
two thread wake-ups, a future, the event loop's self-pipe). A lock shared with
the thread makes one user at a time: the thread holds it while it runs a job,
checkpoints or reads ``data_version``; the caller only ever *tries* it. Why this
stays fair and bounded:

* FIFO — a call counts itself before it queues and the thread uncounts it once
  it has run, so a caller goes inline only when the count is zero: it never
  jumps ahead of work handed over before it. The thread also says when it waits
  for the lock for its own upkeep, and the inline path then steps aside (a lock
  taken back to back by the event loop would otherwise starve the checkpoint);
* the event loop never waits for anyone: the lock is tried without blocking, and
  the write lock (``BEGIN IMMEDIATE``) is asked for exactly once, with no busy
  wait (the store's connection has no busy handler). Held by another process,
  nothing has run: the call queues on the thread as before, whose retry is fair;
* cancellation: an inline transaction never suspends, so it runs to its end like
  a queued one that was already running; the queued path is unchanged;
* the caller yields to the event loop once afterwards, as the hop did, so a loop
  of inline submits does not starve the other coroutines of its loop.

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
from typing import Any, TypeVar, cast

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

T = TypeVar("T")

#: Seconds between the WAL checkpoints the thread runs after its transactions
#: (the store's connection turns SQLite's own, per-commit checkpoint off).
CHECKPOINT_EVERY = 0.5

_Job = tuple[Callable[[Connection], Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]
#: The queue had nothing for ``poll`` seconds.
_IDLE: Any = object()
#: An inline attempt that did not run (the call queues instead).
_NOT_RUN: Any = object()


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
        inline: bool = True,
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
        #: One user of the connection at a time: the thread (a job, a checkpoint, a
        #: data_version read) or an inline transaction on a caller's thread.
        self._lock = threading.Lock()
        #: Calls handed over and not yet run to their end (changed under _count).
        self._waiting = 0
        self._count = threading.Lock()
        #: The thread waits for the lock for its own upkeep: inline calls step aside.
        self._upkeep = False
        #: The connection, once the thread has opened it (read under _lock).
        self._conn: Connection | None = None
        #: Transactions ran since the last checkpoint.
        self._pending = False
        #: Whether calls that ask may run inline (off once the connection refused use
        #: from another thread, or when the store says not to).
        self.inline = inline
        #: Set while an inline transaction holds the lock: its BEGIN IMMEDIATE was
        #: sent already (tried once), so the engine's begin hook must not send another.
        self.begun = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    async def call(self, fn: Callable[[Connection], T], *, inline: bool = False) -> T:
        """Run ``fn(connection)`` on the thread and return what it returns (or raise
        what it raises). One hop there, one back.

        ``inline``: ``fn`` is a short write transaction (it begins with
        ``BEGIN IMMEDIATE``), which runs on the caller's thread instead when the
        connection thread is idle and the write lock is free at the first ask."""
        if self._closed:
            raise RuntimeError("the store's SQLite connection is closed")
        if inline and self.inline and not self._waiting and not self._upkeep:
            result = self._run_inline(fn)
            if result is not _NOT_RUN:
                # The turn of the event loop the hop gave the other coroutines.
                await asyncio.sleep(0)
                return cast(T, result)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._count:
            self._waiting += 1
        self._jobs.put((fn, loop, future))
        return await future

    def _run_inline(self, fn: Callable[[Connection], T]) -> T | Any:
        """``fn(connection)`` on the calling thread if the thread is idle and the
        write lock free at once; :data:`_NOT_RUN` (nothing ran) otherwise."""
        if not self._lock.acquire(blocking=False):
            return _NOT_RUN
        try:
            conn = self._conn
            # Under the lock: nothing handed over before this call is still waiting.
            if self._waiting or self._upkeep or conn is None or conn.invalidated:
                return _NOT_RUN
            raw: Any = conn.connection.driver_connection
            try:
                # Once, no busy wait (a file store's connection has no busy handler;
                # a private in-memory database has no other writer): the event loop
                # must not wait for another process's writer.
                raw.execute("BEGIN IMMEDIATE")
            except sqlite3.ProgrammingError:
                # A connection made without check_same_thread=False (a creator of
                # the caller's): this thread may not use it; the thread always may.
                self.inline = False
                return _NOT_RUN
            except sqlite3.Error:
                # Busy (another process writes), or anything else, which the queued
                # path meets and reports with its retries.
                return _NOT_RUN
            self._pending = True
            self.begun = True
            try:
                return fn(conn)
            finally:
                self.begun = False
                if raw.in_transaction:  # fn failed before its own transaction began
                    raw.rollback()
        finally:
            self._lock.release()

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
        seen: Any = None
        polled = 0.0
        checkpointed = 0.0
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
                if job is None:
                    return
                moment = time.monotonic()
                conn = self._conn
                # Also between transactions when they never stop coming, so a busy
                # process still hears the others within about ``poll`` — but only
                # while someone waits to hear: a busy worker that waits on nothing
                # would pay a read per ``poll`` for no one. ``seen`` is then older,
                # so the first look after a wait begins reports a change (a spare
                # wake-up, never a missed one).
                poll = self._poll or 0.0
                watch = (
                    poll > 0
                    and conn is not None
                    and (fast or job is _IDLE)
                    and (job is _IDLE or moment - polled >= poll)
                )
                checkpoint = (
                    self._pending
                    and self._checkpoint_every is not None
                    and conn is not None
                    and moment - checkpointed >= self._checkpoint_every
                )
                if job is _IDLE and not (watch or checkpoint):
                    continue
                if job is _IDLE:
                    # Upkeep only: inline calls step aside until it has run, or
                    # back-to-back inline submits would always win the lock.
                    self._upkeep = True
                outcome = None
                with self._lock:
                    self._upkeep = False
                    if watch and conn is not None:
                        polled = moment
                        seen = self._watch(conn, seen)
                    if checkpoint and conn is not None:
                        checkpointed, self._pending = moment, False
                        _checkpoint(conn)
                    if job is not _IDLE:
                        outcome = self._run_job(job)
                if outcome is not None:
                    # After the lock is free again, for the same reason.
                    _fn, loop, future = job
                    try:
                        loop.call_soon_threadsafe(_settle, future, *outcome)
                    except RuntimeError:  # the caller's loop is closed: nobody waits
                        pass
        finally:
            with self._lock:
                conn, self._conn = self._conn, None
                if conn is not None:
                    try:
                        conn.close()
                    except SQLAlchemyError:  # pragma: no cover - closing a broken connection
                        pass
            self._engine.dispose()

    def _run_job(self, job: _Job) -> tuple[bool, Any] | None:
        """Run one handed-over call (under the lock); its outcome, or ``None`` if
        its caller gave up while it queued."""
        fn, _loop, future = job
        try:
            if future.cancelled():
                # Its caller gave up while it queued: nothing of it has run, and
                # nothing will (a cancelled claim leases nothing).
                return None
            try:
                conn = self._conn
                if conn is None or conn.invalidated:
                    if conn is not None:
                        conn.close()
                    conn = self._conn = self._engine.connect()
                self._pending = True
                return (True, fn(conn))
            except BaseException as exc:  # handed to the caller, whatever it is
                return (False, exc)
        finally:
            # Before the caller hears of it: a caller that goes on to submit finds
            # the thread idle.
            with self._count:
                self._waiting -= 1

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
