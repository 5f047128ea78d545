"""Idempotency keys: reuse, reject, replace, and one task per key under concurrency
(SPEC §2.1)."""

from __future__ import annotations

import asyncio
import json

import pytest

from _support import pg_deadlocks, run_together
from conveyor import AlreadyExists, ConveyorError, Status, TaskCancelled
from conveyor.store.base import TaskStore


async def test_key_is_stored_and_found(store: TaskStore) -> None:
    task = await store.submit("t", {"n": 1}, key="order-1")
    assert task.key == "order-1"
    assert await store.get_by_key("order-1") == task


async def test_reuse_returns_the_existing_task_unchanged(store: TaskStore) -> None:
    first = await store.submit("t", {"n": 1}, key="k", queue="q1", priority=1)
    again = await store.submit("other", {"n": 2}, key="k", queue="q2", priority=9)
    assert again == first
    assert again.payload == {"n": 1} and again.queue == "q1"
    assert len((await store.list()).items) == 1


async def test_reuse_is_the_default_and_returns_a_finished_task(store: TaskStore) -> None:
    first = await store.submit("t", key="k", queue="q")
    await store.claim("q", worker_id="w")
    done = await store.succeed(first.id, worker_id="w", result="r")
    again = await store.submit("t", key="k", queue="q", conflict="reuse")
    assert again == done
    assert again.status is Status.SUCCEEDED
    assert await store.claim("q", worker_id="w") == []


async def test_reject_raises_and_writes_nothing(store: TaskStore) -> None:
    first = await store.submit("t", {"n": 1}, key="k")
    with pytest.raises(AlreadyExists) as info:
        await store.submit("t", {"n": 2}, key="k", conflict="reject")
    assert info.value.key == "k"
    assert info.value.task_id == first.id
    assert isinstance(info.value, ConveyorError)
    assert info.value.code == "already_exists"
    assert (await store.list()).items == [first]
    assert await store.get_by_key("k") == first


async def test_reject_with_a_new_key_inserts(store: TaskStore) -> None:
    task = await store.submit("t", key="fresh", conflict="reject")
    assert await store.get_by_key("fresh") == task


async def test_replace_cancels_a_queued_task(store: TaskStore) -> None:
    old = await store.submit("t", {"v": 1}, key="k", queue="q")
    new = await store.submit("t", {"v": 2}, key="k", queue="q", conflict="replace")
    assert new.id != old.id
    assert new.status is Status.QUEUED and new.key == "k" and new.payload == {"v": 2}
    cancelled = await store.get(old.id)
    assert cancelled is not None and cancelled.status is Status.CANCELLED
    assert await store.get_by_key("k") == new
    claimed = await store.claim("q", worker_id="w", limit=5)
    assert [t.id for t in claimed] == [new.id]


async def test_replace_cancels_a_running_task_and_its_holder_is_told(store: TaskStore) -> None:
    old = await store.submit("t", key="k", queue="q")
    [held] = await store.claim("q", worker_id="w")
    new = await store.submit("t", key="k", queue="q", conflict="replace")
    with pytest.raises(TaskCancelled):
        await store.succeed(held.id, worker_id="w")
    current = await store.get(old.id)
    assert current is not None and current.status is Status.CANCELLED
    assert await store.get_by_key("k") == new


async def test_replace_leaves_a_terminal_task_unchanged(store: TaskStore) -> None:
    old = await store.submit("t", key="k", queue="q")
    await store.claim("q", worker_id="w")
    done = await store.succeed(old.id, worker_id="w", result=1)
    new = await store.submit("t", key="k", queue="q", conflict="replace")
    assert new.id != old.id
    assert await store.get(old.id) == done
    assert await store.get_by_key("k") == new


async def test_replace_with_a_new_key_inserts(store: TaskStore) -> None:
    task = await store.submit("t", key="fresh", conflict="replace")
    assert await store.get_by_key("fresh") == task
    assert len((await store.list()).items) == 1


async def test_keys_are_unique_across_queues(store: TaskStore) -> None:
    first = await store.submit("a", key="k", queue="q1")
    second = await store.submit("b", key="k", queue="q2")
    assert second == first


