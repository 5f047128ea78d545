"""Bulk actions by filter: retry_where, cancel_where, purge_where (SPEC §6), on
both backends."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

import conveyor
from conveyor import InvalidArgument, Status, TaskCancelled
from conveyor.models import Task
from conveyor.store.base import TaskStore
from conveyor.store.protocol import bulk


async def fail_all(store: TaskStore, queue: str, *, group: str | None = None) -> list[Task]:
    """Claim every claimable task of ``queue`` one at a time and fail it for good
    (a partition's tasks one after another, in its order)."""
    failed = []
    while True:
        held = await store.claim(queue, worker_id="w", group=group)
        if not held:
            return failed
        failed.append(
            await store.fail(held[0].id, worker_id="w", error="boom", retryable=False, group=group)
        )


async def statuses(store: TaskStore, tasks: list[Task], group: str | None = None) -> list[str]:
    found = [await store.get(t.id, group=group) for t in tasks]
    return [f.status.value if f is not None else "gone" for f in found]


def counts(stats: list[Any], queue: str, group: str | None = None) -> dict[str, int]:
    """The nonzero counts of one view of ``queue`` (none: the queue is gone)."""
    report = next((s for s in stats if s.queue == queue), None)
    if report is None:
        return {}
    view = report.counts if group is None else report.groups.get(group)
    if view is not None and group is not None:
        view = view.counts
    return {k: n for k, n in (view or {}).items() if n}


# ----------------------------------------------------------------- retry_where
async def test_retry_where_requeues_the_failed_rows_of_the_queue(store: TaskStore) -> None:
    failed = [await store.submit("job", i, queue="q", max_attempts=1) for i in range(4)]
    await fail_all(store, "q")
    done = await store.submit("job", queue="q")
    [held] = await store.claim("q", worker_id="w")
    await store.succeed(held.id, worker_id="w")
    cancelled = await store.submit("job", queue="q")
    await store.cancel(cancelled.id)
    waiting = await store.submit("job", queue="q")
    other = await store.submit("job", queue="other", max_attempts=1)
    await fail_all(store, "other")

    assert await store.retry_where(queue="q") == 4
    assert await statuses(store, failed) == ["queued"] * 4
    assert await statuses(store, [done, cancelled, waiting, other]) == [
        "succeeded",
        "cancelled",
        "queued",
        "failed",
    ]
    again = await store.get(failed[0].id)
    assert again is not None and again.finished_at is None and again.worker_id is None
    assert await store.retry_where(queue="q") == 0  # nothing failed is left
    assert await store.retry_where(queue="q", status="cancelled") == 1
    assert await store.retry_where(queue="q", status=None) == 0


async def test_retry_where_filters(store: TaskStore) -> None:
    early_a = await store.submit("a", queue="q", max_attempts=1)
    early_b = await store.submit("b", queue="q", max_attempts=1, partition="p1")
    await fail_all(store, "q")
    store.clock_offset = 1000
    late_a = await store.submit("a", queue="q", max_attempts=1, partition="p1")
    late_b = await store.submit("b", queue="q", max_attempts=1, partition="p2")
    await fail_all(store, "q")
    first = await store.get(early_a.id)
    assert first is not None and first.finished_at is not None
    cut = first.finished_at + timedelta(seconds=500)

    assert await store.internal.count_where("retry", queue="q", name="a") == 2
    assert await store.retry_where(queue="q", name="b", finished_before=cut) == 1
    assert await statuses(store, [early_a, early_b, late_a, late_b]) == [
        "failed",
        "queued",
        "failed",
        "failed",
    ]
    assert await store.retry_where(queue="q", partition="p1", finished_after=cut) == 1
    assert await statuses(store, [late_a]) == ["queued"]
    assert await store.retry_where(queue="q", finished_after=cut, finished_before=cut) == 0
    assert await store.retry_where(queue="q", name="a") == 1  # early_a
    assert await statuses(store, [early_a, late_b]) == ["queued", "failed"]


async def test_retry_where_reset_attempts_grants_a_fresh_budget(store: TaskStore) -> None:
    task = await store.submit("job", queue="q", max_attempts=1)
    await fail_all(store, "q")
    assert await store.retry_where(queue="q", reset_attempts=True) == 1
    again = await store.get(task.id)
    assert again is not None and (again.attempt, again.max_attempts) == (1, 2)
    [held] = await store.claim("q", worker_id="w")
    assert held.attempt == 2
    failed = await store.fail(held.id, worker_id="w", error="x", retryable=False)
    assert await store.retry_where(queue="q") == 1  # without a reset: the budget stays
    again = await store.get(failed.id)
    assert again is not None and again.max_attempts == 2


async def test_retry_where_of_a_group_leaves_queue_mode_alone(store: TaskStore) -> None:
    await store.subscribe("q", "g")
    task = await store.submit("job", queue="q", max_attempts=1)
    await fail_all(store, "q")
    await fail_all(store, "q", group="g")
    assert await store.retry_where(queue="q", group="g") == 1
    assert await statuses(store, [task], group="g") == ["queued"]
    assert await statuses(store, [task]) == ["failed"]


async def test_limits_and_batches(store: TaskStore) -> None:
    tasks = await store.submit_many([{"name": "job", "queue": "q"} for _ in range(1_200)])
    batches: list[int] = []
    assert await store.cancel_where(queue="q", on_batch=batches.append) == 1_200
    assert batches == [bulk.BATCH, bulk.BATCH, 200]

    batches.clear()
    assert (
        await store.retry_where(queue="q", status="cancelled", limit=10, on_batch=batches.append)
        == 10
    )
    assert batches == [10]
    batches.clear()
    retried = await store.retry_where(
        queue="q", status="cancelled", limit=700, on_batch=batches.append
    )
    assert retried == 700 and batches == [bulk.BATCH, 200]
    # In submit order: the first 710 tasks went back.
    page = await store.list(queue="q", status="queued", limit=1_000)
    assert [t.id for t in page.items] == [t.id for t in tasks[:710]]
    assert await store.internal.count_where("retry", queue="q", status="cancelled") == 490
    assert await store.internal.count_where("retry", queue="q", status="cancelled", limit=7) == 7
    assert await store.retry_where(queue="q", status="cancelled", limit=5_000) == 490
    assert counts(await store.stats(), "q") == {"queued": 1_200}


async def test_a_run_cut_short_is_consistent_and_resumable(
    store: TaskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "BATCH", 3)
    tasks = [await store.submit("job", queue="q", max_attempts=1) for _ in range(8)]
    await fail_all(store, "q")
    await store.maintain()  # the failed rows are rolled up into the counts

    def crash(n: int) -> None:
        raise RuntimeError("the operator's process died")

    with pytest.raises(RuntimeError):
        await store.retry_where(queue="q", on_batch=crash)
    assert await statuses(store, tasks) == ["queued"] * 3 + ["failed"] * 5
    assert counts(await store.stats(), "q") == {"queued": 3, "failed": 5}
    assert await store.retry_where(queue="q") == 5
    assert counts(await store.stats(), "q") == {"queued": 8}


# ----------------------------------------------------------------- partitions
async def test_retried_partition_rows_go_back_in_submit_order(
    store: TaskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "BATCH", 2)  # the stream is recomputed across batches
    stream = [
        await store.submit("job", i, queue="q", partition="p", max_attempts=1) for i in range(6)
    ]
    for _ in range(3):  # the first three fail; the last three wait behind them
        [held] = await store.claim("q", worker_id="w")
        await store.fail(held.id, worker_id="w", error="x", retryable=False)
    assert await store.retry_where(queue="q", partition="p") == 3
    order = []
    while held_now := await store.claim("q", worker_id="w"):
        order.append(held_now[0].payload)
        await store.succeed(held_now[0].id, worker_id="w")
    assert order == [0, 1, 2, 3, 4, 5]
    assert await statuses(store, stream) == ["succeeded"] * 6


async def test_retry_where_of_a_whole_failed_stream_keeps_its_order(store: TaskStore) -> None:
    for i in range(5):
        await store.submit("job", i, queue="q", partition="p", max_attempts=1)
    await store.submit("other", "x", queue="q", partition="p2", max_attempts=1)
    await fail_all(store, "q")
    assert await store.retry_where(queue="q", name="job") == 5
    claimed = []
    while held := await store.claim("q", worker_id="w", partition="p"):
        claimed.append(held[0].payload)
        await store.succeed(held[0].id, worker_id="w")
    assert claimed == [0, 1, 2, 3, 4]
    assert await store.claim("q", worker_id="w") == []  # p2's task is still failed


# ----------------------------------------------------------------- cancel_where
async def test_cancel_where_cancels_queued_and_running_rows(store: TaskStore) -> None:
    done = await store.submit("job", queue="q", max_attempts=1)
    await fail_all(store, "q")
    running = await store.submit("job", queue="q")
    [held] = await store.claim("q", worker_id="w")
    queued = [await store.submit("job", queue="q") for _ in range(3)]
    elsewhere = await store.submit("job", queue="other")

    assert await store.internal.count_where("cancel", queue="q", status="running") == 1
    assert await store.cancel_where(queue="q", status="running") == 1
    with pytest.raises(TaskCancelled):
        await store.succeed(held.id, worker_id="w")
    assert await store.internal.count_where("cancel", queue="q") == 3
    assert await store.cancel_where(queue="q", status="queued") == 3
    assert await statuses(store, [running, *queued, done, elsewhere]) == [
        *["cancelled"] * 4,
        "failed",
        "queued",
    ]
    assert await store.claim("q", worker_id="w") == []
    assert await store.cancel_where(queue="q") == 0


async def test_cancel_where_changes_one_view_only(store: TaskStore) -> None:
    await store.subscribe("q", "g")
    await store.subscribe("q", "h")
    tasks = [await store.submit("job", queue="q") for _ in range(3)]
    assert await store.cancel_where(queue="q", group="g") == 3
    assert await statuses(store, tasks, group="g") == ["cancelled"] * 3
    assert await statuses(store, tasks, group="h") == ["queued"] * 3
    assert await statuses(store, tasks) == ["queued"] * 3
    assert await store.cancel_where(queue="q") == 3
    assert await statuses(store, tasks, group="h") == ["queued"] * 3


async def test_cancel_where_in_a_stream_lets_the_rest_run(store: TaskStore) -> None:
    for i in range(4):
        await store.submit("job", i, queue="q", partition="p")
    await store.submit("skip", 99, queue="q", partition="p")
    [head] = await store.claim("q", worker_id="w")
    assert await store.cancel_where(queue="q", name="skip") == 1
    await store.succeed(head.id, worker_id="w")
    order = []
    while held := await store.claim("q", worker_id="w"):
        order.append(held[0].payload)
        await store.succeed(held[0].id, worker_id="w")
    assert order == [1, 2, 3]


# ----------------------------------------------------------------- purge_where
async def test_purge_where_deletes_finished_tasks_keys_and_counts(store: TaskStore) -> None:
    ok = [await store.submit("job", i, queue="q", key=f"ok-{i}") for i in range(4)]
    while held := await store.claim("q", worker_id="w"):
        await store.succeed(held[0].id, worker_id="w")
    await store.maintain()  # these are rolled up into the counts
    bad = [await store.submit("job", queue="q", key=f"bad-{i}", max_attempts=1) for i in range(2)]
    await fail_all(store, "q")
    more_ok = await store.submit("job", queue="q", key="ok-late")  # finished, not rolled up
    [held] = await store.claim("q", worker_id="w")
    await store.succeed(held.id, worker_id="w")
    pending = await store.submit("job", queue="q", key="pending")
    before = counts(await store.stats(), "q")
    assert before == {"succeeded": 5, "failed": 2, "queued": 1}

    assert await store.internal.count_where("purge", queue="q", status="succeeded") == 5
    assert await store.purge_where(queue="q", status="succeeded") == 5
    assert counts(await store.stats(), "q") == {"failed": 2, "queued": 1}
    for task in [*ok, more_ok]:
        assert await store.get(task.id) is None
    for key in [*(f"ok-{i}" for i in range(4)), "ok-late"]:
        assert await store.get_by_key(key) is None
    assert (await store.get_by_key("bad-0")) == await store.get(bad[0].id)
    # The key is free again: a new task takes it.
    again = await store.submit("job", queue="q", key="ok-0")
    assert again.id != ok[0].id
    assert await store.purge_where(queue="q") == 2  # the failed ones; queued rows stay
    assert await store.get(pending.id) is not None
    await store.maintain()
    assert counts(await store.stats(), "q") == {"queued": 2}


async def test_purge_where_keeps_a_task_a_group_has_not_finished(store: TaskStore) -> None:
    await store.subscribe("q", "g")
    task = await store.submit("job", queue="q")
    [held] = await store.claim("q", worker_id="w")
    await store.succeed(held.id, worker_id="w")
    assert await store.internal.count_where("purge", queue="q") == 0
    assert await store.purge_where(queue="q") == 0
    assert await store.get(task.id) is not None
    [held] = await store.claim("q", worker_id="w", group="g")
    await store.succeed(held.id, worker_id="w", group="g")
    await store.maintain()
    assert await store.purge_where(queue="q", group="g", limit=1) == 1
    assert await store.get(task.id) is None
    stats = await store.stats()
    assert counts(stats, "q") == {} and counts(stats, "q", "g") == {}


async def test_purge_where_limit_and_finished_window(store: TaskStore) -> None:
    first = [await store.submit("job", queue="q") for _ in range(3)]
    while held := await store.claim("q", worker_id="w"):
        await store.succeed(held[0].id, worker_id="w")
    store.clock_offset = 1000
    later = [await store.submit("job", queue="q") for _ in range(3)]
    while held := await store.claim("q", worker_id="w"):
        await store.succeed(held[0].id, worker_id="w")
    done = await store.get(first[0].id)
    assert done is not None and done.finished_at is not None
    cut = done.finished_at + timedelta(seconds=500)
    assert await store.purge_where(queue="q", finished_before=cut, limit=2) == 2
    assert await statuses(store, first) == ["gone", "gone", "succeeded"]
    assert await store.purge_where(queue="q", finished_after=cut) == 3
    assert await statuses(store, [*first, *later]) == ["gone"] * 2 + ["succeeded"] + ["gone"] * 3


# ----------------------------------------------------------------- bad input
NAIVE = datetime(2026, 1, 1)  # no time zone: refused


@pytest.mark.parametrize(
    ("method", "kwargs", "field"),
    [
        ("retry_where", {"queue": ""}, "queue"),
        ("retry_where", {"queue": 3}, "queue"),
        ("retry_where", {"queue": "q", "status": "succeeded"}, "status"),
        ("retry_where", {"queue": "q", "status": "nonsense"}, "status"),
        ("retry_where", {"queue": "q", "finished_after": NAIVE}, "finished_after"),
        ("retry_where", {"queue": "q", "finished_before": "yesterday"}, "finished_before"),
        ("retry_where", {"queue": "q", "limit": 0}, "limit"),
        ("retry_where", {"queue": "q", "limit": True}, "limit"),
        ("retry_where", {"queue": "q", "group": ""}, "group"),
        ("retry_where", {"queue": "q", "name": ""}, "name"),
        ("retry_where", {"queue": "q", "partition": "x" * 300}, "partition"),
        ("retry_where", {"queue": "q", "reset_attempts": "yes"}, "reset_attempts"),
        ("retry_where", {"queue": "q", "on_batch": 5}, "on_batch"),
        ("cancel_where", {"queue": "q", "status": "failed"}, "status"),
        ("cancel_where", {"queue": "q", "limit": -1}, "limit"),
        ("purge_where", {"queue": "q", "status": "queued"}, "status"),
        ("purge_where", {"queue": "q", "status": "running"}, "status"),
        ("purge_where", {"queue": "q", "finished_after": NAIVE}, "finished_after"),
    ],
)
async def test_bad_input_is_refused_and_writes_nothing(
    store: TaskStore, method: str, kwargs: dict[str, Any], field: str
) -> None:
    tasks = [await store.submit("job", queue="q", max_attempts=1) for _ in range(2)]
    await fail_all(store, "q")
    queued = await store.submit("job", queue="q")
    before = [(s.queue, s.counts) for s in await store.stats()]
    with pytest.raises(InvalidArgument) as info:
        await getattr(store, method)(**kwargs)
    assert info.value.field == field
    assert [(s.queue, s.counts) for s in await store.stats()] == before
    assert await statuses(store, [*tasks, queued]) == ["failed", "failed", "queued"]


async def test_windows_are_checked(store: TaskStore) -> None:
    now = datetime.now().astimezone()
    with pytest.raises(InvalidArgument) as info:
        await store.retry_where(
            queue="q", finished_after=now, finished_before=now - timedelta(seconds=1)
        )
    assert info.value.field == "finished_after"
    with pytest.raises(InvalidArgument) as info:
        await store.cancel_where(queue="q", finished_after=now)
    assert info.value.field == "finished_after"
    with pytest.raises(InvalidArgument) as info:
        await store.internal.count_where("rerun", queue="q")  # type: ignore[arg-type]
    assert info.value.field == "action"
    with pytest.raises(TypeError):
        await store.retry_where("q")  # type: ignore[misc]
    assert await store.stats() == []


def test_the_blocking_twins(sync_store: conveyor.SyncStore) -> None:
    tasks = [sync_store.submit("job", queue="q") for _ in range(3)]
    assert sync_store.internal.count_where("cancel", queue="q") == 3
    assert sync_store.cancel_where(queue="q", limit=2) == 2
    assert sync_store.retry_where(queue="q", status=Status.CANCELLED) == 2
    assert sync_store.cancel_where(queue="q") == 3
    assert sync_store.purge_where(queue="q") == 3
    assert [sync_store.get(t.id) for t in tasks] == [None, None, None]
