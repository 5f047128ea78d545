"""Task dependencies: ``submit(..., after=[...])`` (issue 29 §4), on both backends."""

from __future__ import annotations

import pytest

from conveyor import InvalidArgument, Permanent, Status, Task
from conveyor.store.base import TaskStore

UNKNOWN = "01ARZ3NDEKTSV4RRFFQ69G5FAV"


async def run(store: TaskStore, queue: str = "q", *, result: object = None) -> list[Task]:
    """Claim everything claimable on ``queue`` and succeed it; the tasks run."""
    held = await store.claim(queue, worker_id="w", limit=100)
    for task in held:
        await store.succeed(task.id, worker_id="w", result=result or {"by": task.name})
    return held


async def status(store: TaskStore, task: Task) -> Status:
    found = await store.get(task.id)
    assert found is not None
    return found.status


async def test_chain_runs_in_order(store: TaskStore) -> None:
    a = await store.submit("a", queue="q")
    b = await store.submit("b", queue="q", after=[a])
    c = await store.submit("c", queue="q", after=[b.id])
    assert (b.status, c.status) == (Status.WAITING, Status.WAITING)
    assert not b.terminal
    assert [t.name for t in await run(store)] == ["a"]
    assert await status(store, b) is Status.QUEUED
    assert await status(store, c) is Status.WAITING
    assert [t.name for t in await run(store)] == ["b"]
    assert [t.name for t in await run(store)] == ["c"]
    assert await run(store) == []


async def test_waiting_is_not_claimable(store: TaskStore) -> None:
    a = await store.submit("a", queue="q")
    await store.submit("b", queue="q", after=[a])
    held = await store.claim("q", worker_id="w", limit=10)
    assert [t.name for t in held] == ["a"]
    assert await store.claim("q", worker_id="w", limit=10) == []


async def test_fan_out_fan_in(store: TaskStore) -> None:
    root = await store.submit("root", queue="q")
    kids = [await store.submit(f"k{i}", queue="q", after=[root]) for i in range(5)]
    last = await store.submit("last", queue="q", after=kids)
    assert [t.name for t in await run(store)] == ["root"]
    ran = await store.claim("q", worker_id="w", limit=100)
    assert sorted(t.name for t in ran) == [f"k{i}" for i in range(5)]
    for i, task in enumerate(ran):
        await store.succeed(task.id, worker_id="w", result=i)
        if i < len(ran) - 1:
            assert await status(store, last) is Status.WAITING
    assert await status(store, last) is Status.QUEUED
    results = await store.parent_results(last.id)
    assert list(results) == [k.id for k in kids]
    assert sorted(results.values()) == list(range(5))


async def test_cross_queue(store: TaskStore) -> None:
    a = await store.submit("a", queue="first")
    b = await store.submit("b", queue="second", after=[a])
    assert await store.claim("second", worker_id="w") == []
    await run(store, "first")
    assert [t.id for t in await run(store, "second")] == [b.id]


async def test_failure_cascades_with_the_parent_named(store: TaskStore) -> None:
    a = await store.submit("a", queue="q", max_attempts=1)
    b = await store.submit("b", queue="q", after=[a])
    c = await store.submit("c", queue="q", after=[b])
    other = await store.submit("other", queue="q")
    d = await store.submit("d", queue="q", after=[other, c])
    [held, _] = await store.claim("q", worker_id="w", limit=2)
    assert held.id == a.id
    await store.fail(a.id, worker_id="w", error="boom")
    got = [await store.get(t.id) for t in (b, c, d)]
    for child, parent in zip(got, (a, b, c), strict=True):
        assert child is not None
        assert child.status is Status.CANCELLED
        assert child.finished_at is not None
        assert child.error is not None and child.error["parent_id"] == parent.id
        assert parent.id in child.error["message"]
    assert (await store.get(b.id)).error["parent_status"] == "failed"  # type: ignore[index,union-attr]
    assert (await store.get(c.id)).error["parent_status"] == "cancelled"  # type: ignore[index,union-attr]


