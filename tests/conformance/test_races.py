"""Races between separate stores (separate connections), on both backends.

Each test starts several stores on one database, as several processes would,
and checks a guarantee that a check-then-write or an inverted lock order broke:
idempotent group registration, one live task per idempotency key, attempt
numbers that only grow, replay eviction counted from the subscription, stream
rows that do not pile up, and no SQLAlchemy or driver exception leaving the API.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, pool, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection

import conveyor
from conveyor import ConveyorError, InvalidArgument, LostLease, Status, Task
from conveyor.store.base import TaskStore


@asynccontextmanager
async def stores(url: str, n: int, **options: Any) -> AsyncIterator[list[TaskStore]]:
    """``n`` open stores on one database: each has its own connections."""
    opened = [conveyor.connect(url, **options) for _ in range(n)]
    try:
        await asyncio.gather(*(st.open() for st in opened))
        yield opened
    finally:
        await asyncio.gather(*(st.close() for st in opened))


def sync_engine(url: str) -> Engine:
    """A plain blocking engine on the store's database, to look at its tables."""
    parsed = make_url(url)
    driver = "sqlite" if parsed.drivername.startswith("sqlite") else "postgresql+psycopg"
    return create_engine(parsed.set(drivername=driver), poolclass=pool.NullPool)


def scalar(url: str, sql: str) -> Any:
    engine = sync_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(text(sql)).scalar()
    finally:
        engine.dispose()


# ---------------------------------------------------------------- item 1
async def test_first_claims_of_a_new_group_from_many_stores_at_once(store_url: str) -> None:
    """Several consumers starting together with a group nobody registered yet, each
    asked to subscribe it: every claim succeeds, the group is registered once, and
    each task is delivered once."""
    async with stores(store_url, 6) as sts:
        await sts[0].submit_many([{"name": "t", "queue": "q"} for _ in range(3)])
        for round_ in range(4):
            group = f"g{round_}"
            results = await asyncio.gather(
                *(
                    st.claim("q", worker_id=f"w{i}", group=group, limit=3, subscribe="all")
                    for i, st in enumerate(sts)
                ),
                return_exceptions=True,
            )
            errors = [r for r in results if isinstance(r, BaseException)]
            assert errors == [], f"round {round_}: {errors!r}"
            claimed = [t.id for r in results if isinstance(r, list) for t in r]
            assert len(claimed) == len(set(claimed)) == 3
        names = [(grp.name, grp.active) for grp in await sts[0].groups("q")]
        assert names == [(f"g{i}", True) for i in range(4)]


async def test_no_sqlalchemy_error_leaves_run(store: TaskStore) -> None:
    """Whatever the database raises that no rule translates still arrives as a
    ConveyorError naming what happened (here a constraint violation)."""

    async def clash(conn: AsyncConnection) -> None:
        await conn.execute(
            text("INSERT INTO conveyor_meta (key, value) VALUES ('protocol_version', 'x')")
        )

    with pytest.raises(ConveyorError) as info:
        await store._run(clash)
    assert "conveyor_meta" in str(info.value) or "protocol_version" in str(info.value)
    assert (await store.submit("still-works")).name == "still-works"


async def test_an_exhausted_connection_pool_is_a_conveyor_error(store_url: str) -> None:
    """A pool that runs dry (the user's own pool settings) surfaces as StoreUnavailable,
    not as SQLAlchemy's TimeoutError."""
    options = {"pool_size": 1, "max_overflow": 0, "pool_timeout": 0.01}
    async with stores(store_url, 1, engine_options=options) as (st,):
        results = await asyncio.gather(
            *(st.submit("t", {"i": i}) for i in range(30)), return_exceptions=True
        )
    leaked = [
        r for r in results if isinstance(r, BaseException) and not isinstance(r, ConveyorError)
    ]
    assert leaked == []
    assert all(isinstance(r, Task | conveyor.StoreUnavailable) for r in results)


# ---------------------------------------------------------------- item 3
async def test_concurrent_replaces_leave_exactly_one_live_task(store_url: str) -> None:
    async with stores(store_url, 8) as sts:
        await sts[0].submit("job", {"n": -1}, key="k")
        for round_ in range(3):
            await asyncio.gather(
                *(
                    st.submit("job", {"n": i, "r": round_}, key="k", conflict="replace")
                    for i, st in enumerate(sts)
                )
            )
            page = await sts[0].list(limit=1000)
            live = [t for t in page.items if t.key == "k" and not t.terminal]
            assert len(live) == 1, f"round {round_}: {len(live)} live tasks for one key"
            holder = await sts[0].get_by_key("k")
            assert holder is not None and holder.id == live[0].id


