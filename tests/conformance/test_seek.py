"""seek(): replay or skip for an existing consumer group (SPEC §6), on both
backends: what it requeues, skips and leaves running, FIFO across it, the
status ``skipped`` everywhere else (retry, bulk actions, retention, stats)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import pytest

import conveyor
from conveyor import InvalidArgument, NotFound, SeekResult, Status
from conveyor.models import Task
from conveyor.store.base import TaskStore
from conveyor.store.protocol import seek

Q = "q"


async def drain(
    store: TaskStore, group: str | None, *, fail: frozenset[str] | set[str] = frozenset()
) -> list[Task]:
    """Claim and finish every claimable task of the group, one at a time, in
    claim order (succeeded, or failed for good where ``fail`` names it)."""
    done = []
    while True:
        held = await store.claim(Q, worker_id="w", group=group)
        if not held:
            return done
        [task] = held
        if task.id in fail:
            await store.fail(task.id, worker_id="w", group=group, error="no", retryable=False)
        else:
            await store.succeed(task.id, worker_id="w", group=group, result={"n": task.payload})
        done.append(task)


async def view(store: TaskStore, tasks: list[Task], group: str | None) -> list[Task]:
    found = [await store.get(t.id, group=group) for t in tasks]
    assert all(f is not None for f in found)
    return found  # type: ignore[return-value]


async def group_counts(store: TaskStore, group: str) -> dict[str, int]:
    [report] = await store.stats(Q)
    return {k: n for k, n in report.groups[group].counts.items() if n}


async def submit(store: TaskStore, n: int, **options: Any) -> list[Task]:
    return [await store.submit("job", i, queue=Q, **options) for i in range(n)]


# ------------------------------------------------------------------- replay
async def test_seek_replays_finished_tasks_from_a_point_for_that_group_only(
    store: TaskStore,
) -> None:
    await store.subscribe(Q, "g")
    await store.subscribe(Q, "h")
    tasks = await submit(store, 6)
    assert [t.id for t in await drain(store, "g", fail={tasks[4].id})] == [t.id for t in tasks]
    await drain(store, "h")
    [mine] = await store.claim(Q, worker_id="qm")  # queue mode: one done
    await store.succeed(mine.id, worker_id="qm")

    got = await store.seek(Q, "g", to=tasks[3].created_at)

    assert got == SeekResult(Q, "g", None, requeued=3, skipped=0, left_running=0)
    after = await view(store, tasks, "g")
    assert [t.status for t in after] == [Status.SUCCEEDED] * 3 + [Status.QUEUED] * 3
    for t in after[3:]:
        # Afresh: result and error gone, a new budget; attempt numbers keep counting.
        assert (t.result, t.error, t.finished_at, t.started_at) == (None, None, None, None)
        assert t.attempt == 1 and t.max_attempts == 1 + 3
    assert after[0].result == {"n": 0}
    # The other group and queue mode are as they were.
    assert {t.status for t in await view(store, tasks, "h")} == {Status.SUCCEEDED}
    qm = await view(store, tasks, None)
    assert [t.status for t in qm] == [Status.SUCCEEDED] + [Status.QUEUED] * 5
    # Delivered again, in order, with the next attempt.
    again = await drain(store, "g")
    assert [t.id for t in again] == [t.id for t in tasks[3:]]
    assert [t.attempt for t in again] == [2, 2, 2]
    assert await group_counts(store, "g") == {"succeeded": 6}


async def test_seek_to_start_replays_every_retained_task_whatever_its_end(
    store: TaskStore,
) -> None:
    await store.subscribe(Q, "g")
    tasks = await submit(store, 5)
    await drain(store, "g", fail={tasks[1].id})
    await store.cancel_where(queue=Q, group="g")  # nothing active: changes nothing
    extra = await store.submit("job", 9, queue=Q)
    await store.cancel_where(queue=Q, group="g")  # extra cancelled for g only
    assert (await store.get(extra.id)).status is Status.QUEUED  # type: ignore[union-attr]

    got = await store.seek(Q, "g", to="start")

    assert (got.requeued, got.skipped, got.left_running) == (6, 0, 0)
    assert await group_counts(store, "g") == {"queued": 6}
    assert [t.id for t in await drain(store, "g")] == [t.id for t in [*tasks, extra]]


# --------------------------------------------------------------------- skip
async def test_seek_skips_what_is_queued_before_the_point(store: TaskStore) -> None:
    await store.subscribe(Q, "g")
    tasks = await submit(store, 6)
    waiter = asyncio.create_task(store.wait(tasks[0].id, group="g", timeout=10))
    await asyncio.sleep(0.05)

    got = await store.seek(Q, "g", to=tasks[3].created_at)

    assert (got.requeued, got.skipped, got.left_running) == (0, 3, 0)
    after = await view(store, tasks, "g")
    assert [t.status for t in after] == [Status.SKIPPED] * 3 + [Status.QUEUED] * 3
    assert all(t.terminal and t.finished_at is not None for t in after[:3])
    assert (await waiter).status is Status.SKIPPED  # terminal: wait() returns
    assert {t.status for t in await view(store, tasks, None)} == {Status.QUEUED}
    assert [t.id for t in await drain(store, "g")] == [t.id for t in tasks[3:]]
    assert await group_counts(store, "g") == {"skipped": 3, "succeeded": 3}


async def test_seek_to_end_skips_everything_queued_and_leaves_running_work(
    store: TaskStore,
) -> None:
    await store.subscribe(Q, "g")
    tasks = await submit(store, 4)
    [held] = await store.claim(Q, worker_id="w", group="g")
    await store.fail(held.id, worker_id="w", group="g", error="later", delay=3600)
    [held] = await store.claim(Q, worker_id="w", group="g")  # tasks[1], running

    got = await store.seek(Q, "g", to="end")

    assert (got.requeued, got.skipped, got.left_running) == (0, 3, 1)
    after = await view(store, tasks, "g")
    # The retry-waiting one is skipped too: it was queued.
    assert [t.status for t in after] == [
        Status.SKIPPED,
        Status.RUNNING,
        Status.SKIPPED,
        Status.SKIPPED,
    ]
    done = await store.succeed(held.id, worker_id="w", group="g", attempt=held.attempt)
    assert done.status is Status.SUCCEEDED
    assert await store.claim(Q, worker_id="w", group="g") == []
    new = await store.submit("job", queue=Q)  # after the seek: delivered as usual
    assert [t.id for t in await drain(store, "g")] == [new.id]


async def test_seek_in_the_future_skips_all_and_replays_nothing(store: TaskStore) -> None:
    await store.subscribe(Q, "g")
    tasks = await submit(store, 3)
    await drain(store, "g")
    queued = await store.submit("job", queue=Q)
    got = await store.seek(Q, "g", to=datetime.now(tasks[0].created_at.tzinfo) + timedelta(days=1))
    assert (got.requeued, got.skipped) == (0, 1)
    assert (await store.get(queued.id, group="g")).status is Status.SKIPPED  # type: ignore[union-attr]


# -------------------------------------------------------------- partitions
async def test_a_running_delivery_holds_its_partition_across_a_seek(store: TaskStore) -> None:
    await store.subscribe(Q, "g")
    tasks = await submit(store, 6, partition="p")
    for _ in range(4):
        [t] = await store.claim(Q, worker_id="w", group="g")
        await store.succeed(t.id, worker_id="w", group="g")
    [running] = await store.claim(Q, worker_id="w", group="g")
    assert running.id == tasks[4].id

    got = await store.seek(Q, "g", to=tasks[1].created_at)

    assert (got.requeued, got.skipped, got.left_running) == (3, 0, 1)
    # tasks 1..3 come before the running task 4 in the stream, which holds it:
    # nothing of the partition is delivered until 4 finishes.
    assert await store.claim(Q, worker_id="w2", group="g", limit=5) == []
    await store.succeed(running.id, worker_id="w", group="g", attempt=running.attempt)
    order = [t.id for t in await drain(store, "g")]
    assert order == [tasks[i].id for i in (1, 2, 3, 5)]


async def test_seek_limited_to_one_partition(store: TaskStore) -> None:
    await store.subscribe(Q, "g")
    p = await submit(store, 3, partition="p")
    r = await submit(store, 3, partition="r")
    plain = await submit(store, 2)
    await drain(store, "g")

    got = await store.seek(Q, "g", to="start", partition="p")

    assert got.partition == "p" and got.requeued == 3
    assert [t.status for t in await view(store, p, "g")] == [Status.QUEUED] * 3
    assert {t.status for t in await view(store, [*r, *plain], "g")} == {Status.SUCCEEDED}
    assert (await store.seek(Q, "g", to="end", partition="r")).skipped == 0
    assert [t.id for t in await drain(store, "g")] == [t.id for t in p]


async def test_a_long_replay_parks_partitioned_rows_until_its_release(
    store: TaskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay of several batches holds each partition from its first replayed
    task until the release pass; a run cut short before it is finished by the
    same seek run again."""
    monkeypatch.setattr(seek, "BATCH", 2)
    await store.subscribe(Q, "g")
    parted = await submit(store, 5, partition="p")
    plain = await submit(store, 2)
    await drain(store, "g")
    late = await store.submit("job", queue=Q, partition="p")  # queued, never delivered

    release = seek._releasing

    def nothing(st: Any) -> Any:
        async def batch(*args: Any) -> tuple[int, int, int, bool]:
            return 0, 0, 0, False

        return batch

    monkeypatch.setattr(seek, "_releasing", nothing)  # the run cut short before it
    got = await store.seek(Q, "g", to=parted[1].created_at)
    assert got.requeued == 6
    held = await view(store, parted[1:], "g")
    assert {t.status for t in held} == {Status.QUEUED}
    assert {t.run_at.year for t in held} == {9999}
    # Unpartitioned rows are due at once; the partition waits behind its parked
    # head, the queued task after it too.
    claimed = await store.claim(Q, worker_id="w", group="g", limit=10)
    assert {t.id for t in claimed} == {t.id for t in plain}
    for t in claimed:
        await store.succeed(t.id, worker_id="w", group="g")
    assert await store.claim(Q, worker_id="w", group="g", limit=10) == []

    monkeypatch.setattr(seek, "_releasing", release)
    again = await store.seek(Q, "g", to=parted[1].created_at)
    assert again.requeued == 2  # the plain tasks, finished since
    order = await drain(store, "g")
    assert [t.id for t in order if t.partition] == [t.id for t in [*parted[1:], late]]
    assert sorted(t.id for t in order if not t.partition) == sorted(t.id for t in plain)


