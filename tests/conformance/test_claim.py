"""claim: order, limit, several queues, what a claim writes (SPEC §2.2)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from _support import is_utc, seconds, utcnow
from conveyor import Status
from conveyor.store.base import TaskStore


async def _ordered_fixture(store: TaskStore) -> dict[str, str]:
    """Six tasks whose claim order is c, b, f, a, d, e."""
    base = utcnow() - timedelta(minutes=1)
    specs = [
        ("a", 0, 10),
        ("b", 5, 5),
        ("c", 5, 8),
        ("d", 0, 10),  # same priority and run_at as a, submitted later
        ("e", -1, 20),  # earliest run_at, lowest priority
        ("f", 5, 5),  # same priority and run_at as b, submitted later
    ]
    ids = {}
    for name, priority, ago in specs:
        t = await store.submit(
            name, queue="q", priority=priority, run_at=base - timedelta(seconds=ago)
        )
        ids[t.id] = name
    return ids


async def test_claim_order_one_at_a_time(store: TaskStore) -> None:
    names = await _ordered_fixture(store)
    order = []
    while claimed := await store.claim("q", worker_id="w"):
        assert len(claimed) == 1
        order.append(names[claimed[0].id])
    assert order == ["c", "b", "f", "a", "d", "e"]


async def test_claim_order_in_one_batch(store: TaskStore) -> None:
    names = await _ordered_fixture(store)
    claimed = await store.claim("q", worker_id="w", limit=10)
    assert [names[t.id] for t in claimed] == ["c", "b", "f", "a", "d", "e"]


async def test_equal_tasks_come_in_submit_order(store: TaskStore) -> None:
    submitted = await store.submit_many([{"name": f"t{i}", "queue": "q"} for i in range(12)])
    submitted += [await store.submit(f"t{i}", queue="q") for i in range(12, 16)]
    order = []
    while claimed := await store.claim("q", worker_id="w", limit=3):
        order += [t.id for t in claimed]
    assert order == [t.id for t in submitted]


async def test_priority_beats_age(store: TaskStore) -> None:
    old = await store.submit("old", queue="q", run_at=utcnow() - timedelta(hours=1))
    urgent = await store.submit("urgent", queue="q", priority=1)
    first, second = await store.claim("q", worker_id="w", limit=2)
    assert (first.id, second.id) == (urgent.id, old.id)


async def test_limit(store: TaskStore) -> None:
    await store.submit_many([{"name": "t", "queue": "q"} for _ in range(10)])
    sizes = [len(await store.claim("q", worker_id="w", limit=4)) for _ in range(4)]
    assert sizes == [4, 4, 2, 0]


async def test_claim_from_empty_or_unknown_queue(store: TaskStore) -> None:
    assert await store.claim("nothing-here", worker_id="w") == []
    await store.submit("t", queue="q")
    assert await store.claim("other", worker_id="w") == []
    assert len(await store.claim("q", worker_id="w")) == 1
    assert await store.claim("q", worker_id="w") == []


async def test_claim_across_several_queues(store: TaskStore) -> None:
    a = await store.submit("a", queue="q1")
    b = await store.submit("b", queue="q2", priority=2)
    c = await store.submit("c", queue="q3", priority=9)
    d = await store.submit("d", queue="q1", priority=1)
    claimed = await store.claim(["q1", "q2"], worker_id="w", limit=10)
    assert [t.id for t in claimed] == [b.id, d.id, a.id]
    assert await store.claim(("q1", "q2"), worker_id="w") == []
    [only] = await store.claim(["q3"], worker_id="w")
    assert only.id == c.id


async def test_claim_skips_tasks_not_yet_due(store: TaskStore) -> None:
    later = await store.submit("later", queue="q", priority=10, delay=60)
    now = await store.submit("now", queue="q")
    claimed = await store.claim("q", worker_id="w", limit=5)
    assert [t.id for t in claimed] == [now.id]
    assert (await store.get(later.id)).status is Status.QUEUED  # type: ignore[union-attr]


async def test_claim_writes_attempt_lease_and_worker(store: TaskStore) -> None:
    task = await store.submit("t", queue="q")
    before = utcnow()
    [claimed] = await store.claim("q", worker_id="worker-1", lease=12)
    after = utcnow()
    assert claimed.id == task.id
    assert claimed.status is Status.RUNNING
    assert claimed.attempt == 1
    assert claimed.worker_id == "worker-1"
    assert claimed.lease_expires_at is not None and is_utc(claimed.lease_expires_at)
    assert before + timedelta(seconds=11) <= claimed.lease_expires_at
    assert claimed.lease_expires_at <= after + timedelta(seconds=13)
    assert claimed.started_at is not None and is_utc(claimed.started_at)
    assert claimed.finished_at is None
    assert await store.get(task.id) == claimed


async def test_default_lease_is_30_seconds(store: TaskStore) -> None:
    await store.submit("t", queue="q")
    [claimed] = await store.claim("q", worker_id="w")
    assert claimed.lease_expires_at is not None and claimed.started_at is not None
    assert seconds(claimed.lease_expires_at - claimed.started_at) == pytest.approx(30, abs=0.5)


async def test_lease_as_timedelta(store: TaskStore) -> None:
    await store.submit("t", queue="q")
    [claimed] = await store.claim("q", worker_id="w", lease=timedelta(minutes=5))
    assert claimed.lease_expires_at is not None and claimed.started_at is not None
    assert seconds(claimed.lease_expires_at - claimed.started_at) == pytest.approx(300, abs=0.5)


async def test_a_claimed_task_is_not_claimed_again_while_leased(store: TaskStore) -> None:
    await store.submit("t", queue="q")
    [first] = await store.claim("q", worker_id="w1", lease=60)
    assert await store.claim("q", worker_id="w2") == []
    # Near the end of the lease, with room for a loaded machine between the calls.
    store.clock_offset = 50
    assert await store.claim("q", worker_id="w2") == []
    current = await store.get(first.id)
    assert current is not None and current.worker_id == "w1" and current.attempt == 1


async def test_claimed_task_is_seen_as_running_by_list_and_get(store: TaskStore) -> None:
    a = await store.submit("a", queue="q")
    b = await store.submit("b", queue="q")
    await store.claim("q", worker_id="w")
    running = (await store.list(status="running")).items
    queued = (await store.list(status=Status.QUEUED)).items
    assert [t.id for t in running] == [a.id]
    assert [t.id for t in queued] == [b.id]
