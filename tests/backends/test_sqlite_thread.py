"""SQLite: whole transactions on the store's connection thread, and the
cross-process wake-up by ``PRAGMA data_version``."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncConnection

import conveyor
from conveyor.schema import tasks as t
from conveyor.store.sqlite import thread as sqlite_thread

SUBMIT = textwrap.dedent(
    """
    import asyncio, sys
    import conveyor

    async def main(url: str) -> None:
        async with conveyor.connect(url) as st:
            await st.submit("t", {}, queue=sys.argv[2])

    asyncio.run(main(sys.argv[1]))
    """
)


async def test_own_writers_never_meet_the_busy_handler(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A process's own transactions queue in-process (first come, first served):
    with no busy timeout at all, forty concurrent submits and claims of one store
    never find the database locked, so none is retried."""
    url = f"sqlite:///{tmp_path / 'q.db'}"
    async with conveyor.connect(url, busy_timeout=0) as st:
        caplog.set_level(logging.DEBUG, logger="conveyor.store")

        async def one(i: int) -> int:
            await st.submit("t", {"i": i}, queue="q")
            return len(await st.claim("q", worker_id=f"w{i}", limit=1))

        claimed = await asyncio.gather(*(one(i) for i in range(40)))
        assert sum(claimed) == 40
    retried = [r for r in caplog.records if "transient database error" in r.getMessage()]
    assert retried == []


async def test_a_transaction_that_suspends_is_refused_and_rolled_back(tmp_path: Path) -> None:
    """A whole transaction runs as one blocking call on the connection thread; a
    ``work`` that awaits anything but the connection is refused, not run half."""
    async with conveyor.connect(f"sqlite:///{tmp_path / 'q.db'}") as st:
        task = await st.submit("t", {}, queue="q")

        async def suspends(conn: AsyncConnection) -> None:
            await conn.execute(text("DELETE FROM conveyor_tasks"))
            await asyncio.sleep(0)

        with pytest.raises(RuntimeError, match="suspend"):
            await st._run(suspends)
        assert await st.get(task.id) is not None  # the DELETE was rolled back
        ids = await st._run(lambda c: _ids(c), write=False)
        assert ids == [task.id]


async def _ids(conn: AsyncConnection) -> list[str]:
    return list((await conn.execute(select(t.c.id))).scalars())


async def test_another_process_commit_wakes_an_idle_waiter(tmp_path: Path) -> None:
    """An idle worker here hears a submit made by another process (the connection
    thread sees ``PRAGMA data_version`` move), instead of sleeping out its poll."""
    url = f"sqlite:///{tmp_path / 'q.db'}"
    script = tmp_path / "submit.py"
    script.write_text(SUBMIT)
    async with conveyor.connect(url) as st:
        assert await st.claim("q", worker_id="w") == []
        await st.wait_for_work(["q"], 0.05)  # forget what our own open() announced
        proc = subprocess.Popen([sys.executable, str(script), url, "q"])
        try:
            woken = await st.wait_for_work(["q"], 60)
            # Woken by the other process's commit: the 60 s timeout would say False.
            assert woken is True
        finally:
            assert proc.wait(timeout=60) == 0
        assert len(await st.claim("q", worker_id="w")) == 1


async def test_in_memory_store_runs_concurrent_calls_in_turn() -> None:
    """One private in-memory connection: concurrent calls queue on the connection
    thread and all succeed."""
    async with conveyor.connect("sqlite:///:memory:") as st:
        await asyncio.gather(*(st.submit("t", {"i": i}, queue="m") for i in range(30)))
        claimed = await asyncio.gather(
            *(st.claim("m", worker_id=f"w{i}", limit=1) for i in range(30))
        )
        assert sorted(task.payload["i"] for batch in claimed for task in batch) == list(range(30))


async def test_a_call_cancelled_while_queued_never_runs(tmp_path: Path) -> None:
    """A caller that gives up while its transaction waits its turn leaves nothing
    behind: the transaction is skipped, not committed behind its back."""
    async with conveyor.connect(f"sqlite:///{tmp_path / 'q.db'}") as st:

        async def slow(conn: AsyncConnection) -> None:
            await conn.execute(text("SELECT 1"))
            time.sleep(0.5)  # holds the connection thread: the submit below queues

        first = asyncio.create_task(st._run(slow))
        await asyncio.sleep(0.1)
        submit = asyncio.create_task(st.submit("t", {}, queue="q", key="gone"))
        await asyncio.sleep(0.05)
        submit.cancel()
        await first
        with pytest.raises(asyncio.CancelledError):
            await submit
        assert await st.get_by_key("gone") is None


async def test_close_ends_the_connection_thread(tmp_path: Path) -> None:
    """When close() returns, the store's connection thread has closed the
    database and ended: nothing of the store runs after it."""
    store = conveyor.connect(f"sqlite:///{tmp_path / 'q.db'}")
    await store.submit("t", {}, queue="q")
    thread = store._thread
    assert thread is not None and thread._thread.is_alive()
    await store.close()
    assert not thread._thread.is_alive()


async def test_the_wal_is_checkpointed_while_writes_go_on(tmp_path: Path) -> None:
    """The store's connection checkpoints on a timer (SQLite's per-commit automatic
    checkpoint is off on it): under writes that never pause, the WAL still
    restarts, so it stays a few megabytes instead of growing with every commit."""
    db = tmp_path / "wal.db"
    async with conveyor.connect(f"sqlite:///{db}") as st:
        written = 0
        deadline = time.monotonic() + 3 * sqlite_thread.CHECKPOINT_EVERY + 2.0
        while time.monotonic() < deadline:
            await st.submit_many([{"name": "t", "queue": "q", "payload": "x" * 200}] * 200)
            written += 200
        wal = Path(f"{db}-wal").stat().st_size
        # What the writes put through the WAL, had it never restarted.
        total = Path(db).stat().st_size + wal
        assert written > 2_000
        assert wal < total / 2, (wal, total)
