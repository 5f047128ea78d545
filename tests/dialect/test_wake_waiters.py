"""Postgres: a completion is announced (NOTIFY on conveyor_done) only when a wait()
is registered for it; a wait() in another store is still woken by the
announcement, not by its polling."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

import conveyor
from _support import naps
from conveyor.store import base
from conveyor.store.postgres import listen as pg_listen

QUIET = 0.5  # seconds a listener is given to hear an announcement that must not come


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _listening(url: str) -> psycopg.AsyncConnection[Any]:
    conn = await psycopg.AsyncConnection.connect(_dsn(url), autocommit=True)
    await conn.execute(f"LISTEN {pg_listen.DONE_CHANNEL}")
    return conn


async def _heard(conn: psycopg.AsyncConnection[Any], seconds: float) -> list[str]:
    return [note.payload async for note in conn.notifies(timeout=seconds)]


async def _waiters(url: str) -> list[tuple[str, ...]]:
    async with await psycopg.AsyncConnection.connect(_dsn(url), autocommit=True) as conn:
        cur = await conn.execute("SELECT task_id, token FROM conveyor_waiters ORDER BY 1")
        return [tuple(row) for row in await cur.fetchall()]


@pytest.fixture
def url(pg_url: str, store_url: str, backend: str) -> str:
    if backend != "postgres":
        pytest.skip("Postgres announces completions by NOTIFY")
    return store_url


async def test_completions_nobody_waits_for_are_not_announced(url: str) -> None:
    listener = await _listening(url)
    try:
        async with conveyor.connect(url, listen=False) as store:
            await store.submit_many([{"name": "x", "queue": "q"} for _ in range(4)])
            claimed = await store.claim("q", worker_id="w", limit=4)
            assert len(claimed) == 4
            assert await store.ack_many(
                [{"task_id": t.id, "worker_id": "w", "attempt": t.attempt} for t in claimed[:2]]
            ) == [None, None]
            await store.succeed(claimed[2].id, worker_id="w", attempt=claimed[2].attempt)
            await store.fail(claimed[3].id, worker_id="w", error="no", retryable=False)
        assert await _heard(listener, QUIET) == []
    finally:
        await listener.close()


async def test_a_pending_wait_is_announced_its_task_only(url: str) -> None:
    listener = await _listening(url)
    try:
        async with (
            conveyor.connect(url, listen=False) as worker,
            conveyor.connect(url) as waiter,
        ):
            a, _b = await worker.submit_many([{"name": "x", "queue": "q"} for _ in range(2)])
            waiting = asyncio.create_task(waiter.wait(a.id, timeout=60))
            while not await _waiters(url):
                await asyncio.sleep(0.01)
            claimed = await worker.claim("q", worker_id="w", limit=2)
            await worker.ack_many(
                [{"task_id": t.id, "worker_id": "w", "attempt": t.attempt} for t in claimed]
            )
            done = await asyncio.wait_for(waiting, 30)
            assert done.id == a.id and done.status == "succeeded"
        assert await _heard(listener, QUIET) == [a.id]  # not b: nobody waits for it
        assert await _waiters(url) == []  # the wait() deregistered
    finally:
        await listener.close()


async def test_a_wait_in_another_store_wakes_by_notification_not_polling(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Polling grows to a minute: a prompt return can only be the announcement.
    monkeypatch.setattr(base, "POLL_CAP", 60.0)
    async with (
        conveyor.connect(url, listen=False) as worker,
        conveyor.connect(url) as waiter,
    ):
        task = await worker.submit("x", queue="q")
        waiting = asyncio.create_task(waiter.wait(task.id, timeout=120))
        while not await _waiters(url):
            await asyncio.sleep(0.01)
        # Naps of 0.05 s doubling: the one in progress 7 s in runs until 12.75 s,
        # unless the announcement ends it.
        with naps() as ended:
            await asyncio.sleep(7)
            [claimed] = await worker.claim("q", worker_id="w")
            await worker.ack_many([{"task_id": claimed.id, "worker_id": "w", "attempt": 1}])
            done = await asyncio.wait_for(waiting, 60)
        assert done.status == "succeeded"
        assert ended and ended[-1][1] is True, f"wait() polled: its naps ended {ended}"


async def test_an_expired_registration_is_cleared_by_the_next(url: str) -> None:
    async with conveyor.connect(url) as store:
        await store._add_waiter("gone", "t", -1)
        await store._add_waiter("kept", "t", 10**9)
        assert await _waiters(url) == [("kept", "t")]


async def test_a_succeed_is_announced_to_a_pending_wait_only(url: str) -> None:
    listener = await _listening(url)
    try:
        async with (
            conveyor.connect(url, listen=False) as worker,
            conveyor.connect(url) as waiter,
        ):
            a, b = await worker.submit_many([{"name": "x", "queue": "q"} for _ in range(2)])
            waiting = asyncio.create_task(waiter.wait(a.id, timeout=60))
            while not await _waiters(url):
                await asyncio.sleep(0.01)
            for task in await worker.claim("q", worker_id="w", limit=2):
                done = await worker.succeed(task.id, worker_id="w", result=task.id, attempt=1)
                assert done.status == "succeeded" and done.result == task.id
            assert (await asyncio.wait_for(waiting, 30)).result == a.id
            assert (await worker.get(b.id)).status == "succeeded"  # type: ignore[union-attr]
        assert await _heard(listener, QUIET) == [a.id]
    finally:
        await listener.close()


_WAITER_PROCESS = """
import asyncio, sys
import conveyor
from conveyor.store import base
from conveyor.store.protocol import wake
base.POLL_CAP = 60.0  # polling grows to a minute: only the announcement is prompt
ended = []
real = wake.Watch.wait
async def watched(self, timeout):
    ended.append(await real(self, timeout))
    return ended[-1]
wake.Watch.wait = watched  # how each nap of wait() ended: woken (True) or ran out
async def main():
    async with conveyor.connect(sys.argv[1]) as store:
        task = await store.wait(sys.argv[2], timeout=120)
        print(task.status, "woken" if ended[-1] else "polled", flush=True)
asyncio.run(main())
"""


async def test_a_wait_in_another_process_wakes_by_notification(url: str) -> None:
    async with conveyor.connect(url, listen=False) as worker:
        task = await worker.submit("x", queue="q")
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _WAITER_PROCESS,
            url,
            task.id,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            while not await _waiters(url):
                await asyncio.sleep(0.02)
            # Naps of 0.05 s doubling: the one in progress 7 s in runs until 12.75 s.
            await asyncio.sleep(7)
            [claimed] = await worker.claim("q", worker_id="w")
            await worker.ack_many([{"task_id": claimed.id, "worker_id": "w", "attempt": 1}])
            assert child.stdout is not None
            line = await asyncio.wait_for(child.stdout.readline(), 60)
            assert line.decode().split() == ["succeeded", "woken"]
            assert await asyncio.wait_for(child.wait(), 30) == 0
        finally:
            if child.returncode is None:
                child.kill()
                await child.wait()