async def test_retries_of_a_parent_hold_the_child(store: TaskStore) -> None:
    a = await store.submit("a", queue="q", max_attempts=2, backoff=0)
    b = await store.submit("b", queue="q", after=[a])
    await store.claim("q", worker_id="w")
    again = await store.fail(a.id, worker_id="w", error="once")
    assert again.status is Status.QUEUED
    assert await status(store, b) is Status.WAITING
    [held] = await store.claim("q", worker_id="w")
    assert held.id == a.id and held.attempt == 2
    await store.succeed(a.id, worker_id="w", result=7)
    assert await status(store, b) is Status.QUEUED
    assert await store.parent_results(b.id) == {a.id: 7}


async def test_permanent_failure_cascades(store: TaskStore) -> None:
    a = await store.submit("a", queue="q", max_attempts=5)
    b = await store.submit("b", queue="q", after=[a])
    await store.claim("q", worker_id="w")
    await store.fail(a.id, worker_id="w", error=Permanent("no"), retryable=False)
    assert await status(store, b) is Status.CANCELLED


async def test_lease_lost_on_the_last_attempt_cascades(store: TaskStore) -> None:
    a = await store.submit("a", queue="q", max_attempts=1)
    b = await store.submit("b", queue="q", after=[a])
    await store.claim("q", worker_id="w", lease=1)
    store.clock_offset = 5
    await store.recover()
    assert await status(store, a) is Status.FAILED
    assert await status(store, b) is Status.CANCELLED


async def test_on_parent_failure_run(store: TaskStore) -> None:
    a = await store.submit("a", queue="q", max_attempts=1)
    ok = await store.submit("ok", queue="q")
    b = await store.submit("b", queue="q", after=[a, ok], on_parent_failure="run")
    [held_a, held_ok] = await store.claim("q", worker_id="w", limit=2)
    await store.fail(held_a.id, worker_id="w", error="boom")
    assert await status(store, b) is Status.WAITING
    await store.succeed(held_ok.id, worker_id="w", result="fine")
    assert await status(store, b) is Status.QUEUED
    assert await store.parent_results(b.id) == {a.id: None, ok.id: "fine"}


async def test_cancel_of_a_parent_cascades(store: TaskStore) -> None:
    a = await store.submit("a", queue="q")
    b = await store.submit("b", queue="q", after=[a])
    await store.cancel(a.id)
    found = await store.get(b.id)
    assert found is not None and found.status is Status.CANCELLED
    assert found.error is not None and found.error["parent_status"] == "cancelled"


async def test_cancel_of_a_waiting_task_cascades(store: TaskStore) -> None:
    a = await store.submit("a", queue="q")
    b = await store.submit("b", queue="q", after=[a])
    c = await store.submit("c", queue="q", after=[b])
    cancelled = await store.cancel(b.id)
    assert cancelled is not None and cancelled.status is Status.CANCELLED
    assert await status(store, c) is Status.CANCELLED
    await run(store)  # a succeeds: b stays cancelled
    assert await status(store, b) is Status.CANCELLED
    assert await run(store) == []


async def test_terminal_parent_resolved_at_submit(store: TaskStore) -> None:
    a = await store.submit("a", queue="q")
    await run(store)
    b = await store.submit("b", queue="q", after=[a])
    assert b.status is Status.QUEUED
    bad = await store.submit("bad", queue="q")
    await store.cancel(bad.id)
    c = await store.submit("c", queue="q", after=[a, bad])
    assert c.status is Status.CANCELLED
    assert c.error is not None and c.error["parent_id"] == bad.id
    d = await store.submit("d", queue="q", after=[bad], on_parent_failure="run")
    assert d.status is Status.QUEUED


async def test_missing_parent_writes_nothing(store: TaskStore) -> None:
    a = await store.submit("a", queue="q")
    with pytest.raises(InvalidArgument) as info:
        await store.submit("b", queue="q", after=[a, UNKNOWN])
    assert info.value.field == "after" and UNKNOWN in str(info.value)
    with pytest.raises(InvalidArgument):
        await store.submit_many([{"name": "x", "queue": "q"}, {"name": "y", "after": [UNKNOWN]}])
    page = await store.list(queue="q")
    assert [t.id for t in page.items] == [a.id]
    assert (await store.get(a.id)).status is Status.QUEUED  # type: ignore[union-attr]


