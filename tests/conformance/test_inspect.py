"""The reads behind the dashboard and the metrics: workers, deliveries, children,
streams, throughput and finished totals, on both backends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from conveyor import InvalidArgument, Status
from conveyor.store.base import TaskStore


async def test_workers_lists_lease_holders_with_their_tasks(store: TaskStore) -> None:
    assert await store.workers() == []
    await store.subscribe("q", "g")
    await store.submit_many([{"name": "t", "queue": "q"} for _ in range(3)])
    a = await store.claim("q", worker_id="wa", limit=2, lease=60)
    b = await store.claim("q", worker_id="wb", limit=1, lease=60, group="g")
    done = await store.claim("q", worker_id="wc", limit=1)
    await store.succeed(done[0].id, worker_id="wc")
    before = datetime.now(UTC)
    await store.heartbeat(a[0].id, worker_id="wa", lease=60)

    found = {w.worker_id: w for w in await store.workers()}
    assert set(found) == {"wa", "wb"}
    assert sorted(t.id for t in found["wa"].tasks) == sorted(t.id for t in a)
    assert [(t.id, t.group, t.status) for t in found["wb"].tasks] == [
        (b[0].id, "g", Status.RUNNING)
    ]
    # The heartbeat moved wa's last-seen time up to (about) the heartbeat.
    assert abs((found["wa"].last_seen - before).total_seconds()) < 5
    assert found["wa"].last_seen >= found["wb"].last_seen


async def test_deliveries_shows_every_view_and_children_the_subtasks(store: TaskStore) -> None:
    await store.subscribe("q", "g1")
    await store.subscribe("q", "g2")
    parent = await store.submit("p", queue="q")
    kids = [await store.submit("c", {"i": i}, queue="q", parent=parent) for i in range(3)]
    [claimed] = await store.claim("q", worker_id="w", group="g2", limit=1)
    assert claimed.id == parent.id
    await store.succeed(parent.id, worker_id="w", group="g2", result=1)

    views = await store.deliveries(parent.id)
    assert [(v.group, v.status) for v in views] == [
        (None, Status.QUEUED),
        ("g1", Status.QUEUED),
        ("g2", Status.SUCCEEDED),
    ]
    assert views[2].result == 1
    assert await store.deliveries("01NOSUCHTASK0000000000000") == []
    assert [c.id for c in await store.children(parent.id)] == [k.id for k in kids]
    assert [c.id for c in await store.children(parent.id, limit=2)] == [k.id for k in kids[:2]]
    assert await store.children(kids[0].id) == []
    with pytest.raises(InvalidArgument, match="limit"):
        await store.children(parent.id, limit=0)


async def test_streams_reports_busiest_and_why_heads_are_blocked(store: TaskStore) -> None:
    await store.submit_many(
        [{"name": "t", "queue": "q", "partition": "busy", "payload": i} for i in range(4)]
    )
    await store.submit_many(
        [{"name": "t", "queue": "q", "partition": "leased", "payload": i} for i in range(2)]
    )
    await store.claim("q", worker_id="w", partition="leased")
    await store.submit("t", queue="q", partition="retrying")
    [head] = await store.claim("q", worker_id="w", partition="retrying")
    await store.fail(head.id, worker_id="w", error="boom", delay=600)
    await store.submit("t", queue="q", partition="later", delay=600)
    await store.submit("t", queue="q")  # unpartitioned work is not a stream

    report = await store.streams("q")
    assert [(s.partition, s.depth) for s in report.busiest] == [
        ("busy", 4),
        ("leased", 2),
        ("later", 1),
        ("retrying", 1),
    ]
    assert report.busiest[0].blocked is None and report.busiest[0].head is not None
    reasons = {s.partition: (s.blocked, s.head.status if s.head else None) for s in report.blocked}
    assert reasons == {
        "leased": ("leased", Status.RUNNING),
        "retrying": ("retry", Status.QUEUED),
        "later": ("run_at", Status.QUEUED),
    }
    waits = {s.partition: s.until for s in report.blocked}
    assert all(until is not None for until in waits.values())
    assert len((await store.streams("q", limit=1)).busiest) == 1
    # Each group has its own streams.
    assert (await store.streams("q", group="nobody")).busiest == []


async def test_throughput_counts_finishes_per_minute_across_rollups(store: TaskStore) -> None:
    await store.subscribe("q", "g")
    await store.submit_many([{"name": "t", "queue": "q"} for _ in range(5)])
    held = await store.claim("q", worker_id="w", limit=5)
    for task in held[:3]:
        await store.succeed(task.id, worker_id="w")
    await store.fail(held[3].id, worker_id="w", error="x", retryable=False)
    await store.fail(held[4].id, worker_id="w", error="x", retryable=True)  # not a finish

    def totals(points: list) -> dict[str, int]:  # type: ignore[type-arg]
        out: dict[str, int] = {}
        for p in points:
            for status, n in p.counts.items():
                out[status] = out.get(status, 0) + n
        return out

    points = await store.throughput("q", minutes=60)
    assert len(points) == 60
    assert points[-1].minute <= datetime.now(UTC) < points[-1].minute + timedelta(minutes=1)
    live = totals(points)
    assert (live["succeeded"], live["failed"]) == (3, 1)
    await store.maintain()  # rolls the finished rows up: nothing counted twice or lost
    assert totals(await store.throughput("q", minutes=60)) == live
    assert totals(await store.throughput(minutes=5)) == live
    assert totals(await store.throughput("q", group="g"))["succeeded"] == 0
    assert totals(await store.throughput("other"))["succeeded"] == 0
    with pytest.raises(InvalidArgument, match="minutes"):
        await store.throughput(minutes=0)


async def test_finished_totals_only_grow(store: TaskStore) -> None:
    await store.configure_queue("q", retention=0)
    await store.submit_many([{"name": "a", "queue": "q"}, {"name": "b", "queue": "q"}])
    held = await store.claim("q", worker_id="w", limit=2)
    await store.succeed(held[0].id, worker_id="w")
    await store.fail(held[1].id, worker_id="w", error="x", retryable=False)
    expected = {("q", None, "a", "succeeded", 1), ("q", None, "b", "failed", 1)}
    assert set(await store.finished_totals()) == expected
    await store.maintain()  # rolls up, then retention deletes both tasks
    assert set(await store.finished_totals()) == expected
    assert await store.get(held[0].id) is None

    # A retried task that fails again counts twice: these are events, not rows.
    t = await store.submit("b", queue="q")
    await store.claim("q", worker_id="w")
    await store.fail(t.id, worker_id="w", error="x", retryable=False)
    await store.maintain()
    await store.configure_queue("q", retention=3600)
    t2 = await store.submit("b", queue="q")
    await store.claim("q", worker_id="w")
    await store.fail(t2.id, worker_id="w", error="x", retryable=False)
    await store.maintain()
    await store.retry(t2.id)
    await store.claim("q", worker_id="w")
    await store.fail(t2.id, worker_id="w", error="x", retryable=False)
    totals = {(q, g, n, s): c for q, g, n, s, c in await store.finished_totals()}
    assert totals[("q", None, "b", "failed")] == 4


async def test_queue_settings_lists_configured_queues(store: TaskStore) -> None:
    assert await store.queue_settings() == []
    await store.configure_queue("b", lease=10)
    await store.configure_queue("a", max_attempts=7, queue_mode=False)
    found = await store.queue_settings()
    assert [s["queue"] for s in found] == ["a", "b"]
    assert found[0] == await store.get_queue("a")
    assert found[1]["lease"] == 10


async def test_announced_workers_are_live_busy_or_idle(store: TaskStore) -> None:
    import os
    import socket

    await store.announce_worker("idle", queues=["q", "r"], concurrency=4)
    await store.announce_worker("busy", queues="q", group="g", concurrency=2)
    await store.subscribe("q", "g")
    await store.submit("t", queue="q")
    [held] = await store.claim("q", worker_id="busy", group="g", lease=60)
    found = {w.worker_id: w for w in await store.workers()}
    assert set(found) == {"idle", "busy"}
    idle, busy = found["idle"], found["busy"]
    assert (idle.tasks, idle.queues, idle.group, idle.concurrency) == ([], ["q", "r"], None, 4)
    assert (busy.queues, busy.group, busy.concurrency) == (["q"], "g", 2)
    assert [t.id for t in busy.tasks] == [held.id]
    assert idle.host == socket.gethostname() and idle.pid == os.getpid()
    assert idle.started_at is not None and idle.last_seen >= idle.started_at
    # A second announcement keeps the start time and moves last_seen.
    started = idle.started_at
    await store.announce_worker("idle", queues=["q"], concurrency=8)
    again = {w.worker_id: w for w in await store.workers()}["idle"]
    assert again.started_at == started and again.concurrency == 8 and again.queues == ["q"]

    # A stopped worker is forgotten; one still holding leases stays, as a lease holder.
    await store.retire_worker("idle")
    await store.retire_worker("busy")
    found = {w.worker_id: w for w in await store.workers()}
    assert set(found) == {"busy"} and found["busy"].queues == []


async def test_an_announcement_expires(store: TaskStore) -> None:
    await store.announce_worker("short", queues=["q"], ttl=1)
    await store.announce_worker("long", queues=["q"], ttl=3600)
    store.clock_offset = 5.0
    try:
        assert [w.worker_id for w in await store.workers()] == ["long"]
        # The next announcement deletes the expired row; announcing again revives none.
        await store.announce_worker("other", queues=["q"])
    finally:
        store.clock_offset = 0.0
    assert sorted(w.worker_id for w in await store.workers()) == ["long", "other"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"queues": []}, "queues"),
        ({"queues": ["q"], "concurrency": 0}, "concurrency"),
        ({"queues": ["q"], "ttl": 0}, "ttl"),
        ({"queues": [""]}, "queues"),
        ({"queues": ["q"], "group": ""}, "group"),
    ],
)
async def test_announce_refuses_bad_input(store: TaskStore, kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        await store.announce_worker("w", **kwargs)
    assert info.value.field == field
    assert await store.workers() == []
