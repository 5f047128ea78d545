"""The lock order holds whatever the database's collation.

Python sorts ``str`` by code point; a Postgres database sorts text by its
collation. On a database whose collation disagrees (ICU's ``en-US`` sorts
``'a'`` before ``'B'``, code points the other way round), every statement that
locks rows in the lock order must still sort by code point, or two transactions
lock the same two streams in opposite orders and Postgres has to break a
deadlock. The shared test server uses ``C.UTF-8``, where both orders agree, so
these tests make a database of their own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from tests._support import pg_deadlocks, pg_texts, scratch_pg_database

import conveyor
from conveyor.connect import resolve_url
from conveyor.store.base import TaskStore
from conveyor.store.protocol import queries as q

ICU_EN_US = "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"


def dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="module")
def icu_url(pg_url: str) -> Iterator[str]:
    """A migrated database whose collation sorts ``'a'`` before ``'B'``."""
    with scratch_pg_database("conveyor_icu", ICU_EN_US) as url:

        async def migrate() -> None:
            async with conveyor.connect(url):
                pass

        asyncio.run(migrate())
        with psycopg.connect(dsn(url), autocommit=True) as conn:
            row = conn.execute("SELECT 'a' < 'B'").fetchone()
        assert row == (True,), "the database's collation must disagree with code points"
        yield url


@pytest.fixture
async def store(icu_url: str) -> AsyncIterator[TaskStore]:
    with psycopg.connect(dsn(icu_url), autocommit=True) as conn:
        for table in ("conveyor_deliveries", "conveyor_streams", "conveyor_keys"):
            conn.execute(f"DELETE FROM {table}")
        conn.execute("DELETE FROM conveyor_tasks")
    async with conveyor.connect(icu_url) as st:
        yield st


async def test_lock_statements_sort_streams_by_code_point(icu_url: str, store: TaskStore) -> None:
    """Each statement that locks stream rows in the lock order returns them in
    Python's order of their keys: ``'B'`` before ``'a'``, which the database's own
    collation puts the other way round (fails before: ``['a', 'B']``)."""
    b = await store.submit("t", queue="q", partition="B")
    a = await store.submit("t", queue="q", partition="a")
    expected = sorted(["a", "B"])
    assert expected == ["B", "a"]
    engine = create_async_engine(resolve_url(icu_url)[1])
    try:
        async with engine.connect() as conn:
            keys = [("", "q", "a"), ("", "q", "B")]
            rows = await conn.execute(q.stream_rows_of(keys))
            assert [r.partition for r in rows] == expected
            rows = await conn.execute(q.partition_streams([("q", "a"), ("q", "B")], None))
            assert [r.partition for r in rows] == expected
            rows = await conn.execute(q.idle_streams(10))  # none idle: both have heads
            assert list(rows) == []
            await conn.rollback()
    finally:
        await engine.dispose()
    await store.submit("t", queue="q", key="a")
    await store.submit("t", queue="q", key="B")
    with psycopg.connect(dsn(icu_url)) as conn:
        keys = [row[0] for row in conn.execute(pg_texts()["lock_keys"], {"keys": '["a", "B"]'})]
        assert keys == expected
        conn.rollback()
        items = json.dumps([[a.id, "w", ""], [b.id, "w", ""]])
        text = pg_texts()["ack_streams_lock"].replace("SELECT 1 FROM", "SELECT s.partition FROM", 1)
        got = [row[0] for row in conn.execute(text, {"items": items})]
    assert got == expected


async def test_a_batch_ack_and_a_submit_over_the_same_streams_never_deadlock(
    icu_url: str, store: TaskStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch acknowledgement of tasks in partitions ``a`` and ``B`` and a
    producer appending to both, from another store, meet at the stream rows:
    another connection holds ``B`` while the producer queues for it and the
    acknowledgement starts. With one lock order they queue one behind the other;
    before the fix the acknowledgement locked ``a`` first (the database's order),
    the producer ``B`` first (Python's), and Postgres broke the deadlock after a
    second, one of the two retried."""
    caplog.set_level(logging.DEBUG, logger="conveyor.store")
    for p in ("a", "B"):
        await store.submit("t", queue="q", partition=p)
    held = await store.claim("q", worker_id="w", limit=2, per_stream=1)
    assert sorted(t.partition or "" for t in held) == ["B", "a"]
    before = pg_deadlocks(icu_url)
    producer = conveyor.connect(icu_url)
    await producer.open()
    try:
        with psycopg.connect(dsn(icu_url)) as blocker:
            blocker.execute(
                "SELECT 1 FROM conveyor_streams WHERE grp = '' AND partition = 'B' FOR UPDATE"
            )
            submitting = asyncio.ensure_future(
                producer.submit_many(
                    [{"name": "t", "queue": "q", "partition": p} for p in ("a", "B")]
                )
            )
            await _waiters(icu_url, 1)  # the producer waits for B
            acking = asyncio.ensure_future(
                store.ack_many([{"task_id": t.id, "worker_id": "w", "attempt": 1} for t in held])
            )
            await _waiters(icu_url, 2)  # and so does the acknowledgement
            blocker.commit()
        added = await asyncio.wait_for(submitting, 20)
        assert await asyncio.wait_for(acking, 20) == [None, None]
    finally:
        await producer.close()
    retried = [r.getMessage() for r in caplog.records if "deadlock" in r.getMessage()]
    assert retried == []
    assert len(added) == 2
    nxt = await store.claim("q", worker_id="w2", limit=2, per_stream=1)
    assert sorted(t.id for t in nxt) == sorted(t.id for t in added)
    await store.close()
    assert pg_deadlocks(icu_url, settle=True) == before


async def _waiters(url: str, n: int, timeout: float = 10.0) -> None:
    """Return once ``n`` backends of this database wait on a lock."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn(url), autocommit=True) as conn:
        while True:
            row: Any = conn.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchone()
            if row[0] >= n:
                return
            assert time.monotonic() < deadline, f"fewer than {n} lock waiters"
            await asyncio.sleep(0.02)
