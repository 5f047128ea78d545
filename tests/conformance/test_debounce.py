"""A queue's debounce (``configure_queue(q, debounce=...)``) on both backends: a
partition's head is claimable only once the partition's newest task is that old,
so a burst to one partition is handled together; an unpartitioned task only once
it is itself that old. Time is moved with the store's clock offset."""

from __future__ import annotations

import pytest

import conveyor
from conveyor import InvalidArgument
from conveyor.store.base import TaskStore

D = 10.0  # the quiet period, seconds


async def _ids(store: TaskStore, **claim: object) -> list[str]:
    got = await store.claim("q", worker_id="w", limit=10, per_stream=10, **claim)  # type: ignore[arg-type]
    return [t.id for t in got]


async def test_a_burst_to_a_partition_is_claimed_once_it_goes_quiet(store: TaskStore) -> None:
    await store.configure_queue("q", debounce=D)
    assert (await store.get_queue("q"))["debounce"] == D
    first = await store.submit("t", queue="q", partition="p")
    store.clock_offset = 4
    second = await store.submit("t", queue="q", partition="p")
    store.clock_offset = 8
    third, fourth = await store.submit_many([{"name": "t", "queue": "q", "partition": "p"}] * 2)
    # The head is 10 s old, the newest 3 s: nothing yet.
    store.clock_offset = 11
    assert await _ids(store) == []
    store.clock_offset = 17.9
    assert await _ids(store) == []
    store.clock_offset = 18.1
    assert await _ids(store) == [first.id, second.id, third.id, fourth.id]


async def test_a_task_submitted_while_the_head_runs_holds_the_next_head(
    store: TaskStore,
) -> None:
    await store.configure_queue("q", debounce=D)
    head, second = await store.submit_many([{"name": "t", "queue": "q", "partition": "p"}] * 2)
    store.clock_offset = D + 1
    [held] = await store.claim("q", worker_id="w")
    assert held.id == head.id
    store.clock_offset = D + 5
    late = await store.submit("t", queue="q", partition="p")  # the partition is busy again
    await store.succeed(held.id, worker_id="w")
    assert await _ids(store) == []  # second is old, but late is 0 s old
    store.clock_offset = 2 * D + 5.5
    assert await _ids(store) == [second.id, late.id]


async def test_an_unpartitioned_task_waits_until_it_is_that_old(store: TaskStore) -> None:
    await store.configure_queue("q", debounce=D)
    plain = await store.submit("t", queue="q")
    longer = await store.submit("t", queue="q", delay=30)  # a longer wait of its own is kept
    shorter = await store.submit("t", queue="q", delay=2)
    batch = await store.submit_many([{"name": "t", "queue": "q", "key": "k"}])
    for task in (plain, shorter, *batch):
        assert task.run_at is not None and task.created_at is not None
        assert (task.run_at - task.created_at).total_seconds() == D
    assert longer.run_at is not None and longer.created_at is not None
    assert (longer.run_at - longer.created_at).total_seconds() == 30
    store.clock_offset = D - 0.5
    assert await _ids(store) == []
    store.clock_offset = D + 0.5
    assert set(await _ids(store)) == {plain.id, shorter.id, batch[0].id}


async def test_each_group_waits_for_the_quiet_period_too(store: TaskStore) -> None:
    await store.configure_queue("q", debounce=D)
    await store.subscribe("q", "g")
    a = await store.submit("t", queue="q", partition="p")
    store.clock_offset = 5
    b = await store.submit("t", queue="q", partition="p")
    store.clock_offset = 12
    assert await _ids(store, group="g") == []
    store.clock_offset = 15.5
    assert await _ids(store, group="g") == [a.id, b.id]
    assert await _ids(store) == [a.id, b.id]


async def test_zero_clears_it_and_other_queues_are_untouched(store: TaskStore) -> None:
    await store.configure_queue("q", debounce=D)
    await store.configure_queue("q", debounce=0)
    assert (await store.get_queue("q"))["debounce"] is None
    task = await store.submit("t", queue="q", partition="p")
    other = await store.submit("t", queue="other", partition="p")
    assert await _ids(store) == [task.id]
    got = await store.claim("other", worker_id="w")
    assert [t.id for t in got] == [other.id]


async def test_another_store_sees_the_setting_at_once(store_url: str) -> None:
    async with conveyor.connect(store_url) as one, conveyor.connect(store_url) as two:
        await two.submit("t", queue="q", partition="p")  # two has used the queue before
        task_two = await two.submit("t", queue="q", partition="p")
        await one.configure_queue("q", debounce=D)
        newest = await two.submit("t", queue="q", partition="p")
        assert newest.run_at is not None and newest.created_at is not None
        assert (newest.run_at - newest.created_at).total_seconds() == D
        assert await one.claim("q", worker_id="w") == []
        one.clock_offset = D + 1
        got = await one.claim("q", worker_id="w", limit=5, per_stream=5)
        assert got[-1].id == newest.id and task_two.id in {t.id for t in got}


async def test_bad_values_are_refused(store: TaskStore) -> None:
    for bad in (-1, "soon", True):
        with pytest.raises(InvalidArgument, match="debounce"):
            await store.configure_queue("q", debounce=bad)  # type: ignore[arg-type]
    assert (await store.get_queue("q"))["debounce"] is None


async def test_a_step_by_step_submit_holds_the_partition_the_same(store: TaskStore) -> None:
    """A batch refusing keys is written step by step (its own statements): the
    partition waits the same quiet period."""
    await store.configure_queue("q", debounce=D)
    first = await store.submit("t", queue="q", partition="p")
    store.clock_offset = 6
    later = await store.submit_many(
        [
            {"name": "t", "queue": "q", "partition": "p", "key": f"k{i}", "conflict": "reject"}
            for i in range(2)
        ]
    )
    store.clock_offset = 12
    assert await _ids(store) == []
    store.clock_offset = 16.5
    assert await _ids(store) == [first.id, *(t.id for t in later)]
