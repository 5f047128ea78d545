"""stats() stays exact while maintain() folds finished rows into running totals."""

from __future__ import annotations

from conveyor import Status
from conveyor.store.base import TaskStore


async def _counts(store: TaskStore, queue: str, group: str | None = None) -> dict[str, int]:
    [report] = await store.stats(queue)
    return report.counts if group is None else report.groups[group].counts


async def test_counts_are_exact_across_rollups_retries_and_purges(store: TaskStore) -> None:
    await store.subscribe("q", "g")
    tasks = await store.submit_many([{"name": "t", "queue": "q"} for _ in range(6)])
    held = await store.claim("q", worker_id="w", limit=6)
    for task in held[:3]:
        await store.succeed(task.id, worker_id="w")
    await store.fail(held[3].id, worker_id="w", error="x", retryable=False)
    await store.cancel(held[4].id)
    expected = {
        "queued": 0,
        "running": 1,
        "succeeded": 3,
        "failed": 1,
        "cancelled": 1,
        "evicted": 0,
        "skipped": 0,
        "waiting": 0,
    }
    assert await _counts(store, "q") == expected
    before_group = await _counts(store, "q", "g")
    assert before_group["queued"] == 5 and before_group["cancelled"] == 1

    assert (await store.maintain())["skipped"] == 0  # folds the finished rows
    assert await _counts(store, "q") == expected
    assert await _counts(store, "q", "g") == before_group
    assert (await store.maintain())["skipped"] == 0  # folding twice counts nothing twice
    assert await _counts(store, "q") == expected

    # A rolled-up row that is retried leaves its finished count.
    again = await store.retry(held[3].id)
    assert again is not None and again.status is Status.QUEUED
    assert await _counts(store, "q") == {**expected, "failed": 0, "queued": 1}
    await store.maintain()
    assert await _counts(store, "q") == {**expected, "failed": 0, "queued": 1}

    # Retention deletes rolled-up rows and their counts with them.
    await store.configure_queue("q", retention=10, queue_mode=False)
    for task in await store.claim("q", worker_id="w", group="g", limit=10):
        await store.succeed(task.id, worker_id="w", group="g")
    await store.maintain()
    store.clock_offset = 100
    deleted = (await store.maintain())["deleted"]
    assert deleted == len(tasks)  # group-only queue: finished for g is finished
    remaining = {t.id for t in (await store.list(queue="q", limit=100)).items}
    assert len(remaining) == len(tasks) - deleted
    [report] = await store.stats("q")
    assert sum(report.counts.values()) == len(remaining)
    assert sum(report.groups["g"].counts.values()) == len(remaining)

    # Unsubscribing drops the group's totals.
    await store.unsubscribe("q", "g")
    assert all("g" not in report.groups for report in await store.stats("q"))


async def test_unsubscribe_drops_rolled_up_totals(store: TaskStore) -> None:
    await store.subscribe("q", "g")
    await store.submit_many([{"name": "t", "queue": "q"} for _ in range(3)])
    for task in await store.claim("q", worker_id="w", group="g", limit=3):
        await store.succeed(task.id, worker_id="w", group="g")
    await store.maintain()
    assert (await _counts(store, "q", "g"))["succeeded"] == 3
    await store.unsubscribe("q", "g")
    await store.subscribe("q", "g", start="new")
    assert (await _counts(store, "q", "g"))["succeeded"] == 0
    assert (await _counts(store, "q"))["queued"] == 3
