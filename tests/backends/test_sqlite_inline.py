"""SQLite: the inline fast path of the store's connection thread. A short write
(a submit) that finds the thread idle runs on the event loop's thread; queued
work, another process's writer or the thread's own upkeep send it to the thread."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncConnection

import conveyor
from conveyor.store.sqlite import thread as sqlite_thread

#: Of several submits to an idle store, how many must go inline: the thread
#: takes the lock now and then for its own upkeep (a data_version read every
#: 0.1 s, a checkpoint every 0.5 s), and a submit that meets it queues instead.
MOSTLY = 0.7


def _commits(st: Any) -> list[int]:
    """The thread each later transaction of the store commits on, in order."""
    seen: list[int] = []
    thread = st._thread
    assert thread is not None
    event.listen(thread._engine, "commit", lambda _conn: seen.append(threading.get_ident()))
    return seen


async def _ticker(ticks: list[None], stop: asyncio.Event) -> None:
    """Count the times the event loop ran this coroutine, until ``stop``."""
    while not stop.is_set():
        await asyncio.sleep(0.001)
        ticks.append(None)


async def test_an_idle_store_submits_on_the_callers_thread(tmp_path: Path) -> None:
    """Nothing queued: a submit and a small batch commit on the event loop's
    thread, and the tasks are there."""
    async with conveyor.connect(f"sqlite:///{tmp_path / 'q.db'}") as st:
        await st.submit("warm", {}, queue="q")
        commits = _commits(st)
        ones = [await st.submit("t", {"i": i}, queue="q") for i in range(5)]
        many = [await st.submit_many([{"name": "t", "queue": "q"}] * 10) for _ in range(5)]
        assert len(commits) == 10
        assert commits.count(threading.get_ident()) >= MOSTLY * 10, commits
        assert await st.get(ones[-1].id) is not None
        assert await st.get(many[-1][-1].id) is not None


async def test_queued_work_keeps_its_turn(tmp_path: Path) -> None:
    """While the connection thread runs or holds work, a submit queues behind it
    (first come, first served) instead of jumping ahead on the event loop; once
    the thread is idle again, submits go inline."""
    async with conveyor.connect(f"sqlite:///{tmp_path / 'q.db'}") as st:
        await st.submit("warm", {}, queue="q")
        commits = _commits(st)
        loop_thread = threading.get_ident()
        order: list[str] = []

        async def slow(conn: AsyncConnection) -> None:
            await conn.execute(text("SELECT 1"))
            time.sleep(0.3)  # holds the connection thread
            order.append("slow")

        async def queued(conn: AsyncConnection) -> None:
            order.append("queued")

        first = asyncio.create_task(st._run(slow))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(st._run(queued))
        await asyncio.sleep(0.01)
        task = await st.submit("t", {}, queue="q")  # behind both
        order.append("submit")
        await asyncio.gather(first, second)
        assert order == ["slow", "queued", "submit"]
        assert loop_thread not in commits
        assert await st.get(task.id) is not None
        del commits[:]
        for _ in range(5):
            await st.submit("t", {}, queue="q")
        assert commits.count(loop_thread) >= MOSTLY * 5, commits


async def test_a_call_queued_before_goes_first_while_the_thread_is_between_jobs(
    tmp_path: Path,
) -> None:
    """The lock alone does not keep the order: between two jobs the thread holds
    nothing. A submit made then, behind a call still in the queue, must not take
    the free lock on the event loop and commit first."""
    async with conveyor.connect(f"sqlite:///{tmp_path / 'q.db'}") as st:
        await st.submit("warm", {}, queue="q")
        thread = st._thread
        assert thread is not None
        reached, release = threading.Event(), threading.Event()
        listening = thread._listening

        def stalled() -> bool:
            # Called by the thread between jobs, outside the lock.
            if not release.is_set():
                reached.set()
                release.wait(5)
            return listening()

        thread._listening = stalled
        thread.nudge()  # the thread comes round to the stall
        while not reached.is_set():
            await asyncio.sleep(0.005)
        order: list[str] = []

        async def queued(conn: AsyncConnection) -> None:
            order.append("queued")

        event.listen(thread._engine, "commit", lambda _conn: order.append("commit"))
        first = asyncio.create_task(st._run(queued))
        await asyncio.sleep(0)  # handed to the thread's queue
        submitting = asyncio.create_task(st.submit("t", {}, queue="q"))
        await asyncio.sleep(0.05)
        release.set()
        await first
        await submitting
        # The queued call's transaction, then the submit's.
        assert order == ["queued", "commit", "commit"]


async def test_another_writer_sends_the_submit_to_the_thread_without_blocking_the_loop(
    tmp_path: Path,
) -> None:
    """Another connection holds the write lock: the inline path asks once and
    steps aside, so the event loop is not held for the busy wait (the store's
    busy_timeout is 5 s here, the lock held 0.5 s); the submit waits its turn on
    the connection thread and commits there once the lock is free."""
    db = tmp_path / "q.db"
    async with conveyor.connect(f"sqlite:///{db}", busy_timeout=5) as st:
        await st.submit("warm", {}, queue="q")
        commits = _commits(st)
        for _ in range(5):  # inline while nobody else writes
            await st.submit("idle", {}, queue="q")
        assert commits.count(threading.get_ident()) >= MOSTLY * 5, commits
        del commits[:]

        other = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")
        ticks: list[None] = []
        order: list[tuple[str, int]] = []
        stop = asyncio.Event()
        ticker = asyncio.create_task(_ticker(ticks, stop))
        await asyncio.sleep(0.02)

        def commit() -> None:  # on the event loop: it runs only if the loop is free
            order.append(("other writer committed", len(ticks)))
            other.execute("COMMIT")

        asyncio.get_running_loop().call_later(0.5, commit)
        began = len(ticks)
        task = await st.submit("busy", {}, queue="q")
        order.append(("submitted", len(ticks)))
        stop.set()
        await ticker
        other.close()
        # It waited for the other writer ...
        assert [what for what, _ in order] == ["other writer committed", "submitted"]
        # ... but not on the event loop, which kept running other coroutines
        # meanwhile (held for the busy wait, it would have run this one at most
        # once before the other writer's commit, itself a callback of the loop).
        assert order[0][1] - began >= 10, (began, order)
        assert commits == [st._thread._thread.ident]  # type: ignore[union-attr]
        assert await st.get(task.id) is not None


async def test_the_wal_is_checkpointed_under_inline_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Submits that go inline back to back never leave the connection thread the
    lock by chance: its checkpoint still runs on its timer (inline calls step
    aside while it waits for the lock), so the WAL keeps restarting."""
    ran: list[float] = []
    real = sqlite_thread._checkpoint

    def checkpoint(conn: Any) -> None:
        ran.append(time.monotonic())
        real(conn)

    monkeypatch.setattr(sqlite_thread, "_checkpoint", checkpoint)
    db = tmp_path / "wal.db"
    async with conveyor.connect(f"sqlite:///{db}") as st:
        await st.submit("warm", {}, queue="q")
        commits = _commits(st)
        started = time.monotonic()
        deadline = started + 6 * sqlite_thread.CHECKPOINT_EVERY
        while time.monotonic() < deadline:
            await st.submit_many([{"name": "t", "queue": "q", "payload": "x" * 200}] * 20)
        inline = commits.count(threading.get_ident())
        assert inline > len(commits) / 2, (inline, len(commits))
        during = [at for at in ran if at > started]
        # One per CHECKPOINT_EVERY (0.5 s) as the thread finds it due: five or so.
        assert len(during) >= 3, during