async def test_a_replay_in_batches_keeps_each_partition_in_order_beside_a_claimer(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims run between the seek's batches: after the seek's first write, each
    partition's deliveries go in submit order."""
    monkeypatch.setattr(seek, "BATCH", 3)
    async with conveyor.connect(store_url) as worker, conveyor.connect(store_url) as operator:
        await operator.subscribe(Q, "g")
        first = await operator.submit_many(
            [{"name": "job", "payload": i, "queue": Q, "partition": f"p{i % 3}"} for i in range(30)]
        )
        await drain(worker, "g")
        fresh = await operator.submit_many(
            [{"name": "job", "payload": i, "queue": Q, "partition": f"p{i % 3}"} for i in range(6)]
        )
        seq = {t.id: i for i, t in enumerate([*first, *fresh])}
        log: list[Task] = []
        stop = asyncio.Event()

        async def claimer() -> None:
            while True:
                held = await worker.claim(Q, worker_id="c", group="g", limit=4)
                for t in held:
                    log.append(t)
                    await worker.succeed(t.id, worker_id="c", group="g", attempt=t.attempt)
                if not held:
                    if stop.is_set():
                        return
                    await asyncio.sleep(0.001)

        running = asyncio.create_task(claimer())
        got = await operator.seek(Q, "g", to=first[6].created_at)
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.wait_for(running, 30)

    assert got.skipped == 0 and got.requeued + got.left_running >= 24
    for part in ("p0", "p1", "p2"):
        seen = [seq[t.id] for t in log if t.partition == part]
        # The fresh tasks may go before the seek reaches their partition; from the
        # first replayed delivery on, the partition runs in submit order.
        replayed = [i for i, t in enumerate(log) if t.partition == part and t.attempt == 2]
        assert replayed, part
        tail = [seq[t.id] for t in log[replayed[0] :] if t.partition == part]
        assert tail == sorted(tail), (part, seen)
        assert set(tail) >= {seq[t.id] for t in first[6:] if t.partition == part}


# -------------------------------------------------------------- bad input
async def test_seek_refuses_bad_arguments_and_unknown_groups(store: TaskStore) -> None:
    await store.subscribe(Q, "g")
    tasks = await submit(store, 2)
    before = await group_counts(store, "g")
    for to in (datetime(2026, 1, 1), "middle", None, 12):  # the datetime is naive
        with pytest.raises(InvalidArgument) as info:
            await store.seek(Q, "g", to=to)  # type: ignore[arg-type]
        assert info.value.field == "to"
    with pytest.raises(InvalidArgument) as info:
        await store.seek(Q, "g", to="end", partition="")
    assert info.value.field == "partition"
    with pytest.raises(InvalidArgument):
        await store.seek("", "g", to="end")
    with pytest.raises(NotFound):
        await store.seek(Q, "nobody", to="end")
    await store.subscribe(Q, "gone")
    await store.unsubscribe(Q, "gone")
    with pytest.raises(NotFound) as found:
        await store.seek(Q, "gone", to="end")
    assert "unsubscribed" in str(found.value)
    assert await group_counts(store, "g") == before == {"queued": 2}
    assert {t.status for t in await view(store, tasks, "g")} == {Status.QUEUED}


async def test_seek_of_an_empty_queue_does_nothing(store: TaskStore) -> None:
    await store.subscribe("empty", "g")
    got = await store.seek("empty", "g", to="start")
    assert (got.requeued, got.skipped, got.left_running) == (0, 0, 0)


# ------------------------------------------------- skipped everywhere else
async def test_skipped_tasks_retry_and_the_bulk_actions(store: TaskStore) -> None:
    await store.subscribe(Q, "g")
    tasks = await submit(store, 4)
    await store.seek(Q, "g", to="end")
    back = await store.retry(tasks[0].id, group="g")
    assert back is not None and back.status is Status.QUEUED
    assert (await store.get(tasks[0].id)).status is Status.QUEUED  # type: ignore[union-attr]
    assert await store.internal.count_where("retry", queue=Q, group="g", status="skipped") == 3
    assert await store.retry_where(queue=Q, group="g", status="skipped", limit=1) == 1
    await drain(store, "g")
    await drain(store, None)
    # Purge: a task goes once every row of it is finished (queue mode's too).
    assert await store.purge_where(queue=Q, group="g", status="skipped") == 2
    assert await store.get(tasks[3].id) is None
    assert await store.get(tasks[0].id, group="g") is not None


async def test_retention_deletes_skipped_tasks_like_other_finished_ones(
    store: TaskStore,
) -> None:
    await store.configure_queue(Q, retention=60, queue_mode=False)
    await store.subscribe(Q, "g")
    tasks = await submit(store, 3)
    await store.seek(Q, "g", to="end")
    store.clock_offset = 120
    assert (await store.maintain())["deleted"] == 3
    assert [await store.get(t.id) for t in tasks] == [None, None, None]


async def test_counts_add_up_across_seeks_and_roll_ups(store: TaskStore) -> None:
    await store.subscribe(Q, "g")
    tasks = await submit(store, 8)
    await submit(store, 2, partition="p")
    await drain(store, "g", fail={tasks[2].id})
    await store.maintain()  # folds the finished rows into the counts
    assert await group_counts(store, "g") == {"succeeded": 9, "failed": 1}

    got = await store.seek(Q, "g", to=tasks[5].created_at)
    assert got.requeued == 5
    early = {"succeeded": 4, "failed": 1}  # tasks 0-4
    assert await group_counts(store, "g") == {**early, "queued": 5}
    await store.maintain()
    assert await group_counts(store, "g") == {**early, "queued": 5}
    got = await store.seek(Q, "g", to="end")
    assert got.skipped == 5
    assert await group_counts(store, "g") == {**early, "skipped": 5}
    await store.maintain()
    assert await group_counts(store, "g") == {**early, "skipped": 5}
    got = await store.seek(Q, "g", to="start")
    assert got.requeued == 10
    [report] = await store.stats(Q)
    assert report.groups["g"].lag == 10 and await group_counts(store, "g") == {"queued": 10}
    assert sum(report.counts.values()) == 10  # queue mode: all still queued


async def test_preview_counts_what_a_seek_would_do_and_writes_nothing(store: TaskStore) -> None:
    await store.subscribe(Q, "g")
    tasks = await submit(store, 5)
    await drain(store, "g")
    await submit(store, 2)
    [held] = await store.claim(Q, worker_id="w", group="g")
    preview = await store.internal.preview_seek(Q, "g", to=tasks[2].created_at)
    assert (preview.requeued, preview.skipped, preview.left_running) == (3, 0, 1)
    assert (await store.internal.preview_seek(Q, "g", to="end")).skipped == 1
    assert await group_counts(store, "g") == {"succeeded": 5, "queued": 1, "running": 1}
    done = await store.seek(Q, "g", to=tasks[2].created_at)
    assert (done.requeued, done.skipped, done.left_running) == (3, 0, 1)
    assert held.status is Status.RUNNING


def test_the_sync_store_seeks(sync_store: conveyor.SyncStore) -> None:
    sync_store.subscribe(Q, "g")
    task = sync_store.submit("job", queue=Q)
    got = sync_store.seek(Q, "g", to="end")
    assert got.skipped == 1 and got.as_dict()["skipped"] == 1
    assert sync_store.get(task.id, group="g").status is Status.SKIPPED  # type: ignore[union-attr]
    assert sync_store.internal.preview_seek(Q, "g", to="start").requeued == 1


async def test_an_unsubscribe_during_a_seek_ends_it_cleanly(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group rows are shared by each batch: an unsubscribe waits for the
    batch in flight, and the seek's next batch finds the group gone."""
    monkeypatch.setattr(seek, "BATCH", 1)
    async with conveyor.connect(store_url) as operator, conveyor.connect(store_url) as other:
        await operator.subscribe(Q, "g")
        await operator.submit_many([{"name": "job", "queue": Q} for _ in range(300)])
        running = asyncio.create_task(operator.seek(Q, "g", to="end"))
        await asyncio.sleep(0.05)
        assert await other.unsubscribe(Q, "g")
        try:
            got = await asyncio.wait_for(running, 60)
        except NotFound as exc:
            assert "unsubscribed" in str(exc)
        else:  # it was quicker than the unsubscribe
            assert got.skipped == 300
        [report] = await operator.stats(Q)
        assert "g" not in report.groups and report.counts["queued"] == 300
