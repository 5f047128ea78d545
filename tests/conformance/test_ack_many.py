"""ack_many: succeed_many without reading the tasks back (the worker's group commit)."""

from __future__ import annotations

import asyncio

import pytest

from _support import mixed_acks
from conveyor import InvalidArgument, LostLease, NotFound, Status, TaskCancelled
from conveyor.store.base import TaskStore


async def test_each_item_gets_none_or_its_error(store: TaskStore) -> None:
    held, items = await mixed_acks(store)
    ok, stale, _, bad_result, other_worker = held
    outcomes = await store.ack_many(items)
    assert outcomes[0] is None
    assert type(outcomes[1]) is LostLease
    assert isinstance(outcomes[2], TaskCancelled)
    assert isinstance(outcomes[3], InvalidArgument) and outcomes[3].field == "result"
    assert type(outcomes[4]) is LostLease
    assert isinstance(outcomes[5], NotFound)
    done = await store.get(ok.id)
    assert done is not None and done.status is Status.SUCCEEDED and done.result == {"n": 1}
    for task in (stale, bad_result, other_worker):
        after = await store.get(task.id)
        assert after is not None and after.status is Status.RUNNING


async def test_partitioned_acks_free_the_stream(store: TaskStore) -> None:
    first, second = await store.submit_many(
        [{"name": "t", "queue": "q", "partition": "p"} for _ in range(2)]
    )
    [got] = await store.claim("q", worker_id="w")
    assert got.id == first.id
    assert await store.claim("q", worker_id="other") == []  # the stream is held
    assert await store.ack_many([{"task_id": got.id, "worker_id": "w"}]) == [None]
    [nxt] = await store.claim("q", worker_id="other")
    assert nxt.id == second.id


async def test_a_stream_stays_held_while_a_later_task_of_it_is_leased(store: TaskStore) -> None:
    # Its head queued again (handed back) while later tasks are still leased: an
    # acknowledgement of one of those must not free the stream for anyone else.
    a, b, c = await store.submit_many(
        [{"name": "t", "queue": "q", "partition": "p"} for _ in range(3)]
    )
    held = await store.claim("q", worker_id="w", limit=3, partition="p")
    assert [t.id for t in held] == [a.id, b.id, c.id]
    await store.release(a.id, worker_id="w")
    assert await store.claim("q", worker_id="other") == []
    assert await store.ack_many([{"task_id": b.id, "worker_id": "w"}]) == [None]
    assert await store.claim("q", worker_id="other") == []  # c is still leased
    assert await store.ack_many([{"task_id": c.id, "worker_id": "w"}]) == [None]
    [head] = await store.claim("q", worker_id="other")
    assert head.id == a.id


async def test_mixed_batch_and_groups(store: TaskStore) -> None:
    await store.subscribe("q", "g")
    await store.submit_many(
        [{"name": "t", "queue": "q"}, {"name": "t", "queue": "q", "partition": "p"}]
    )
    mine = await store.claim("q", worker_id="w", limit=2)
    theirs = await store.claim("q", worker_id="w", limit=2, group="g")
    mine += await store.claim("q", worker_id="w", limit=2)
    theirs += await store.claim("q", worker_id="w", limit=2, group="g")
    assert len(mine) == len(theirs) == 2
    items = [{"task_id": t.id, "worker_id": "w", "attempt": t.attempt} for t in mine]
    items += [{"task_id": t.id, "worker_id": "w", "group": "g"} for t in theirs]
    assert await store.ack_many(items) == [None] * 4
    for t in mine:
        assert (await store.get(t.id)).status is Status.SUCCEEDED  # type: ignore[union-attr]
        assert (await store.get(t.id, group="g")).status is Status.SUCCEEDED  # type: ignore[union-attr]
    # a second ack of the same tasks fails the fence, item by item
    again = await store.ack_many(items[:1])
    assert type(again[0]) is LostLease


async def test_ack_wakes_a_waiter(store: TaskStore) -> None:
    task = await store.submit("t", queue="q")
    [got] = await store.claim("q", worker_id="w")
    waiter = asyncio.create_task(store.wait(task.id, timeout=5))
    await asyncio.sleep(0.05)
    assert await store.ack_many([{"task_id": got.id, "worker_id": "w"}]) == [None]
    done = await asyncio.wait_for(waiter, 5)
    assert done.status is Status.SUCCEEDED


async def test_bad_items_are_refused_before_anything_is_written(store: TaskStore) -> None:
    task = await store.submit("t", queue="q")
    [got] = await store.claim("q", worker_id="w")
    for bad in ([{"task_id": got.id}], [{"task_id": got.id, "worker_id": "w", "x": 1}], ["x"]):
        try:
            await store.ack_many(bad)  # type: ignore[arg-type]
        except InvalidArgument:
            pass
        else:  # pragma: no cover
            raise AssertionError(f"{bad!r} was accepted")
    assert (await store.get(task.id)).status is Status.RUNNING  # type: ignore[union-attr]


@pytest.mark.parametrize("partitioned", [None, False, True])
async def test_the_partitioned_hint_picks_a_path_not_an_outcome(
    store: TaskStore, partitioned: bool | None
) -> None:
    await store.submit("t", queue="q", partition="p")
    waiting = await store.submit("t", queue="q", partition="p")
    await store.submit("t", queue="q")
    got = await store.claim("q", worker_id="w", limit=5, per_stream=1)
    assert len(got) == 2
    items = [{"task_id": t.id, "worker_id": "w", "attempt": t.attempt} for t in got]
    items.append({"task_id": waiting.id, "worker_id": "w"})  # not leased: fails its fence
    outcomes = await store.ack_many(items, partitioned=partitioned)
    assert outcomes[:2] == [None, None] and isinstance(outcomes[2], LostLease)
    # The stream moved on: its second task is claimable now.
    [second] = await store.claim("q", worker_id="w", limit=5)
    assert second.id == waiting.id and second.status is Status.RUNNING


async def test_a_result_over_the_stores_limit_is_refused_and_writes_nothing(
    store: TaskStore,
) -> None:
    """ack_many (the worker's acknowledgement) holds results to ``max_result_size``
    as succeed() does: the item gets InvalidArgument naming ``result``, the task
    stays leased, and the other items of the batch are acknowledged."""
    store.max_result_size = 100
    big, small = await store.submit_many([{"name": "t", "queue": "q"} for _ in range(2)])
    claimed = await store.claim("q", worker_id="w", limit=2)
    assert {t.id for t in claimed} == {big.id, small.id}
    outcomes = await store.ack_many(
        [
            {"task_id": big.id, "worker_id": "w", "result": "x" * 1000},
            {"task_id": small.id, "worker_id": "w", "result": "ok"},
        ]
    )
    assert isinstance(outcomes[0], InvalidArgument) and outcomes[0].field == "result"
    assert "over the limit" in str(outcomes[0])
    assert outcomes[1] is None
    after = await store.get(big.id)
    assert after is not None and after.status is Status.RUNNING and after.result is None
    done = await store.get(small.id)
    assert done is not None and done.status is Status.SUCCEEDED and done.result == "ok"