async def test_a_loop_of_inline_submits_lets_other_coroutines_run(tmp_path: Path) -> None:
    """An inline submit never suspends for I/O, so it yields once afterwards, as
    the hop to the thread did: other coroutines of the loop keep running."""
    async with conveyor.connect(f"sqlite:///{tmp_path / 'q.db'}") as st:
        await st.submit("warm", {}, queue="q")
        ticks = 0
        stop = False

        async def tick() -> None:
            nonlocal ticks
            while not stop:
                ticks += 1
                await asyncio.sleep(0)

        ticking = asyncio.create_task(tick())
        await asyncio.sleep(0)
        for i in range(50):
            await st.submit("t", {"i": i}, queue="q")
        stop = True
        await ticking
        assert ticks >= 50


async def test_in_memory_store_submits_inline() -> None:
    """One private in-memory connection: usable from the event loop's thread too
    (the same connection, one user at a time)."""
    async with conveyor.connect("sqlite:///:memory:") as st:
        await st.submit("warm", {}, queue="m")
        commits = _commits(st)
        tasks = [await st.submit("t", {"i": i}, queue="m") for i in range(3)]
        assert commits == [threading.get_ident()] * 3
        claimed = await st.claim("m", worker_id="w", limit=10)
        assert {t.id for t in claimed} >= {t.id for t in tasks}


@pytest.mark.parametrize("synchronous", ["FULL", "EXTRA"])
async def test_no_inline_commit_waits_for_the_disk(tmp_path: Path, synchronous: str) -> None:
    """With synchronous FULL or EXTRA every commit waits for the disk: those stay
    on the connection thread, off the event loop."""
    url = f"sqlite:///{tmp_path / 'q.db'}"
    async with conveyor.connect(url, synchronous=synchronous) as st:
        await st.submit("warm", {}, queue="q")
        commits = _commits(st)
        await st.submit("t", {}, queue="q")
        assert threading.get_ident() not in commits


async def test_a_connection_bound_to_its_thread_falls_back(tmp_path: Path) -> None:
    """A ``creator`` that makes connections usable only from their own thread: the
    inline path finds out at its first try and leaves the connection to the
    thread, and every submit still succeeds."""
    db = tmp_path / "q.db"
    options = {"creator": lambda: sqlite3.connect(db)}
    async with conveyor.connect(f"sqlite:///{db}", engine_options=options) as st:
        await st.submit("warm", {}, queue="q")
        commits = _commits(st)
        for _ in range(3):
            await st.submit("t", {}, queue="q")
        assert threading.get_ident() not in commits
        assert st._thread is not None and not st._thread.inline
