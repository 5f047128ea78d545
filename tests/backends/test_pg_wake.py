"""Postgres wake-ups: NOTIFY from one store reaches the LISTEN connection of another.

Every test uses two stores on one database — as two processes would — so an
in-process wake-up cannot be what wakes the waiter; and each uses its own queue
names, so tests sharing the session's database do not disturb each other.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest
from sqlalchemy.engine import make_url

import conveyor
from _support import idle_waits, naps, scratch_pg_database
from conveyor import Status
from conveyor.store import base
from conveyor.store.postgres import PostgresStore
from conveyor.store.postgres import listen as pg_listen
from conveyor.store.protocol import wake
from conveyor.worker import Context


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture
def queue() -> str:
    return f"wake-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def waiter(pg_url: str) -> AsyncIterator[PostgresStore]:
    """The store whose listener is under test, listening (as after its first claim
    or wait)."""
    async with conveyor.connect(pg_url) as st:
        assert isinstance(st, PostgresStore)
        await wake.listen(st)
        yield st


@pytest.fixture
async def other(pg_url: str) -> AsyncIterator[PostgresStore]:
    """Another store, standing in for another process; it does not listen."""
    async with conveyor.connect(pg_url, listen=False) as st:
        assert isinstance(st, PostgresStore)
        yield st


async def test_a_store_listens_from_its_first_claim_or_wait_only(
    pg_url: str, other: PostgresStore, queue: str
) -> None:
    # A producer never listens: its own announcements would only wake itself.
    async with conveyor.connect(pg_url) as producer:
        assert isinstance(producer, PostgresStore)
        await producer.submit_many([{"name": "x", "queue": queue}] * 2)
        await producer.submit("x", queue=queue)
        assert producer._listener is None
    for first in ("claim", "wait_for_work", "wait"):
        async with conveyor.connect(pg_url) as st:
            assert isinstance(st, PostgresStore)
            assert st._listener is None
            if first == "claim":
                await st.claim(f"{queue}-idle", worker_id="w")
            elif first == "wait_for_work":
                await st.wait_for_work([f"{queue}-idle"], 0.01)
            else:
                task = await other.submit("x", queue=f"{queue}-idle")
                with pytest.raises(TimeoutError):
                    await st.wait(task.id, timeout=0.01)
            # Listening before it first looked: the look itself came after the start.
            assert st._listener is not None and st._listener.listening, first
        assert st._listener is None  # closed with the store


async def test_a_notification_wakes_an_idle_waiter_of_that_queue_only(
    waiter: PostgresStore, other: PostgresStore, queue: str
) -> None:
    assert waiter._listener is not None and waiter._listener.listening
    assert other._listener is None
    # Another queue's work does not wake us.
    sleeper = asyncio.create_task(waiter.wait_for_work([queue], 0.6))
    await asyncio.sleep(0.1)
    await other.submit("x", queue=f"{queue}-elsewhere")
    assert await sleeper is False
    # Our queue's does: True is the notification (a missed one would sleep out the
    # minute and say False; the outer timeout only guards against a hang).
    sleeper = asyncio.create_task(waiter.wait_for_work([queue, "unrelated"], 60))
    await asyncio.sleep(0.1)
    await other.submit("x", queue=queue)
    assert await asyncio.wait_for(sleeper, 90) is True


async def test_a_notification_that_lands_before_the_wait_is_not_lost(
    waiter: PostgresStore, other: PostgresStore, queue: str
) -> None:
    # The worker's window between an empty claim and its sleep.
    assert await waiter.claim(queue, worker_id="w") == []
    await other.submit("x", queue=queue)
    await asyncio.sleep(0.3)  # the notification arrives while nobody waits
    # Remembered: True (after the 60 s timeout it would say False).
    assert await waiter.wait_for_work([queue], 60) is True


async def test_worker_picks_up_work_well_under_its_poll_interval(
    pg_url: str, other: PostgresStore, queue: str
) -> None:
    app = conveyor.App(pg_url)

    @app.task(queue=queue)
    async def ping(ctx: Context) -> str:
        return "pong"

    # A worker that only polled would have its idle waits run out the poll interval:
    # none may (the waits' timeouts, longer than it, only guard against a hang).
    poll = 20.0
    worker = app.worker(queue, poll_interval=poll)
    with idle_waits(app.store) as waits:
        job = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(waits.idle.wait(), 30)  # idle: next poll `poll` s away
            for _ in range(3):
                task = await other.submit(ping.name, queue=queue)
                done = await other.wait(task.id, timeout=3 * poll)
                assert done.status is Status.SUCCEEDED and done.result == "pong"
        finally:
            worker.stop()
            await asyncio.wait_for(job, 10)
            await app.close()
    assert waits and False not in waits, f"the worker polled: idle waits ended {waits}"


async def test_wait_returns_promptly_on_a_completion_by_another_store(
    waiter: PostgresStore, other: PostgresStore, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = await other.submit("x", queue=queue)
    [claimed] = await other.claim(queue, worker_id="w")
    assert waiter._done_waker is not None
    # wait()'s naps grow to a minute: the one in progress when the task finishes
    # (3.15 s to 6.35 s in) can only end early by the announcement.
    monkeypatch.setattr(base, "POLL_CAP", 60.0)
    # The notification itself reaches a waiter on that task id.
    with waiter._done_waker.watch([task.id]) as watch, naps() as ended:
        await other.progress(task.id, worker_id="w", progress=0.5)  # not terminal: silent
        assert await watch.wait(0.3) is False
        waiting = asyncio.create_task(waiter.wait(task.id, timeout=60))
        await asyncio.sleep(4)
        await other.succeed(task.id, worker_id="w", attempt=claimed.attempt, result=1)
        assert await watch.wait(2) is True
        done = await asyncio.wait_for(waiting, 60)
    assert done.status is Status.SUCCEEDED
    of_wait = [woken for nap, woken in ended if nap is not watch]
    assert of_wait and of_wait[-1] is True, f"wait() polled: its naps ended {of_wait}"


async def test_listener_reconnects_after_its_backend_is_terminated(
    waiter: PostgresStore, other: PostgresStore, pg_url: str, queue: str
) -> None:
    listener = waiter._listener
    assert listener is not None and listener.listening
    old_pid = listener.backend_pid
    with psycopg.connect(_dsn(pg_url), autocommit=True) as admin:
        row = admin.execute(
            "SELECT pid, query FROM pg_stat_activity WHERE pid = %s AND application_name = %s",
            (old_pid, pg_listen.APPLICATION_NAME),
        ).fetchone()
        assert row is not None and row[1].upper().startswith("LISTEN")
        admin.execute("SELECT pg_terminate_backend(%s)", (old_pid,))
    deadline = time.monotonic() + 10
    while not (listener.listening and listener.backend_pid not in (None, old_pid)):
        assert time.monotonic() < deadline, "the listener did not come back"
        await asyncio.sleep(0.05)
    assert listener.reconnects == 1
    sleeper = asyncio.create_task(waiter.wait_for_work([queue], 5))
    await asyncio.sleep(0.1)
    await other.submit("x", queue=queue)
    assert await asyncio.wait_for(sleeper, 2) is True


async def test_a_refused_listen_turns_the_listener_off_for_good(pg_url: str) -> None:
    woken: list[str | None] = []
    # A LISTEN the server rejects deterministically, as a transaction-mode pooler would.
    listener = pg_listen.Listener(
        _dsn(pg_url),
        on_work=woken.append,
        on_done=woken.append,
        on_reset=lambda: None,
        channels=["not a channel"],
    )
    await listener.start(wait=5)
    try:
        assert listener.state == "off" and not listener.listening
        await asyncio.sleep(0.3)
        assert listener.state == "off" and listener.reconnects == 0
    finally:
        await listener.stop()


async def test_an_unreachable_server_means_polling_not_failure(pg_url: str, queue: str) -> None:
    listener = pg_listen.Listener(
        _dsn(make_url(pg_url).set(port=1).render_as_string(hide_password=False)),
        on_work=lambda q: None,
        on_done=lambda t: None,
        on_reset=lambda: None,
    )
    await listener.start(wait=2)
    try:
        assert listener.state == "down"
    finally:
        await listener.stop()
    # And a store without a listener still serves waiters by polling.
    async with conveyor.connect(pg_url, listen=False) as lonely:
        assert await lonely.wait_for_work([queue], 0.2) is False
        task = await lonely.submit("x", queue=queue)
        [claimed] = await lonely.claim(queue, worker_id="w")
        await lonely.succeed(task.id, worker_id="w", attempt=claimed.attempt)
        assert (await lonely.wait(task.id, timeout=2)).status is Status.SUCCEEDED


async def _heard(raw: psycopg.AsyncConnection[object], wait: float = 0.4) -> list[str]:
    """The work announcements ``raw`` (a bare LISTEN connection) received."""
    return [n.payload async for n in raw.notifies(timeout=wait)]


async def _until_nobody_holds_the_listening_lock(
    conn: psycopg.AsyncConnection[object], timeout: float = 10.0
) -> None:
    key = pg_listen.LISTENING_LOCK
    deadline = time.monotonic() + timeout
    while True:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            [key & 0xFFFFFFFF],
        )
        row = await cur.fetchone()
        if row is not None and row[0] == 0:
            return
        assert time.monotonic() < deadline, "a closed store's listener still holds its lock"
        await asyncio.sleep(0.05)


async def test_a_submit_announces_its_queue_only_when_someone_listens(pg_url: str) -> None:
    # A database of its own: nobody else's listener may hold the lock here.
    with scratch_pg_database("conveyor_wake") as url:
        async with (
            conveyor.connect(url, listen=False) as producer,
            await psycopg.AsyncConnection.connect(_dsn(url), autocommit=True) as raw,
        ):
            # A bare LISTEN (not a conveyor listener) observes what is sent.
            await raw.execute(f"LISTEN {pg_listen.WORK_CHANNEL}")
            await producer.submit("x", queue="alone")
            await producer.submit_many([{"name": "x", "queue": "alone"}] * 3)
            assert await _heard(raw) == []  # nobody could be woken: no NOTIFY
            async with conveyor.connect(url) as waiter:
                assert isinstance(waiter, PostgresStore)
                await wake.listen(waiter)
                await producer.submit("x", queue="heard")
                await producer.submit_many([{"name": "x", "queue": "heard-too"}] * 3)
                assert await _heard(raw) == ["heard", "heard-too"]
            # The listener closed with its store; its server session ends (and lets
            # go of the lock) a moment later, not within the close.
            await _until_nobody_holds_the_listening_lock(raw)
            await producer.submit("x", queue="alone")
            assert await _heard(raw) == []


async def test_a_listener_starting_during_a_silent_submit_waits_for_its_commit(
    pg_url: str,
) -> None:
    with scratch_pg_database("conveyor_wake") as url:
        async with (
            conveyor.connect(url) as waiter,
            await psycopg.AsyncConnection.connect(_dsn(url)) as submitter,
        ):
            assert isinstance(waiter, PostgresStore)
            # A submit in flight that found nobody listening (and so sends nothing).
            async with submitter.transaction():
                got = await submitter.execute(f"SELECT {pg_listen.NOBODY_LISTENS}")
                assert (await got.fetchone()) == (True,)
                starting = asyncio.create_task(wake.listen(waiter))
                await asyncio.sleep(0.5)
                # Not listening yet: its waiters' first look must come after the
                # commit, so they see what the silent submit wrote.
                assert waiter._listener is not None and not waiter._listener.listening
            await starting
            for _ in range(50):
                if waiter._listener.listening:
                    break
                await asyncio.sleep(0.05)
            assert waiter._listener.listening
