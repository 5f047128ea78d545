"""Postgres wake-ups: NOTIFY inside committing transactions, one LISTEN connection per store.

Two channels, both scoped to the database (not the server):

* ``conveyor_work`` — payload: a queue name. Sent when tasks become claimable
  (submit, retry, a retryable failure, a release, a recovered lease).
* ``conveyor_done`` — payload: a task id, or the empty string for "some tasks
  finished, look again". Sent when tasks become terminal, and only for tasks a
  ``wait()`` has registered for in ``conveyor_waiters`` (the empty payload: when
  any ``wait()`` is registered), so completions nobody waits for cost no NOTIFY.

``pg_notify`` runs inside the transaction that makes the change, so a listener
hears it only after the change commits, and never for a rolled-back one.

A submit announces its queues only when some listener can hear it. Every listener
holds a shared advisory lock (:data:`LISTENING_LOCK`) on its connection while it
listens; the one-statement submit tries that lock exclusively for its own
transaction (:data:`NOBODY_LISTENS`), and sends no ``NOTIFY`` when it gets it
(nobody holds it shared: nobody listens). A ``NOTIFY`` nobody hears still costs its
commit a cluster-wide lock and a write to the notification queue (~10 % of a
one-task submit). No wake-up is lost by it: a listener that starts meanwhile waits
for that submit's commit before it takes the lock, and its waiters look at the
database only after that. A submit that finds the lock held (a listener, or
another submit holding it for a moment) announces as always.

The listening side is a :class:`Listener`: its own psycopg ``AsyncConnection`` in
autocommit mode, outside the SQLAlchemy pool (a pooled connection would carry the
LISTEN to whoever borrowed it next). Notifications are an accelerator only: every
waiter also polls, so the listener may be late, down or off without harming
correctness. After a drop it reconnects with exponential backoff, and so it does
when it reached a hot standby (a primary demoted by a failover, a URL whose first
server is a replica): a standby may be promoted, and a multi-host URL may reach the
new primary next time. If the server refuses LISTEN outright otherwise (a
transaction-mode pooler) it turns itself off for good and logs once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import psycopg

log = logging.getLogger("conveyor.listen")

WORK_CHANNEL = "conveyor_work"
DONE_CHANNEL = "conveyor_done"
APPLICATION_NAME = "conveyor-listener"
RETRY_FIRST = 0.1  # seconds before the first reconnect; doubles up to RETRY_MAX
# Kept short: while the listener is down every waiter falls back to its poll, and a
# failed connect attempt every 2 s costs the server nothing worth saving (with
# 30 s, the listener came back ~10 s after a 5 s restart).
RETRY_MAX = 2.0
IDLE_CHECK = 30.0  # a quiet connection is probed this often: a dead peer sends no error
PROBE_TIMEOUT = 10.0
# Kernel keepalives close a connection whose peer vanished without a FIN (a pulled
# cable, a NAT that forgot us); the caller's conninfo may override them.
KEEPALIVES: Mapping[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}

#: The advisory lock a listener holds shared while it listens, in its database
#: (postgres.py's MIGRATION_LOCK + 2).
LISTENING_LOCK = 0x636F6E76 + 2
#: True when nobody listens: the exclusive try of :data:`LISTENING_LOCK`, held by
#: the trying transaction until it ends (so a listener starting meanwhile waits for
#: its commit). Read once per statement (a CTE of its own).
NOBODY_LISTENS = f"pg_try_advisory_xact_lock({LISTENING_LOCK})"

#: SQLSTATE of a hot standby's refusal of LISTEN ("cannot execute LISTEN during
#: recovery").
READ_ONLY = "25006"

State = Literal["idle", "listening", "down", "off", "stopped"]


def notify_params(
    queues: Iterable[str], done: bool, task_ids: Iterable[str]
) -> dict[str, list[str]] | None:
    """Bind parameters of :data:`NOTIFY` for one announcement; ``None`` if empty.

    One statement sends every notification of the transaction. Postgres folds
    identical notifications of one transaction into one.
    """
    if done:
        ids = sorted(set(task_ids)) or [""]
        return {"channels": [DONE_CHANNEL] * len(ids), "payloads": ids}
    names = sorted(set(queues))
    if not names:
        return None
    return {"channels": [WORK_CHANNEL] * len(names), "payloads": names}


class Listener:
    """One LISTEN connection, kept alive in a background task.

    ``on_work(queue)`` and ``on_done(task_id or None)`` are called, on the event
    loop, for each notification; ``on_reset()`` after a reconnect, because
    announcements made while the connection was down are lost and every waiter
    should look again.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        on_work: Callable[[str], None],
        on_done: Callable[[str | None], None],
        on_reset: Callable[[], None],
        connect_kwargs: Mapping[str, Any] | None = None,
        channels: Sequence[str] = (WORK_CHANNEL, DONE_CHANNEL),
    ) -> None:
        self._conninfo = conninfo
        self._channels = tuple(channels)
        self._kwargs: dict[str, Any] = {
            **KEEPALIVES,
            "application_name": APPLICATION_NAME,
            **(connect_kwargs or {}),
        }
        self._on_work = on_work
        self._on_done = on_done
        self._on_reset = on_reset
        self._task: asyncio.Task[None] | None = None
        self._tried = asyncio.Event()
        #: ``listening`` while notifications flow; ``off`` once LISTEN was refused.
        self.state: State = "idle"
        #: The server process id of the LISTEN connection while it is up.
        self.backend_pid: int | None = None
        #: How many times the connection was re-established after a drop.
        self.reconnects = 0

    @property
    def listening(self) -> bool:
        """True while notifications can arrive."""
        return self.state == "listening"

    async def start(self, wait: float) -> None:
        """Start listening in the background; give the first attempt up to ``wait``
        seconds, so waiters of a freshly opened store already hear announcements."""
        if self._task is not None:
            return
        self._task = asyncio.create_task(self._run(), name="conveyor-listener")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._tried.wait(), wait)

    async def stop(self) -> None:
        """Stop listening and close the connection."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.state = "stopped"

    async def _run(self) -> None:
        delay = RETRY_FIRST
        connected_before = False
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._conninfo, autocommit=True, **self._kwargs
                )
            except (psycopg.Error, OSError) as exc:
                self._down(f"cannot connect: {exc}", delay)
                await asyncio.sleep(delay * (0.5 + random.random() / 2))
                delay = min(delay * 2, RETRY_MAX)
                continue
            try:
                # Say that someone listens (see NOBODY_LISTENS), before listening:
                # it waits for the submits that found nobody listening to commit,
                # so what they wrote is there for the waiters' first look, which
                # comes once this is listening. An error here is not a refusal of
                # LISTEN: reconnect and try again.
                await conn.execute(f"SELECT pg_advisory_lock_shared({LISTENING_LOCK})")
                try:
                    for channel in self._channels:  # constants, never user input
                        await conn.execute(f"LISTEN {channel}")
                except psycopg.Error as exc:
                    if isinstance(exc, psycopg.OperationalError) or conn.closed:
                        raise
                    if exc.sqlstate == READ_ONLY:
                        # A hot standby: one a failover demoted, or that the URL
                        # reached before the primary. Not for good: a standby may be
                        # promoted, and the next connect may find the primary.
                        raise ConnectionError(f"reached a standby ({exc})") from exc
                    # Deterministic refusal: retrying cannot help. Waiters poll.
                    log.warning(
                        "the server refused LISTEN (%s): wake-ups are off, workers poll", exc
                    )
                    self.state = "off"
                    self._tried.set()
                    return
                self.state = "listening"
                self.backend_pid = conn.info.backend_pid
                self._tried.set()
                delay = RETRY_FIRST
                if connected_before:
                    self.reconnects += 1
                    log.info("listening again (pid %s)", self.backend_pid)
                    self._on_reset()
                connected_before = True
                await self._pump(conn)
            except (psycopg.Error, OSError, TimeoutError) as exc:
                self._down(f"connection lost: {exc}", delay)
            finally:
                self.backend_pid = None
                with contextlib.suppress(psycopg.Error, OSError):
                    await conn.close()
            await asyncio.sleep(delay * (0.5 + random.random() / 2))
            delay = min(delay * 2, RETRY_MAX)

    def _down(self, why: str, delay: float) -> None:
        if self.state != "down":
            log.warning("wake-up listener %s; polling meanwhile, retrying", why)
        else:
            log.debug("wake-up listener %s; retrying in %.1f s", why, delay)
        self.state = "down"
        self._tried.set()

    async def _pump(self, conn: psycopg.AsyncConnection[Any]) -> None:
        while True:
            async for note in conn.notifies(timeout=IDLE_CHECK):
                if note.channel == WORK_CHANNEL:
                    self._on_work(note.payload)
                elif note.channel == DONE_CHANNEL:
                    self._on_done(note.payload or None)
            # Quiet for a while: make sure the peer is still there.
            async with asyncio.timeout(PROBE_TIMEOUT):
                await conn.execute("SELECT 1")
