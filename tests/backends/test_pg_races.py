"""Postgres-only races: the interleavings that SQLite's single writer rules out.

Each test makes the bad interleaving happen on purpose — another connection holds
a lock the store's transaction must wait for, so the other side runs in between —
or, for the lock order, runs the contended workload long enough that an inverted
order shows up in ``pg_stat_database.deadlocks``.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url
from tests._support import run_together

import conveyor
from conveyor import ConveyorError, Status, StoreUnavailable
from conveyor.errors import InvalidArgument
from conveyor.store.base import TaskStore

TABLES = (
    "conveyor_deliveries",
    "conveyor_streams",
    "conveyor_keys",
    "conveyor_groups",
    "conveyor_queues",
    "conveyor_maintenance",
    "conveyor_counts",
    "conveyor_tasks",
)


def dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture
def url(pg_url: str) -> Iterator[str]:
    """The test database, emptied."""
    with psycopg.connect(dsn(pg_url)) as conn:
        for table in TABLES:
            conn.execute(f"DELETE FROM {table}")
    yield pg_url


@pytest.fixture
def raw(url: str) -> Iterator[psycopg.Connection[Any]]:
    """A plain connection of the test's own, outside any store."""
    with psycopg.connect(dsn(url)) as conn:
        yield conn


async def waiters(url: str, n: int, timeout: float = 10.0) -> None:
    """Return once ``n`` backends of this database wait on a lock."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn(url), autocommit=True) as conn:
        while True:
            waiting = conn.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchone()
            if waiting is not None and waiting[0] >= n:
                return
            assert time.monotonic() < deadline, f"fewer than {n} lock waiters"
            await asyncio.sleep(0.02)


def count(url: str, sql: str) -> int:
    with psycopg.connect(dsn(url), autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
        assert row is not None
        return int(row[0])


@pytest.fixture
async def store(url: str) -> AsyncIterator[TaskStore]:
    async with conveyor.connect(url) as st:
        yield st


# ---------------------------------------------------------------- item 2
async def test_a_failed_subscribe_leaves_nothing_behind(
    url: str, raw: psycopg.Connection[Any], store: TaskStore
) -> None:
    """The backfill waits out producers in flight; when that wait times out, the
    subscribe fails whole: no group, and the next subscribe starts clean (so task 2
    cannot reach the group before task 1)."""
    first = await store.submit("t", queue="q", partition="p")
    raw.execute("LOCK TABLE conveyor_tasks IN ROW EXCLUSIVE MODE")  # a producer in flight
    async with conveyor.connect(url, lock_timeout=0.3) as impatient:
        with pytest.raises(StoreUnavailable):
            await impatient.subscribe("q", "g", start="all")
    raw.rollback()
    assert [grp.name for grp in await store.groups("q") if grp.active] == []
    second = await store.submit("t", queue="q", partition="p")
    got = await store.claim("q", worker_id="w", group="g", limit=5, subscribe="all")
    assert [t.id for t in got] == [first.id, second.id]


# ---------------------------------------------------------------- item 4
async def test_unsubscribe_and_a_producer_in_flight_leave_no_orphans(
    url: str, raw: psycopg.Connection[Any], store: TaskStore
) -> None:
    await store.subscribe("q", "g")
    await store.submit("t", queue="q", partition="p")
    # Hold the group's stream row: the producer below stops inside its transaction,
    # after its fan-out wrote a delivery row for "g", and waits here.
    raw.execute(
        "SELECT 1 FROM conveyor_streams WHERE queue = 'q' AND grp = 'g' AND partition = 'p' "
        "FOR UPDATE"
    )
    async with conveyor.connect(url) as producer, conveyor.connect(url) as admin:
        producing = asyncio.ensure_future(producer.submit("t", queue="q", partition="p"))
        await waiters(url, 1)
        leaving = asyncio.ensure_future(admin.unsubscribe("q", "g"))
        await waiters(url, 2)
        raw.commit()
        await asyncio.wait_for(asyncio.gather(producing, leaving), 20)
    orphans = count(url, "SELECT count(*) FROM conveyor_deliveries WHERE grp = 'g'")
    assert orphans == 0
    # nothing is kept forever: once queue mode is done, retention deletes everything
    await store.configure_queue("q", retention=0)
    while tasks := await store.claim("q", worker_id="w", limit=10):
        for task in tasks:
            await store.succeed(task.id, worker_id="w")
    await store.maintain()
    assert count(url, "SELECT count(*) FROM conveyor_tasks") == 0


# ---------------------------------------------------------------- item 6
DEADLOCK_RUN = 12.0  # seconds; before the fix this produced several deadlocks


def deadlocks(url: str) -> int:
    return count(
        url,
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
    )


async def test_cancel_fail_and_claim_on_busy_partitions_never_deadlock(url: str) -> None:
    """Claimers take stream heads while others cancel the heads and claimers fail
    some tasks back: with one lock order (stream rows, then delivery rows) Postgres
    never has to break a deadlock. Before the fix this run produced several."""
    parts = ["a", "b"]
    sts = [conveyor.connect(url) for _ in range(5)]
    await asyncio.gather(*(st.open() for st in sts))
    claimers, cancellers = sts[:3], sts[3:]
    await sts[0].submit_many(
        [{"name": "t", "queue": "busy", "partition": p} for _ in range(600) for p in parts]
    )
    await asyncio.sleep(1.5)  # let the statistics of the set-up settle
    before = deadlocks(url)
    errors: list[BaseException] = []
    stop = time.monotonic() + DEADLOCK_RUN
    rng = random.Random(7)
    done = {"claimed": 0, "cancelled": 0}

    async def claimer(st: TaskStore, worker: str) -> None:
        while time.monotonic() < stop:
            try:
                tasks = await st.claim("busy", worker_id=worker, limit=2)
            except ConveyorError as exc:
                errors.append(exc)
                continue
            if not tasks:
                await asyncio.sleep(0.01)
            for task in tasks:
                done["claimed"] += 1
                try:
                    if rng.random() < 0.3:
                        await st.fail(task.id, worker_id=worker, error="x", delay=0)
                    else:
                        await st.succeed(task.id, worker_id=worker)
                except conveyor.LostLease:
                    pass  # cancelled while held
                except ConveyorError as exc:
                    errors.append(exc)

    async def canceller(st: TaskStore) -> None:
        while time.monotonic() < stop:
            try:
                part = rng.choice(parts)
                page = await st.list(queue="busy", status="queued", partition=part, limit=1)
                for task in page.items:
                    await st.cancel(task.id)
                    done["cancelled"] += 1
            except ConveyorError as exc:
                errors.append(exc)

    try:
        await asyncio.gather(
            *(claimer(st, f"c{n}") for n, st in enumerate(claimers)),
            *(canceller(st) for st in cancellers),
        )
    finally:
        await asyncio.gather(*(st.close() for st in sts))
    time.sleep(1.5)  # backends that exited have flushed their statistics
    assert errors == []
    assert done["claimed"] > 0 and done["cancelled"] > 0
    assert deadlocks(url) - before == 0


async def test_producers_consumers_and_operators_in_five_processes(url: str) -> None:
    """Five processes at once, four calls each at a time: two submit keyed and
    partitioned tasks (reusing and replacing, alone and in batches), partitioned
    children and plain replaces; two claim in queue mode and a group, acknowledge,
    fail some; one cancels and retries. No call meets an error, the server breaks
    no deadlock (one lock order), and afterwards every stream drains to the end in
    queue mode and the group: nothing is left queued or leased."""
    async with conveyor.connect(url) as st:
        await st.subscribe("c", "g")
    await asyncio.sleep(1.5)  # let the statistics of the set-up settle
    before = deadlocks(url)
    roles = ["produce", "produce", "consume", "consume", "operate"]
    outputs = await asyncio.to_thread(
        run_together, [["chaos", url, role, str(n), "4"] for n, role in enumerate(roles)]
    )
    results = [json.loads(line) for line in outputs]
    assert [r["errors"] for r in results] == [{}] * 5
    assert all(r["calls"] > 0 for r in results)
    time.sleep(1.5)  # backends that exited have flushed their statistics
    assert deadlocks(url) - before == 0
    async with conveyor.connect(url) as st:
        for group in (None, "g"):
            while got := await st.claim(
                "c", worker_id="drain", group=group, limit=50, per_stream=5
            ):
                await st.ack_many(
                    [{"task_id": t.id, "worker_id": "drain", "group": group} for t in got]
                )
        [stats] = await st.stats("c")
        for counts in (stats.counts, stats.groups["g"].counts):
            assert counts["queued"] == counts["running"] == 0
            assert counts["succeeded"] > 0


# ---------------------------------------------------------------- item 8
SLOW_KEYS = """
CREATE OR REPLACE FUNCTION conveyor_test_slow_keys() RETURNS trigger AS $$
BEGIN
    IF current_setting('conveyor_test.slow_keys', true) = 'on' THEN
        PERFORM pg_sleep(1);
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER conveyor_test_slow_keys AFTER INSERT ON conveyor_keys
    FOR EACH STATEMENT EXECUTE FUNCTION conveyor_test_slow_keys();