async def test_one_key_twice_in_one_batch_makes_one_task(store: TaskStore) -> None:
    a, b = await store.submit_many([{"name": "t", "key": "k"}, {"name": "t", "key": "k"}])
    assert a.id == b.id
    assert len((await store.list()).items) == 1


async def test_concurrent_submits_of_one_key_make_one_task(store: TaskStore) -> None:
    tasks = await asyncio.gather(*(store.submit("t", {"i": i}, key="hot") for i in range(20)))
    assert len({t.id for t in tasks}) == 1
    assert len((await store.list()).items) == 1
    assert await store.get_by_key("hot") == tasks[0]


async def test_concurrent_rejects_let_exactly_one_through(store: TaskStore) -> None:
    results = await asyncio.gather(
        *(store.submit("t", {"i": i}, key="hot", conflict="reject") for i in range(12)),
        return_exceptions=True,
    )
    created = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, AlreadyExists)]
    assert len(created) == 1 and len(refused) == 11
    assert all(e.task_id == created[0].id for e in refused)
    assert len((await store.list()).items) == 1


async def test_submits_of_one_key_from_two_processes_make_one_task(
    store: TaskStore, store_url: str
) -> None:
    outputs = await asyncio.to_thread(
        run_together, [["submit_key", store_url, "shared", "10"] for _ in range(2)]
    )
    ids = [task_id for line in outputs for task_id in json.loads(line)]
    assert len(ids) == 20
    assert len(set(ids)) == 1
    items = (await store.list()).items
    assert [t.id for t in items] == ids[:1]


async def test_keyed_batches_from_two_processes_make_one_task_per_key(
    store: TaskStore, store_url: str
) -> None:
    """Two processes, each sending four batches at once over the same 30 keys in
    shuffled orders (some partitioned): every key makes one task, and every answer
    for a key, in either process, is that task."""
    outputs = await asyncio.to_thread(
        run_together, [["submit_keys", store_url, str(seed), "30"] for seed in (1, 2)]
    )
    first, second = (json.loads(line) for line in outputs)
    assert first == second and len(first) == 30
    items = (await store.list(limit=100)).items
    assert sorted(t.id for t in items) == sorted(first.values())
    assert {t.key: t.id for t in items} == first


async def test_single_keyed_submits_of_every_kind_from_two_processes_keep_one_task_per_key(
    store: TaskStore, store_url: str, backend: str
) -> None:
    """Two processes submit over the same 12 keys at once, three rounds: a task
    with a partition (reuse), with a parent (reuse), with a partition replacing
    the holder, or a batch of three keys (two of them partitioned) reusing or
    replacing their holders. Every
    key ends with one live task, the one that holds it; every other task either
    process was answered with for that key was replaced (cancelled). On Postgres
    no deadlock was broken on the way: those kinds take the keys, the groups and
    the streams in one order."""
    before = pg_deadlocks(store_url) if backend == "postgres" else 0
    outputs = await asyncio.to_thread(
        run_together, [["submit_mixed", store_url, str(seed), "12", "3"] for seed in (1, 2)]
    )
    answers = [tuple(entry) for line in outputs for entry in json.loads(line)]
    kinds = {"partition", "parent", "replace", "batch", "batch replace"}
    assert {kind for _, _, kind in answers} == kinds
    for key in {key for key, _, _ in answers}:
        holder = await store.get_by_key(key)
        assert holder is not None and holder.status is Status.QUEUED, key
        for _, task_id, _ in [a for a in answers if a[0] == key and a[1] != holder.id]:
            task = await store.get(task_id)
            assert task is not None and task.status is Status.CANCELLED, (key, task_id)
    page = await store.list(queue="mixed", limit=500)
    live = [t for t in page.items if t.key is not None and t.status is not Status.CANCELLED]
    assert sorted(t.key for t in live if t.key) == sorted(f"k{i}" for i in range(12))
    if backend == "postgres":
        assert pg_deadlocks(store_url, settle=True) == before