async def test_bad_arguments(store: TaskStore) -> None:
    a = await store.submit("a", queue="q")
    with pytest.raises(InvalidArgument) as info:
        await store.submit("b", after=a)  # type: ignore[arg-type]
    assert info.value.field == "after"
    with pytest.raises(InvalidArgument) as info:
        await store.submit("b", after=[a], on_parent_failure="ignore")  # type: ignore[arg-type]
    assert info.value.field == "on_parent_failure"
    with pytest.raises(InvalidArgument) as info:
        await store.submit("b", after=[a], partition="p")
    assert info.value.field == "after"
    assert len((await store.list(queue="default")).items) == 0


async def test_parent_in_a_groups_only_queue_is_refused(store: TaskStore) -> None:
    await store.configure_queue("bus", queue_mode=False)
    await store.subscribe("bus", "g")
    a = await store.submit("a", queue="bus")
    with pytest.raises(InvalidArgument) as info:
        await store.submit("b", queue="q", after=[a])
    assert info.value.field == "after" and a.id in str(info.value)
    assert (await store.list(queue="q")).items == []


async def test_submit_many_and_stats(store: TaskStore) -> None:
    a = await store.submit("a", queue="q")
    tasks = await store.submit_many(
        [{"name": "b", "queue": "q", "after": [a]}, {"name": "c", "queue": "q"}]
    )
    assert [t.status for t in tasks] == [Status.WAITING, Status.QUEUED]
    [stats] = await store.stats(queue="q")
    assert stats.counts["waiting"] == 1 and stats.counts["queued"] == 2
    page = await store.list(queue="q", status="waiting")
    assert [t.id for t in page.items] == [tasks[0].id]


async def test_parent_partitioned_child_not(store: TaskStore) -> None:
    a = await store.submit("a", queue="q", partition="p1")
    b = await store.submit("b", queue="q", after=[a])
    await run(store)
    assert await status(store, b) is Status.QUEUED


async def test_caller_transaction(store: TaskStore, store_url: str) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine
    from tests.app.test_transactional import caller_url

    a = await store.submit("a", queue="q")
    engine = create_async_engine(caller_url(store_url))
    try:
        async with engine.connect() as conn, conn.begin():
            with pytest.raises(InvalidArgument):
                await store.submit("x", queue="q", after=[UNKNOWN], connection=conn)
            b = await store.submit("b", queue="q", after=[a], connection=conn)
            assert b.status is Status.WAITING
    finally:
        await engine.dispose()
    assert [t.id for t in (await store.list(queue="q")).items] == [a.id, b.id]
    await run(store)
    assert await status(store, b) is Status.QUEUED


async def test_sync_store(sync_store: object) -> None:
    from conveyor import SyncStore

    assert isinstance(sync_store, SyncStore)
    a = sync_store.submit("a", queue="q")
    b = sync_store.submit("b", queue="q", after=[a])
    assert b.status is Status.WAITING
    [held] = sync_store.claim("q", worker_id="w")
    sync_store.succeed(held.id, worker_id="w", result=1)
    assert sync_store.parent_results(b.id) == {a.id: 1}


async def test_cascade_from_a_callers_transaction_reaches_every_level(
    store: TaskStore, store_url: str
) -> None:
    # A replacing submit in the caller's own transaction cancels the key's holder;
    # the cancel must cascade to the grandchild too (SQLite: the trigger fires
    # itself on the caller's connection as on the store's own).
    from sqlalchemy.ext.asyncio import create_async_engine
    from tests.app.test_transactional import caller_url

    a = await store.submit("a", queue="q", key="k")
    b = await store.submit("b", queue="q", after=[a])
    c = await store.submit("c", queue="q", after=[b])
    engine = create_async_engine(caller_url(store_url))
    try:
        async with engine.connect() as conn, conn.begin():
            await store.submit("a2", queue="q", key="k", conflict="replace", connection=conn)
    finally:
        await engine.dispose()
    assert await status(store, a) is Status.CANCELLED
    assert await status(store, b) is Status.CANCELLED
    assert await status(store, c) is Status.CANCELLED