"""


async def test_reuse_racing_a_purge_returns_a_task(
    url: str, raw: psycopg.Connection[Any], store: TaskStore
) -> None:
    """A reuse submit that finds the key taken, while retention deletes that task:
    it answers with a task, never a KeyError. A statement trigger on the keys table
    (for this test's database only) pauses the submit right after its key insert
    met the old key, and the purge runs in that pause."""
    raw.execute(SLOW_KEYS)
    raw.commit()
    try:
        await store.configure_queue("r", retention=0)
        old = await store.submit("t", queue="r", key="k")
        (claimed,) = await store.claim("r", worker_id="w")
        await store.succeed(claimed.id, worker_id="w")
        slow = {"connect_args": {"options": "-c conveyor_test.slow_keys=on"}}
        async with conveyor.connect(url, engine_options=slow) as reuser:
            await reuser.open()
            reusing = asyncio.ensure_future(reuser.submit("t", queue="r", key="k"))
            await asyncio.sleep(0.3)  # the submit is paused after its key insert
            assert (await store.maintain())["deleted"] == 1
            task = await asyncio.wait_for(reusing, 20)
        assert task.key == "k" and task.id != old.id and task.status is Status.QUEUED
        holder = await store.get_by_key("k")
        assert holder is not None and holder.id == task.id
    finally:
        raw.execute("DROP TRIGGER IF EXISTS conveyor_test_slow_keys ON conveyor_keys")
        raw.commit()


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE", "repeatable_read"])
def test_only_read_committed_isolation_is_accepted(pg_url: str, level: str) -> None:
    """The protocol re-reads rows after locking them, which needs READ COMMITTED."""
    with pytest.raises(InvalidArgument) as info:
        conveyor.connect(pg_url, isolation_level=level)
    assert info.value.field == "isolation_level"
    assert "READ COMMITTED" in str(info.value)
    with pytest.raises(InvalidArgument):
        conveyor.connect(pg_url, engine_options={"isolation_level": level})
    conveyor.connect(pg_url, isolation_level="read committed")  # accepted


# ------------------------------------------------- batch acks of streams
async def test_a_stream_ack_that_waited_for_a_producer_sees_its_task(
    url: str, store: TaskStore
) -> None:
    """A batch acknowledgement of a stream's last active task waits for a producer
    that is appending to the stream (it holds the stream row); once the producer
    commits, the recomputed head must be the producer's task, so the stream does
    not stall with its next task unclaimable."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from conveyor.connect import resolve_url

    first = await store.submit("t", queue="q", partition="p")
    [got] = await store.claim("q", worker_id="w", limit=5, per_stream=2)
    assert got.id == first.id
    engine = create_async_engine(resolve_url(url)[1])
    try:
        async with engine.connect() as conn:
            second = await store.submit("t", queue="q", partition="p", connection=conn)
            acking = asyncio.ensure_future(
                store.ack_many([{"task_id": first.id, "worker_id": "w", "attempt": 1}])
            )
            await waiters(url, 1)  # the ack waits for the producer's stream lock
            await conn.commit()
        assert await asyncio.wait_for(acking, 20) == [None]
    finally:
        await engine.dispose()
    assert [t.id for t in await store.claim("q", worker_id="w2", limit=5)] == [second.id]
