"""Snooze: a leased task goes back to run again later without spending an
attempt (SPEC §5), on both backends."""

from __future__ import annotations

from datetime import timedelta

import pytest

from _support import seconds
from conveyor import InvalidArgument, LostLease, Status
from conveyor.store.base import TaskStore


async def test_snooze_requeues_later_without_spending_an_attempt(store: TaskStore) -> None:
    task = await store.submit("poll", queue="q", max_attempts=2)
    [held] = await store.claim("q", worker_id="w", lease=30)
    await store.progress(held.id, worker_id="w", progress=0.5, message="waiting")
    snoozed = await store.snooze(held.id, worker_id="w", delay=60, attempt=held.attempt)
    assert snoozed.status is Status.QUEUED
    assert snoozed.worker_id is None and snoozed.lease_expires_at is None
    assert snoozed.progress is None and snoozed.progress_message is None
    assert 55 <= seconds(snoozed.run_at - held.started_at) <= 65  # type: ignore[operator]
    # The attempt number keeps counting (it is the fence); the budget grows with it.
    assert (snoozed.attempt, snoozed.max_attempts) == (1, 3)
    assert await store.claim("q", worker_id="w") == []  # not before its time
    again = await store.get(task.id)
    assert again is not None and again.status is Status.QUEUED


async def test_a_snoozed_task_keeps_its_attempts_left(store: TaskStore) -> None:
    await store.submit("poll", queue="q", max_attempts=1)
    for _ in range(3):  # snoozed three times, it still has its one real attempt
        [held] = await store.claim("q", worker_id="w")
        await store.snooze(held.id, worker_id="w", delay=timedelta(0), attempt=held.attempt)
    [last] = await store.claim("q", worker_id="w")
    assert (last.attempt, last.max_attempts) == (4, 4)
    failed = await store.fail(last.id, worker_id="w", error="boom", attempt=last.attempt)
    assert failed.status is Status.FAILED  # the one attempt was spent, nothing more


async def test_snooze_is_ownership_checked_and_fenced(store: TaskStore) -> None:
    await store.submit("poll", queue="q")
    [held] = await store.claim("q", worker_id="w")
    with pytest.raises(LostLease):
        await store.snooze(held.id, worker_id="intruder", delay=1)
    with pytest.raises(LostLease):
        await store.snooze(held.id, worker_id="w", delay=1, attempt=held.attempt + 1)
    with pytest.raises(InvalidArgument) as caught:
        await store.snooze(held.id, worker_id="w", delay=-1)
    assert caught.value.field == "delay"
    unchanged = await store.get(held.id)
    assert unchanged is not None and unchanged.status is Status.RUNNING
    assert unchanged.worker_id == "w"


async def test_a_snoozed_head_holds_its_partition(store: TaskStore) -> None:
    first = await store.submit("step", {"n": 1}, queue="q", partition="p")
    await store.submit("step", {"n": 2}, queue="q", partition="p")
    [head] = await store.claim("q", worker_id="w", limit=1)
    assert head.id == first.id
    await store.snooze(head.id, worker_id="w", delay=60, attempt=head.attempt)
    assert await store.claim("q", worker_id="other", limit=5) == []  # FIFO: nothing overtakes


async def test_snooze_in_a_group_leaves_queue_mode_alone(store: TaskStore) -> None:
    await store.subscribe("q", "g")
    task = await store.submit("poll", queue="q")
    [mine] = await store.claim("q", worker_id="gw", group="g")
    await store.snooze(mine.id, worker_id="gw", group="g", delay=60, attempt=mine.attempt)
    [plain] = await store.claim("q", worker_id="w")
    assert plain.id == task.id and plain.max_attempts == 3
    view = await store.get(task.id, group="g")
    assert view is not None and view.status is Status.QUEUED and view.max_attempts == 4


def test_snooze_blocks_in_the_sync_store(sync_store: object) -> None:
    from conveyor import SyncStore

    assert isinstance(sync_store, SyncStore)
    sync_store.submit("poll", queue="q")
    [held] = sync_store.claim("q", worker_id="w")
    snoozed = sync_store.snooze(held.id, worker_id="w", delay=0.0, attempt=held.attempt)
    assert snoozed.status is Status.QUEUED
