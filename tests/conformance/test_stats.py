"""stats(): per queue counts by status, oldest claimable age, and per-group lag."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from conveyor.models import QueueStats
from conveyor.store.base import TaskStore

ZERO = {
    "waiting": 0,
    "queued": 0,
    "running": 0,
    "succeeded": 0,
    "failed": 0,
    "cancelled": 0,
    "evicted": 0,
    "skipped": 0,
}


def counts(**nonzero: int) -> dict[str, int]:
    return {**ZERO, **nonzero}


def ago(seconds: float) -> datetime:
    return datetime.now(UTC) - timedelta(seconds=seconds)


async def one(store: TaskStore, queue: str) -> QueueStats:
    [stats] = await store.stats(queue)
    assert stats.queue == queue
    return stats


async def test_counts_oldest_age_and_group_lag(store: TaskStore) -> None:
    q = "s"
    await store.subscribe(q, "g")
    await store.subscribe(q, "h")
    started = time.monotonic()
    t = [await store.submit("e", {"n": n}, queue=q, run_at=ago(300 - n)) for n in range(6)]
    await store.submit("e", queue=q, delay=3600)  # not claimable yet
    p1 = await store.submit("e", queue=q, partition="p", run_at=ago(500))
    await store.submit("e", queue=q, partition="p", run_at=ago(600))

    # queue mode: p1 (oldest, the stream's head) running, t0 succeeded, t1 failed, t2 cancelled.
    [c] = await store.claim(q, worker_id="w", partition="p")
    assert c.id == p1.id
    got = await store.claim(q, worker_id="w", limit=2)
    assert [x.id for x in got] == [t[0].id, t[1].id]
    await store.succeed(t[0].id, worker_id="w")
    await store.fail(t[1].id, worker_id="w", error="no", retryable=False)
    await store.cancel(t[2].id)  # cancelled for every group as well

    # group g: two tasks succeeded, one running; h did nothing.
    got = await store.claim(q, worker_id="w", group="g", limit=3)
    assert len(got) == 3
    for x in got[:2]:
        await store.succeed(x.id, worker_id="w", group="g")

    stats = await one(store, q)
    elapsed = time.monotonic() - started + 1
    assert stats.counts == counts(queued=5, running=1, succeeded=1, failed=1, cancelled=1)
    # The oldest claimable task in queue mode is t3 (run_at 297 s ago): the partition's
    # queued task is blocked behind its running head, the delayed task is not due.
    assert stats.oldest_claimable_age is not None
    assert 297 <= stats.oldest_claimable_age < 297 + elapsed
    assert set(stats.groups) == {"g", "h"}
    g, h = stats.groups["g"], stats.groups["h"]
    assert g.counts == counts(queued=5, running=1, succeeded=2, cancelled=1)
    assert g.lag == 6
    assert h.counts == counts(queued=8, cancelled=1)
    assert h.lag == 8
    # For h every task is still claimable: the oldest is the partition head (500 s ago).
    assert h.oldest_claimable_age is not None
    assert 500 <= h.oldest_claimable_age < 500 + elapsed


async def test_lag_falls_to_zero_when_a_group_is_done(store: TaskStore) -> None:
    q = "done"
    await store.subscribe(q, "g")
    await store.submit_many([{"name": "e", "queue": q} for _ in range(4)])
    assert (await one(store, q)).groups["g"].lag == 4
    for x in await store.claim(q, worker_id="w", group="g", limit=10):
        await store.fail(x.id, worker_id="w", group="g", error="x", retryable=False)
    stats = await one(store, q)
    assert stats.groups["g"].lag == 0
    assert stats.groups["g"].counts == counts(failed=4)
    assert stats.groups["g"].oldest_claimable_age is None
    assert stats.counts == counts(queued=4)  # queue mode has not started


async def test_nothing_claimable_means_no_oldest_age(store: TaskStore) -> None:
    q = "blocked"
    head = await store.submit("e", queue=q, partition="p", run_at=ago(100))
    await store.submit("e", queue=q, partition="p", run_at=ago(200))
    await store.submit("e", queue=q, delay=600)
    [c] = await store.claim(q, worker_id="w")
    assert c.id == head.id
    stats = await one(store, q)
    assert stats.counts == counts(queued=2, running=1)
    assert stats.oldest_claimable_age is None
    # Once the head is done, the next task of the stream is claimable.
    await store.succeed(head.id, worker_id="w")
    stats = await one(store, q)
    assert stats.oldest_claimable_age is not None and stats.oldest_claimable_age >= 200


async def test_stats_of_every_queue_and_of_one(store: TaskStore) -> None:
    await store.submit("e", queue="b")
    await store.submit("e", queue="a")
    await store.submit("e", queue="a")
    await store.subscribe("a", "g")
    everything = await store.stats()
    assert [s.queue for s in everything] == ["a", "b"]
    a, b = everything
    assert a.counts == counts(queued=2) and b.counts == counts(queued=1)
    assert set(a.groups) == {"g"} and a.groups["g"].lag == 2 and b.groups == {}
    [only_a] = await store.stats("a")
    assert only_a.queue == "a" and only_a.counts == a.counts
    assert only_a.groups["g"].counts == a.groups["g"].counts
    assert await store.stats("nope") == []
    # JSON-ready form.
    assert a.as_dict()["groups"]["g"]["lag"] == 2


async def test_an_unsubscribed_group_leaves_the_stats(store: TaskStore) -> None:
    await store.submit("e", queue="q")
    await store.subscribe("q", "g")
    assert set((await one(store, "q")).groups) == {"g"}
    await store.unsubscribe("q", "g")
    assert (await one(store, "q")).groups == {}


async def test_a_groups_only_queue_leaves_queue_mode_out(store: TaskStore) -> None:
    """Nobody consumes queue mode on a queue declared groups-only: its rows stay
    queued, and reporting them would show a backlog that never drains."""
    q = "bus"
    await store.configure_queue(q, queue_mode=False)
    await store.subscribe(q, "g")
    await store.submit_many([{"name": "e", "queue": q, "run_at": ago(60)} for _ in range(3)])
    for x in await store.claim(q, worker_id="w", group="g", limit=10):
        await store.succeed(x.id, worker_id="w", group="g")
    stats = await one(store, q)
    assert stats.queue_mode is False
    assert stats.counts == {}
    assert stats.oldest_claimable_age is None
    assert stats.groups["g"].counts == counts(succeeded=3)
    assert stats.groups["g"].lag == 0
    assert stats.as_dict()["queue_mode"] is False
    # Another queue keeps its queue mode; turning it back on shows it again.
    await store.submit("e", queue="plain")
    plain = await one(store, "plain")
    assert plain.queue_mode is True and plain.counts == counts(queued=1)
    await store.configure_queue(q, queue_mode=True)
    again = await one(store, q)
    assert again.queue_mode is True and again.counts == counts(queued=3)