# ---------------------------------------------------------------- item 5
async def test_a_replay_waits_from_the_subscription_not_from_run_at(store: TaskStore) -> None:
    await store.configure_queue("q", max_wait=60)
    plain = await store.submit("a", queue="q")
    ordered = await store.submit("b", queue="q", partition="p")
    store.clock_offset = 120.0  # two minutes later a group replays the history
    await store.subscribe("q", "replay", start="all")
    counts = await store.maintain()
    assert counts["evicted"] == 2  # queue mode's copies waited 120 s > 60 s
    for task in (plain, ordered):
        assert (await store.get(task.id)).status is Status.EVICTED  # type: ignore[union-attr]
        mine = await store.get(task.id, group="replay")
        assert mine is not None and mine.status is Status.QUEUED
    first = await store.claim("q", worker_id="w", group="replay", limit=5)
    second = await store.claim("q", worker_id="w", group="replay", limit=5)
    assert sorted(t.id for t in first + second) == sorted([plain.id, ordered.id])
    late = await store.subscribe("q", "late", start="all")
    assert late.active
    store.clock_offset = 120.0 + 61
    assert (await store.maintain())["evicted"] == 2  # "late" waited 61 s: now it goes
    assert (await store.get(plain.id, group="late")).status is Status.EVICTED  # type: ignore[union-attr]


# ---------------------------------------------------------------- item 8
async def test_release_never_lowers_the_attempt(store: TaskStore) -> None:
    task = await store.submit("t", max_attempts=1)
    (first,) = await store.claim("default", worker_id="w")
    back = await store.release(task.id, worker_id="w", attempt=first.attempt)
    assert back.status is Status.QUEUED and back.attempt >= first.attempt
    (second,) = await store.claim("default", worker_id="w")
    assert second.attempt > first.attempt
    with pytest.raises(LostLease):  # the fence of the released run no longer matches
        await store.succeed(task.id, worker_id="w", attempt=first.attempt)
    # the release cost nothing of the budget: this run is still allowed, and it is the last
    done = await store.fail(task.id, worker_id="w", error="boom", attempt=second.attempt)
    assert done.status is Status.FAILED


async def test_fail_validates_attempt(store: TaskStore) -> None:
    task = await store.submit("t")
    (claimed,) = await store.claim("default", worker_id="w")
    for bad in (0, -1, "1", True, 1.0):
        with pytest.raises(InvalidArgument) as info:
            await store.fail(task.id, worker_id="w", error="x", attempt=bad)  # type: ignore[arg-type]
        assert info.value.field == "attempt"
    now = await store.get(task.id)
    assert now is not None and now.status is Status.RUNNING and now.error is None
    assert now.attempt == claimed.attempt


async def test_maintain_drops_idle_empty_stream_rows(store: TaskStore, store_url: str) -> None:
    await store.subscribe("q", "g")
    await store.submit_many([{"name": "t", "queue": "q", "partition": f"p{i}"} for i in range(5)])
    for group in (None, "g"):
        tasks = await store.claim("q", worker_id="w", group=group)
        while tasks:
            for t in tasks:
                await store.succeed(t.id, worker_id="w", group=group)
            tasks = await store.claim("q", worker_id="w", group=group)
    assert scalar(store_url, "SELECT count(*) FROM conveyor_streams") == 10
    await store.maintain()
    assert scalar(store_url, "SELECT count(*) FROM conveyor_streams") == 0
    # the partitions work as before when they are used again
    again = await store.submit("t", queue="q", partition="p0")
    (got,) = await store.claim("q", worker_id="w", group="g")
    assert got.id == again.id
    assert [t.id for t in await store.claim("q", worker_id="w")] == [again.id]


async def test_maintain_keeps_stream_rows_with_work(store: TaskStore, store_url: str) -> None:
    await store.submit("t", queue="q", partition="held")
    await store.submit("t", queue="q", partition="later", delay=timedelta(hours=1))
    (running,) = await store.claim("q", worker_id="w", partition="held")
    await store.maintain()
    assert scalar(store_url, "SELECT count(*) FROM conveyor_streams") == 2
    await store.succeed(running.id, worker_id="w")
    assert await store.claim("q", worker_id="w") == []
