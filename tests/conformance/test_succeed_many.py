"""succeed_many: many acknowledgements in one transaction, each fenced on its own."""

from __future__ import annotations

from _support import mixed_acks
from conveyor import InvalidArgument, LostLease, NotFound, Status, TaskCancelled
from conveyor.store.base import TaskStore


async def test_each_item_gets_its_own_outcome(store: TaskStore) -> None:
    held, items = await mixed_acks(store)
    ok, stale, cancelled, bad_result, other_worker = held
    outcomes = await store.succeed_many(items)
    assert len(outcomes) == 6
    first = outcomes[0]
    assert not isinstance(first, Exception)
    assert first.status is Status.SUCCEEDED and first.result == {"n": 1}
    assert type(outcomes[1]) is LostLease
    assert isinstance(outcomes[2], TaskCancelled)
    assert isinstance(outcomes[3], InvalidArgument) and outcomes[3].field == "result"
    assert type(outcomes[4]) is LostLease
    assert isinstance(outcomes[5], NotFound)
    # only the first was written; the others are as they were
    after = {t.id: await store.get(t.id) for t in held}
    assert after[ok.id].status is Status.SUCCEEDED  # type: ignore[union-attr]
    for task in (stale, bad_result, other_worker):
        assert after[task.id].status is Status.RUNNING  # type: ignore[union-attr]
    assert after[cancelled.id].status is Status.CANCELLED  # type: ignore[union-attr]


async def test_group_acknowledgements_and_stream_progress(store: TaskStore) -> None:
    await store.subscribe("q", "g")
    first = await store.submit("t", queue="q", partition="p")
    second = await store.submit("t", queue="q", partition="p")
    [held] = await store.claim("q", worker_id="w", group="g", limit=1)
    assert held.id == first.id
    assert await store.claim("q", worker_id="w2", group="g") == []  # stream held
    [done] = await store.succeed_many(
        [{"task_id": held.id, "worker_id": "w", "group": "g", "attempt": held.attempt}]
    )
    assert not isinstance(done, Exception) and done.group == "g"
    [nxt] = await store.claim("q", worker_id="w2", group="g")
    assert nxt.id == second.id
    queue_mode = await store.get(first.id)
    assert queue_mode is not None and queue_mode.status is Status.QUEUED


async def test_empty_and_malformed_batches(store: TaskStore) -> None:
    assert await store.succeed_many([]) == []
    try:
        await store.succeed_many([{"task_id": "x", "worker_id": "w", "colour": "red"}])
    except InvalidArgument as exc:
        assert exc.field == "colour"
    else:  # pragma: no cover - the assertion above is the test
        raise AssertionError("an unknown key must be refused")
