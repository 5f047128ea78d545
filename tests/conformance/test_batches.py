"""Batches: ``store.batch(on_complete=...)`` (issue 29 §5), on both backends."""

from __future__ import annotations

import pytest

import conveyor
from conveyor import InvalidArgument, Status
from conveyor.store.base import TaskStore
from conveyor.testing import run_tasks


async def finish_all(
    store: TaskStore, queue: str, *, fail: frozenset[str] = frozenset()
) -> list[str]:
    """Claim and finish everything claimable on ``queue`` (those named in
    ``fail`` fail for good); the names run."""
    names = []
    for task in await store.claim(queue, worker_id="w", limit=100):
        names.append(task.name)
        if task.name in fail:
            await store.fail(task.id, worker_id="w", error="no", retryable=False)
        else:
            await store.succeed(task.id, worker_id="w", result=task.name)
    return names


async def test_callback_runs_once_after_close_and_all_terminal(store: TaskStore) -> None:
    batch = await store.batch(("report", {"day": "mon"}), queue="b")
    assert batch.callback.status is Status.WAITING
    ok = await batch.submit("ok")
    bad = await batch.submit("bad")
    gone = await batch.submit("gone")
    await store.cancel(gone.id)
    assert sorted(await finish_all(store, "b", fail=frozenset({"bad"}))) == ["bad", "ok"]
    # Every task terminal, but the batch is open: no callback yet.
    assert await store.claim("b", worker_id="w") == []
    info = await store.get_batch(batch.id)
    assert info is not None and not info.closed and info.callback_status is Status.WAITING
    await batch.close()
    await batch.close()  # harmless
    [callback] = await store.claim("b", worker_id="w", limit=10)
    assert callback.id == batch.callback.id and callback.payload == {"day": "mon"}
    summary = await store.get_batch(batch.id)
    assert summary is not None
    assert summary.closed and summary.total == 3 and summary.done
    assert summary.succeeded == [ok.id] and summary.failed == [bad.id]
    assert summary.cancelled == [gone.id]
    assert summary.counts == {"succeeded": 1, "failed": 1, "cancelled": 1}
    assert summary.callback_status is Status.RUNNING
    assert await store.claim("b", worker_id="w") == []


async def test_context_manager_and_submit_batch(store: TaskStore) -> None:
    async with store.batch("done", queue="b") as batch:
        first = await store.submit("x", queue="b", batch=batch)
        many = await batch.submit_many([{"name": "y"}, {"name": "z", "queue": "other"}])
        assert [t.queue for t in many] == ["b", "other"]
        info = await batch.info()
        assert info.total == 3 and info.counts == {"queued": 3}
    assert (await store.get_batch(batch.id)).closed  # type: ignore[union-attr]
    await finish_all(store, "other")
    assert sorted(await finish_all(store, "b")) == ["x", "y"]
    assert await finish_all(store, "b") == ["done"]
    assert first.status is Status.QUEUED


async def test_closed_when_every_task_finished_first(store: TaskStore) -> None:
    batch = await store.batch("done", queue="b")
    await batch.submit("x")
    await finish_all(store, "b")
    await batch.close()
    assert await finish_all(store, "b") == ["done"]


async def test_empty_batch_runs_its_callback_at_close(store: TaskStore) -> None:
    async with store.batch("done", queue="b"):
        pass
    assert await finish_all(store, "b") == ["done"]


async def test_closed_batch_refuses_tasks(store: TaskStore) -> None:
    batch = await store.batch("done", queue="b")
    await batch.close()
    with pytest.raises(InvalidArgument) as info:
        await batch.submit("late")
    assert info.value.field == "batch"
    with pytest.raises(InvalidArgument) as info:
        await store.submit("t", batch="01ARZ3NDEKTSV4RRFFQ69G5FAV")
    assert info.value.field == "batch"
    assert [t.name for t in (await store.list(queue="b")).items] == ["done"]


async def test_batch_task_waiting_on_a_parent(store: TaskStore) -> None:
    root = await store.submit("root", queue="b")
    async with store.batch("done", queue="b") as batch:
        child = await batch.submit("child", after=[root])
    assert child.status is Status.WAITING
    assert await finish_all(store, "b") == ["root"]
    assert await finish_all(store, "b") == ["child"]
    assert await finish_all(store, "b") == ["done"]


async def test_cancelled_callback(store: TaskStore) -> None:
    batch = await store.batch("done", queue="b")
    await batch.submit("x")
    await store.cancel(batch.callback.id)
    await batch.close()
    await finish_all(store, "b")
    assert await store.claim("b", worker_id="w") == []
    info = await store.get_batch(batch.id)
    assert info is not None and info.callback_status is Status.CANCELLED


async def test_get_batch_unknown(store: TaskStore) -> None:
    assert await store.get_batch("01ARZ3NDEKTSV4RRFFQ69G5FAV") is None


async def test_bad_callback_options(store: TaskStore) -> None:
    with pytest.raises(InvalidArgument) as info:
        store.batch("done", after=["x"])
    assert info.value.field == "after"


async def test_app_batch_summary_in_the_handler(app: conveyor.App) -> None:
    seen: list[object] = []

    @app.task(queue="b")
    async def part(ctx: conveyor.Context, n: int) -> int:
        if n == 2:
            raise conveyor.Permanent("two")
        return n * 10

    @app.task(queue="b")
    async def report(ctx: conveyor.Context, day: str) -> None:
        summary = await ctx.batch_summary()
        seen.append((day, summary, await ctx.parent_results()))

    async with app.batch((report, {"day": "tue"})) as batch:
        tasks = [await part.with_options(batch=batch).submit(n) for n in range(4)]
    drained = await run_tasks(app)
    assert len(drained.succeeded) == 4
    [(day, summary, results)] = seen
    assert day == "tue"
    assert isinstance(summary, conveyor.BatchInfo)
    assert summary.succeeded == [t.id for t in tasks if t.payload["args"] != [2]]
    assert summary.failed == [tasks[2].id]
    assert results == {t.id: (None if i == 2 else i * 10) for i, t in enumerate(tasks)}


def test_sync_batch(sync_store: conveyor.SyncStore) -> None:
    with sync_store.batch("done", queue="b") as batch:
        batch.submit("x")
    [held] = sync_store.claim("b", worker_id="w")
    sync_store.succeed(held.id, worker_id="w")
    [callback] = sync_store.claim("b", worker_id="w")
    assert callback.id == batch.callback.id
    info = sync_store.get_batch(batch.id)
    assert info is not None and info.succeeded == [held.id]
