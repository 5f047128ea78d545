"""Dead-letter queues (``configure_queue(q, dead_letter=...)``) on both backends: a
delivery that fails for good or is evicted sends a task to the dead-letter queue
in the same transaction, one per task and group; the original stays as it was."""

from __future__ import annotations

from datetime import datetime

import pytest

import conveyor
from conveyor import Status
from conveyor.store.base import TaskStore


async def _letters(store: TaskStore, queue: str = "dlq") -> list[conveyor.Task]:
    return list((await store.list(queue=queue, limit=100)).items)


async def test_exhausted_attempts_send_the_task_to_the_dead_letter_queue(
    store: TaskStore,
) -> None:
    await store.configure_queue("q", dead_letter="dlq")
    task = await store.submit(
        "charge", {"order": 7}, queue="q", max_attempts=2, metadata={"who": "me"}
    )
    for attempt in (1, 2):
        [got] = await store.claim("q", worker_id="w")
        assert got.attempt == attempt
        assert await _letters(store) == []  # not while attempts remain
        await store.fail(got.id, worker_id="w", error=ValueError("card declined"), delay=0)
    [letter] = await _letters(store)
    original = await store.get(task.id)
    assert original is not None and original.status is Status.FAILED
    assert (letter.name, letter.payload, letter.queue) == ("charge", {"order": 7}, "dlq")
    assert letter.status is Status.QUEUED and letter.parent_id == task.id
    assert letter.metadata["who"] == "me"
    info = letter.metadata["dead_letter"]
    assert info["task_id"] == task.id and info["queue"] == "q" and info["group"] is None
    assert info["status"] == "failed" and info["attempts"] == 2
    assert info["error"]["message"] == "card declined"
    assert datetime.fromisoformat(info["failed_at"]) == original.finished_at
    assert [c.id for c in await store.children(task.id)] == [letter.id]
    # A worker of the dead-letter queue gets it like any task.
    [claimed] = await store.claim("dlq", worker_id="w")
    assert claimed.id == letter.id


async def test_a_permanent_failure_is_dead_lettered_at_once(store: TaskStore) -> None:
    await store.configure_queue("q", dead_letter="dlq")
    await store.submit("t", queue="q", max_attempts=5)
    [got] = await store.claim("q", worker_id="w")
    await store.fail(got.id, worker_id="w", error="bad input", retryable=False)
    [letter] = await _letters(store)
    assert letter.metadata["dead_letter"]["attempts"] == 1


async def test_a_lease_lost_on_the_last_attempt_is_dead_lettered(store: TaskStore) -> None:
    await store.configure_queue("q", dead_letter="dlq")
    task = await store.submit("t", queue="q", max_attempts=1)
    await store.claim("q", worker_id="w1", lease=0.2)
    store.clock_offset = 1
    assert await store.claim("q", worker_id="w2") == []
    [letter] = await _letters(store)
    assert letter.parent_id == task.id
    assert letter.metadata["dead_letter"]["error"]["code"] == "lease_expired"


async def test_evicted_tasks_are_dead_lettered_one_per_group(store: TaskStore) -> None:
    """Eviction (never claimed within max_wait) of queue mode and a group: one
    dead-letter task for each evicted row, the group named in its metadata."""
    await store.configure_queue("q", max_wait=30, dead_letter="dlq")
    await store.subscribe("q", "g")
    task = await store.submit("t", {"n": 1}, queue="q")
    store.clock_offset = 31
    assert (await store.maintain())["evicted"] == 2
    letters = await _letters(store)
    assert sorted((x.metadata["dead_letter"]["group"] or "") for x in letters) == ["", "g"]
    assert {x.metadata["dead_letter"]["status"] for x in letters} == {"evicted"}
    assert {x.parent_id for x in letters} == {task.id}
    assert (await store.get(task.id, group="g")).status is Status.EVICTED  # type: ignore[union-attr]


async def test_a_group_failure_is_its_own_letter(store: TaskStore) -> None:
    await store.configure_queue("q", dead_letter="dlq")
    await store.subscribe("q", "g")
    task = await store.submit("t", queue="q", max_attempts=1)
    [got] = await store.claim("q", worker_id="w", group="g")
    await store.fail(got.id, worker_id="w", group="g", error="boom")
    [letter] = await _letters(store)
    assert letter.metadata["dead_letter"]["group"] == "g"
    # Queue mode's delivery is untouched and still claimable.
    assert [t.id for t in await store.claim("q", worker_id="w")] == [task.id]


async def test_a_retried_original_runs_again_and_no_letter_without_the_setting(
    store: TaskStore,
) -> None:
    await store.configure_queue("q", dead_letter="dlq")
    task = await store.submit("t", queue="q", max_attempts=1)
    [got] = await store.claim("q", worker_id="w")
    await store.fail(got.id, worker_id="w", error="boom")
    back = await store.retry(task.id)
    assert back is not None and back.status is Status.QUEUED
    await store.configure_queue("q", dead_letter="")
    assert (await store.get_queue("q"))["dead_letter"] is None
    [again] = await store.claim("q", worker_id="w")
    await store.fail(again.id, worker_id="w", error="boom")
    assert len(await _letters(store)) == 1  # only the first failure's


async def test_the_setting_is_validated_and_shown(store: TaskStore) -> None:
    with pytest.raises(conveyor.InvalidArgument, match="dead_letter"):
        await store.configure_queue("q", dead_letter="q")
    with pytest.raises(conveyor.InvalidArgument, match="dead_letter"):
        await store.configure_queue("q", dead_letter="x" * 256)
    assert (await store.get_queue("q"))["dead_letter"] is None
    await store.configure_queue("q", dead_letter="dlq")
    assert (await store.get_queue("q"))["dead_letter"] == "dlq"
    assert [s["dead_letter"] for s in await store.queue_settings()] == ["dlq"]


async def test_racing_recoveries_write_one_letter_per_failure(
    store: TaskStore, store_url: str
) -> None:
    """Leases lost on their last attempt, recovered by claimers of two separate
    stores at once and by maintain(): each failure makes exactly one letter."""
    import asyncio

    await store.configure_queue("q", dead_letter="dlq")
    tasks = [await store.submit("t", {"i": i}, queue="q", max_attempts=1) for i in range(20)]
    assert len(await store.claim("q", worker_id="gone", limit=20, lease=0.2)) == 20
    async with conveyor.connect(store_url) as other:
        for st in (store, other):
            st.clock_offset = 1
        await asyncio.gather(
            store.claim("q", worker_id="a"), other.claim("q", worker_id="b"), other.maintain()
        )
    letters = await _letters(store)
    assert sorted(x.parent_id or "" for x in letters) == sorted(t.id for t in tasks)
