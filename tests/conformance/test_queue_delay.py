"""A queue's default delay (``configure_queue(q, delay=...)``) on both backends: every
kind of submit that gives neither ``delay`` nor ``run_at`` is due that long after
it was created; one that gives either keeps its own."""

from __future__ import annotations

from datetime import timedelta

import pytest

import conveyor
from conveyor.store.base import TaskStore


def _wait(task: conveyor.Task) -> float:
    assert task.run_at is not None and task.created_at is not None
    return (task.run_at - task.created_at).total_seconds()


async def test_every_kind_of_submit_takes_the_queues_delay(store: TaskStore) -> None:
    await store.configure_queue("q", delay=30)
    await store.subscribe("q", "g")
    root = await store.submit("t", queue="q")
    made = [
        root,
        *await store.submit_many([{"name": "t", "queue": "q"}] * 3),
        await store.submit("t", queue="q", key="k"),
        await store.submit("t", queue="q", partition="p"),
        *await store.submit_many([{"name": "t", "queue": "q", "partition": "p"}] * 2),
        await store.submit("t", queue="q", parent=root.id),
        await store.submit("t", queue="q", key="r", conflict="replace"),
        # A batch refusing keys goes step by step: the same rule.
        *await store.submit_many(
            [{"name": "t", "queue": "q", "key": f"x{i}", "conflict": "reject"} for i in range(2)]
        ),
    ]
    assert [_wait(t) for t in made] == [30.0] * len(made)
    for task in made:
        stored = await store.get(task.id)
        assert stored is not None and _wait(stored) == 30.0
    assert await store.claim("q", worker_id="w") == []
    store.clock_offset = 31
    got = await store.claim("q", worker_id="w", limit=100)
    assert got and {t.id for t in got} <= {t.id for t in made}  # due now


async def test_a_submit_that_gives_its_own_delay_or_run_at_keeps_it(store: TaskStore) -> None:
    await store.configure_queue("q", delay=30)
    now = await store.submit("t", queue="q", delay=0)
    later = await store.submit("t", queue="q", delay=5)
    assert _wait(now) == 0 and _wait(later) == 5
    at = now.created_at + timedelta(seconds=2)  # type: ignore[operator]
    fixed = await store.submit("t", queue="q", run_at=at)
    assert fixed.run_at == at
    other = await store.submit("t", queue="other")
    assert _wait(other) == 0
    [got] = await store.claim("q", worker_id="w")
    assert got.id == now.id


async def test_the_delay_is_validated_shown_and_changed(store: TaskStore) -> None:
    with pytest.raises(conveyor.InvalidArgument, match="delay"):
        await store.configure_queue("q", delay=-1)
    assert (await store.get_queue("q"))["delay"] is None
    await store.configure_queue("q", delay=timedelta(minutes=2))
    assert (await store.get_queue("q"))["delay"] == 120
    await store.configure_queue("q", delay=0)
    assert _wait(await store.submit("t", queue="q")) == 0
