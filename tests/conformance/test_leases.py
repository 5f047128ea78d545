"""Leases: heartbeat, expiry recovery, ownership checks, attempt fencing (SPEC §2.2, §3.2)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from _support import ENVELOPE_KEYS, seconds
from conveyor import LostLease, NotFound, Status, Task, TaskCancelled
from conveyor.store.base import TaskStore

Write = Callable[[TaskStore, str, str, int | None], Awaitable[Task]]


async def _succeed(store: TaskStore, task_id: str, worker: str, attempt: int | None) -> Task:
    return await store.succeed(task_id, worker_id=worker, result={"late": True}, attempt=attempt)


async def _heartbeat(store: TaskStore, task_id: str, worker: str, attempt: int | None) -> Task:
    return await store.heartbeat(task_id, worker_id=worker, lease=60, attempt=attempt)


async def _progress(store: TaskStore, task_id: str, worker: str, attempt: int | None) -> Task:
    return await store.progress(
        task_id, worker_id=worker, progress=0.9, message="late", attempt=attempt
    )


async def _fail(store: TaskStore, task_id: str, worker: str, attempt: int | None) -> Task:
    return await store.fail(
        task_id, worker_id=worker, error="late", retryable=False, attempt=attempt
    )


WRITES: list[Write] = [_succeed, _heartbeat, _progress, _fail]
WRITE_IDS = ["succeed", "heartbeat", "progress", "fail"]


# ----------------------------------------------------------------- heartbeat
async def test_heartbeat_extends_the_lease(store: TaskStore) -> None:
    await store.submit("t", queue="q")
    [claimed] = await store.claim("q", worker_id="w1", lease=5)
    assert claimed.lease_expires_at is not None
    store.clock_offset = 3
    beat = await store.heartbeat(claimed.id, worker_id="w1", lease=10)
    assert beat.status is Status.RUNNING and beat.worker_id == "w1" and beat.attempt == 1
    assert beat.lease_expires_at is not None
    # claimed at ~0 for 5 s; extended at ~3 for 10 s: expires ~8 s later than before
    assert seconds(beat.lease_expires_at - claimed.lease_expires_at) == pytest.approx(8, abs=0.5)
    store.clock_offset = 7  # past the original lease: still held
    assert await store.claim("q", worker_id="w2") == []
    store.clock_offset = 12.5
    assert await store.claim("q", worker_id="w2") == []
    store.clock_offset = 14
    [taken] = await store.claim("q", worker_id="w2")
    assert taken.id == claimed.id and taken.attempt == 2


async def test_heartbeat_without_lease_reuses_the_claimed_length(store: TaskStore) -> None:
    await store.submit("t", queue="q")
    [claimed] = await store.claim("q", worker_id="w1", lease=20)
    assert claimed.lease_expires_at is not None
    store.clock_offset = 10
    beat = await store.heartbeat(claimed.id, worker_id="w1")
    assert beat.lease_expires_at is not None
    assert seconds(beat.lease_expires_at - claimed.lease_expires_at) == pytest.approx(10, abs=0.5)


@pytest.mark.parametrize("write", WRITES, ids=WRITE_IDS)
async def test_writes_by_another_worker_raise_lost_lease(store: TaskStore, write: Write) -> None:
    await store.submit("t", queue="q")
    [claimed] = await store.claim("q", worker_id="owner")
    with pytest.raises(LostLease) as info:
        await write(store, claimed.id, "intruder", None)
    assert type(info.value) is LostLease
    assert info.value.task_id == claimed.id
    assert await store.get(claimed.id) == claimed


@pytest.mark.parametrize("write", WRITES, ids=WRITE_IDS)
async def test_writes_to_an_unclaimed_task_raise_lost_lease(store: TaskStore, write: Write) -> None:
    task = await store.submit("t", queue="q")
    with pytest.raises(LostLease):
        await write(store, task.id, "w", None)
    assert await store.get(task.id) == task


@pytest.mark.parametrize("write", WRITES, ids=WRITE_IDS)
async def test_writes_to_an_unknown_task_raise_not_found(store: TaskStore, write: Write) -> None:
    with pytest.raises(NotFound):
        await write(store, "01ARZ3NDEKTSV4RRFFQ69G5FAV", "w", None)


# ------------------------------------------------------------------ recovery
@pytest.mark.parametrize("write", WRITES, ids=WRITE_IDS)
async def test_expired_lease_is_reclaimed_and_the_old_holder_loses_it(
    store: TaskStore, write: Write
) -> None:
    task = await store.submit("t", queue="q")
    [first] = await store.claim("q", worker_id="w1", lease=0.2)
    store.clock_offset = 1
    [second] = await store.claim("q", worker_id="w2", lease=30)
    assert second.id == task.id
    assert second.attempt == 2 and second.worker_id == "w2"
    assert second.status is Status.RUNNING
    snapshot = await store.get(task.id)
    assert snapshot == second
    with pytest.raises(LostLease) as info:
        await write(store, first.id, "w1", None)
    assert not isinstance(info.value, TaskCancelled)
    assert await store.get(task.id) == snapshot
    done = await store.succeed(task.id, worker_id="w2", result=2)
    assert done.status is Status.SUCCEEDED and done.result == 2


async def test_expiry_in_real_time(store: TaskStore) -> None:
    await store.submit("t", queue="q")
    # A second long enough that a loaded machine still makes the next claim within it.
    [first] = await store.claim("q", worker_id="w1", lease=1.0)
    assert await store.claim("q", worker_id="w2") == []
    await asyncio.sleep(1.1)
    [second] = await store.claim("q", worker_id="w2")
    assert second.id == first.id and second.attempt == 2
    with pytest.raises(LostLease):
        await store.heartbeat(first.id, worker_id="w1")


async def test_recovery_without_a_claim_requeues_at_once(store: TaskStore) -> None:
    task = await store.submit("t", queue="q")
    [first] = await store.claim("q", worker_id="w1", lease=0.2)
    store.clock_offset = 1
    await store.maintain()
    recovered = await store.get(task.id)
    assert recovered is not None
    assert recovered.status is Status.QUEUED
    assert recovered.attempt == 1
    assert recovered.worker_id is None and recovered.lease_expires_at is None
    with pytest.raises(LostLease):
        await store.succeed(task.id, worker_id="w1")
    assert await store.get(task.id) == recovered
    # claimable at once, by anyone (the first holder included)
    [again] = await store.claim("q", worker_id="w1")
    assert again.id == first.id and again.attempt == 2


async def test_exhausted_attempts_fail_with_lease_expired(store: TaskStore) -> None:
    task = await store.submit("t", queue="q", max_attempts=1)
    [claimed] = await store.claim("q", worker_id="w1", lease=0.2)
    store.clock_offset = 1
    assert await store.claim("q", worker_id="w2") == []
    failed = await store.get(task.id)
    assert failed is not None
    assert failed.status is Status.FAILED and failed.terminal
    assert failed.attempt == 1
    assert failed.finished_at is not None and failed.lease_expires_at is None
    assert failed.error is not None
    assert set(failed.error) == ENVELOPE_KEYS
    assert failed.error["code"] == "lease_expired"
    with pytest.raises(LostLease):
        await store.succeed(claimed.id, worker_id="w1")
    assert await store.get(task.id) == failed
    assert await store.wait(task.id, timeout=1) == failed


async def test_each_expiry_uses_an_attempt(store: TaskStore) -> None:
    task = await store.submit("t", queue="q", max_attempts=2)
    [a1] = await store.claim("q", worker_id="w", lease=0.2)
    store.clock_offset = 1
    [a2] = await store.claim("q", worker_id="w", lease=0.2)
    assert (a1.attempt, a2.attempt) == (1, 2)
    store.clock_offset = 2
    await store.maintain()
    final = await store.get(task.id)
    assert final is not None and final.status is Status.FAILED
    assert final.error is not None and final.error["code"] == "lease_expired"
    assert await store.claim("q", worker_id="w") == []


@pytest.mark.parametrize("finish", ["succeed", "fail"])
async def test_expired_but_unrecovered_holder_may_still_finish(
    store: TaskStore, finish: str
) -> None:
    task = await store.submit("t", queue="q", max_attempts=1)
    [claimed] = await store.claim("q", worker_id="w1", lease=0.2)
    store.clock_offset = 5
    if finish == "succeed":
        done = await store.succeed(claimed.id, worker_id="w1", result="ok")
        assert done.status is Status.SUCCEEDED and done.result == "ok"
    else:
        done = await store.fail(claimed.id, worker_id="w1", error="no", retryable=False)
        assert done.status is Status.FAILED and done.error is not None
        assert done.error["message"] == "no"
    assert await store.get(task.id) == done
    assert await store.claim("q", worker_id="w2") == []


# ------------------------------------------------------------------- fencing
@pytest.mark.parametrize("write", WRITES, ids=WRITE_IDS)
async def test_stale_attempt_is_fenced_off(store: TaskStore, write: Write) -> None:
    await store.submit("t", queue="q")
    [first] = await store.claim("q", worker_id="w1", lease=0.2)
    store.clock_offset = 1
    [second] = await store.claim("q", worker_id="w1", lease=30)  # the same worker again
    assert second.attempt == first.attempt + 1
    snapshot = await store.get(first.id)
    with pytest.raises(LostLease):
        await write(store, first.id, "w1", first.attempt)
    assert await store.get(first.id) == snapshot
    # the current attempt is accepted
    done = await write(store, first.id, "w1", second.attempt)
    assert done.attempt == second.attempt


async def test_matching_attempt_is_accepted(store: TaskStore) -> None:
    await store.submit("t", queue="q")
    [claimed] = await store.claim("q", worker_id="w")
    beat = await store.heartbeat(claimed.id, worker_id="w", attempt=1)
    assert beat.status is Status.RUNNING
    with pytest.raises(LostLease):
        await store.succeed(claimed.id, worker_id="w", attempt=2)
    done = await store.succeed(claimed.id, worker_id="w", attempt=1)
    assert done.status is Status.SUCCEEDED


async def test_fencing_survives_a_retry_with_reset_attempts(store: TaskStore) -> None:
    task = await store.submit("t", queue="q", max_attempts=1)
    [stale] = await store.claim("q", worker_id="w1", lease=0.2)
    store.clock_offset = 1
    await store.maintain()  # the lease ran out on the last attempt: failed
    expired = await store.get(task.id)
    assert expired is not None and expired.status is Status.FAILED
    await store.retry(task.id, reset_attempts=True)
    [fresh] = await store.claim("q", worker_id="w1", lease=30)
    # The first execution, long expired, reports in: it must not complete the new one.
    with pytest.raises(LostLease):
        await store.succeed(task.id, worker_id="w1", result="stale", attempt=stale.attempt)
    assert await store.get(task.id) == fresh
