"""What is particular to a store behind PgBouncer: the refusal of a store not told
of it, wake-ups past a transaction-mode pooler (``listen_url``, else polling said
once in the log), the maintenance lock, and a worker process draining tasks
through it."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from pathlib import Path

import psycopg
import pytest
from _bouncer import QUEUE, Bouncer, spawn_worker
from sqlalchemy.engine import make_url

import conveyor
from conveyor.errors import ConfigurationError, InvalidArgument

POLL_LINE = "LISTEN cannot work"
LISTENER = "conveyor-listener"


def _listeners(direct_url: str) -> int:
    """The conveyor LISTEN connections open in the test database."""
    database = make_url(direct_url).database
    with psycopg.connect(
        make_url(direct_url).set(drivername="postgresql").render_as_string(False)
    ) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
            (database, LISTENER),
        ).fetchone()
    assert row is not None
    return int(row[0])


async def test_a_store_not_told_of_the_pooler_says_how_to_fix_it(
    bouncer: Bouncer, direct_url: str
) -> None:
    url = bouncer.url(str(make_url(direct_url).database), pooler=False)
    with pytest.raises(ConfigurationError, match=r"\?pooler=transaction"):
        async with conveyor.connect(url):
            pass


async def test_the_pooler_is_named_once(store_url: str, pool_mode: str) -> None:
    other = "session" if pool_mode == "transaction" else "transaction"
    with pytest.raises(InvalidArgument, match="pooler"):
        conveyor.connect(store_url, pooler=other)
    with pytest.raises(InvalidArgument, match="pooler"):
        conveyor.connect(store_url.replace(f"pooler={pool_mode}", "pooler=statement"))
    if pool_mode == "transaction":
        # Timeouts set once per connection cannot hold behind a transaction pooler.
        with pytest.raises(InvalidArgument, match="timeouts"):
            conveyor.connect(store_url, timeouts="connection")


async def test_wakeups_past_a_transaction_pooler(
    bouncers: dict[str, Bouncer], direct_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = bouncers["transaction"].url(str(make_url(direct_url).database))
    caplog.set_level(logging.WARNING, logger="conveyor.store")
    async with conveyor.connect(url) as polling:
        # Without listen_url: no LISTEN at all (one through the pooler would hear
        # nothing), and one line saying so and how to fix it.
        assert not await polling.wait_for_work([QUEUE], 0.05)
        assert not await polling.wait_for_work([QUEUE], 0.05)
        assert _listeners(direct_url) == 0
        said = [r for r in caplog.records if POLL_LINE in r.getMessage()]
        assert len(said) == 1 and "listen_url" in said[0].getMessage()
        caplog.clear()
        async with conveyor.connect(url, listen_url=direct_url) as listening:
            assert not await listening.wait_for_work([QUEUE], 0.05)
            assert _listeners(direct_url) == 1
            assert not [r for r in caplog.records if POLL_LINE in r.getMessage()]
            # A submit through the pooler wakes the listener's idle worker.
            waiting = asyncio.create_task(listening.wait_for_work([QUEUE], 30))
            await asyncio.sleep(0.2)
            await polling.submit("double", queue=QUEUE, payload={"n": 1})
            assert await waiting
    assert _listeners(direct_url) == 0


async def test_one_maintenance_pass_at_a_time(store_url: str) -> None:
    # Behind a transaction pooler a session-level lock would be taken on a server
    # connection that goes back to the pool at once: the next store handed that
    # connection would take the same lock again (they are re-entrant), and two
    # passes would run together; and its unlock could land elsewhere, leaving it
    # held. (The seam's lock itself: a pass is too short to meet another's.)
    async with conveyor.connect(store_url) as first, conveyor.connect(store_url) as second:
        for _ in range(3):
            async with first._maintenance_lock() as mine:
                assert mine
                for _ in range(5):
                    async with second._maintenance_lock() as theirs:
                        assert not theirs
            assert (await second.maintain())["skipped"] == 0
            assert (await first.maintain())["skipped"] == 0


@pytest.mark.parametrize("listen", [False, True], ids=["polling", "listen_url"])
def test_a_worker_process_drains_through_pgbouncer(
    store_url: str, direct_url: str, pool_mode: str, listen: bool, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    env = {"CONVEYOR_LISTEN_URL": direct_url} if listen else {}
    worker = spawn_worker(store_url, log, env)
    try:
        with conveyor.connect_sync(store_url, listen=False) as store:
            tasks = store.submit_many(
                [{"name": "double", "queue": QUEUE, "payload": {"n": n}} for n in range(200)]
            )
            deadline = time.monotonic() + 60
            while True:
                done = [store.get(t.id) for t in tasks]
                if all(t is not None and t.terminal for t in done):
                    break
                assert worker.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
            assert [t.result for t in done if t is not None] == [2 * n for n in range(200)], (
                log.read_text()[-3000:]
            )
            if listen or pool_mode == "session":
                assert _listeners(direct_url) == 1
            else:
                assert _listeners(direct_url) == 0
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(30)
    text = log.read_text()
    assert code == 0, text
    assert "Traceback" not in text
    said = text.count(POLL_LINE)
    assert said == (1 if pool_mode == "transaction" and not listen else 0), text
