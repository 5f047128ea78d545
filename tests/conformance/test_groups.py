"""Bus mode: consumer groups, their registry, and mixed mode with queue mode.

Every test runs on SQLite and PostgreSQL (the ``store`` fixture).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

import conveyor
from conveyor import ConsumerGroup, InvalidArgument, LostLease, NotFound, Status, TaskCancelled
from conveyor.models import Task
from conveyor.store.base import TaskStore

Q = "events"


async def _claim_all(store: TaskStore, group: str | None, worker: str = "w") -> list[Task]:
    return await store.claim(Q, worker_id=worker, group=group, limit=100)


async def _statuses(store: TaskStore, ids: list[str], group: str | None) -> list[Status | None]:
    out: list[Status | None] = []
    for task_id in ids:
        task = await store.get(task_id, group=group)
        out.append(None if task is None else task.status)
    return out


# --------------------------------------------------------------- fan-out


async def test_each_group_and_queue_mode_get_every_task(store: TaskStore) -> None:
    await store.subscribe(Q, "a")
    await store.subscribe(Q, "b")
    ids = [(await store.submit("e", {"n": n}, queue=Q)).id for n in range(5)]

    for group in ("a", "b", None):
        got = await _claim_all(store, group)
        assert [t.id for t in got] == ids, group
        assert all(t.group == group and t.attempt == 1 for t in got)
        assert all(t.status is Status.RUNNING for t in got)
        # Nothing more for this consumer: each task once per group.
        assert await _claim_all(store, group, worker="w2") == []


async def test_a_batch_fans_out_its_own_tasks_to_every_group(store: TaskStore) -> None:
    """A batch of plain tasks, after tasks already stored: each group and queue
    mode get each new task once, and the older ones are not written again (on
    SQLite the batch's delivery rows are those of every task above the largest
    seq before it)."""
    await store.subscribe(Q, "a")
    older = [(await store.submit("e", {"n": n}, queue=Q)).id for n in range(2)]
    batch = await store.submit_many(
        [{"name": "e", "queue": Q, "payload": {"n": n}} for n in range(2, 150)]
        + [{"name": "e", "queue": "elsewhere", "payload": {}}]
    )
    ids = older + [t.id for t in batch[:-1]]
    for group in ("a", None):
        got = await store.claim(Q, worker_id="w", group=group, limit=1000)
        assert [t.id for t in got] == ids, group
    elsewhere = await store.claim("elsewhere", worker_id="w", limit=10)
    assert [t.id for t in elsewhere] == [batch[-1].id]


async def test_success_in_one_group_leaves_the_others_queued(store: TaskStore) -> None:
    await store.subscribe(Q, "a")
    await store.subscribe(Q, "b")
    task = await store.submit("e", {"x": 1}, queue=Q)

    [mine] = await store.claim(Q, worker_id="wa", group="a")
    done = await store.succeed(mine.id, worker_id="wa", group="a", result={"by": "a"})
    assert done.status is Status.SUCCEEDED and done.result == {"by": "a"} and done.group == "a"

    b_view = await store.get(task.id, group="b")
    qm_view = await store.get(task.id)
    assert b_view is not None and qm_view is not None
    assert (b_view.status, b_view.attempt, b_view.result) == (Status.QUEUED, 0, None)
    assert (qm_view.status, qm_view.attempt, qm_view.result) == (Status.QUEUED, 0, None)
    assert b_view.group == "b" and qm_view.group is None
    # The immutable part is shared.
    assert b_view.payload == qm_view.payload == done.payload == {"x": 1}

    # b and queue mode still receive it.
    assert [t.id for t in await store.claim(Q, worker_id="wb", group="b")] == [task.id]
    assert [t.id for t in await store.claim(Q, worker_id="wq")] == [task.id]


async def test_each_group_has_its_own_attempts_errors_and_results(store: TaskStore) -> None:
    await store.subscribe(Q, "a")
    await store.subscribe(Q, "b")
    task = await store.submit("e", queue=Q, max_attempts=3)

    # a: fails twice (retryable, no delay) then succeeds.
    for attempt in (1, 2):
        [t] = await store.claim(Q, worker_id="wa", group="a")
        assert t.attempt == attempt
        failed = await store.fail(
            t.id, worker_id="wa", group="a", error="flaky", delay=0, attempt=attempt
        )
        assert failed.status is Status.QUEUED and failed.error is not None
    [t] = await store.claim(Q, worker_id="wa", group="a")
    assert t.attempt == 3
    await store.succeed(t.id, worker_id="wa", group="a", result=["a"], attempt=3)

    # b: fails for good on its first attempt.
    [t] = await store.claim(Q, worker_id="wb", group="b")
    assert t.attempt == 1
    b_done = await store.fail(
        t.id, worker_id="wb", group="b", error=ValueError("bad"), retryable=False
    )
    assert b_done.status is Status.FAILED
    assert b_done.error is not None and b_done.error["type"] == "ValueError"

    # queue mode: succeeds at once.
    [t] = await store.claim(Q, worker_id="wq")
    await store.succeed(t.id, worker_id="wq", result="qm")

    a = await store.get(task.id, group="a")
    b = await store.get(task.id, group="b")
    qm = await store.get(task.id)
    assert a is not None and b is not None and qm is not None
    assert (a.status, a.attempt, a.result) == (Status.SUCCEEDED, 3, ["a"])
    assert a.error is not None and a.error["message"] == "flaky"
    assert (b.status, b.attempt, b.result) == (Status.FAILED, 1, None)
    assert b.error is not None and b.error["message"] == "bad"
    assert (qm.status, qm.attempt, qm.result, qm.error) == (Status.SUCCEEDED, 1, "qm", None)


async def test_heartbeat_progress_and_acks_are_scoped_to_the_group(store: TaskStore) -> None:
    await store.subscribe(Q, "a")
    await store.subscribe(Q, "b")
    task = await store.submit("e", queue=Q)
    [t] = await store.claim(Q, worker_id="w", group="a", lease=10)

    beat = await store.heartbeat(t.id, worker_id="w", group="a", lease=100)
    assert beat.lease_expires_at is not None and t.lease_expires_at is not None
    assert beat.lease_expires_at > t.lease_expires_at
    prog = await store.progress(t.id, worker_id="w", group="a", progress=0.5, message="half")
    assert (prog.progress, prog.progress_message, prog.group) == (0.5, "half", "a")

    # The same worker id holds nothing in queue mode or in group b.
    for group in (None, "b"):
        with pytest.raises(LostLease):
            await store.heartbeat(t.id, worker_id="w", group=group)
        with pytest.raises(LostLease):
            await store.progress(t.id, worker_id="w", group=group, progress=0.1)
        with pytest.raises(LostLease):
            await store.succeed(t.id, worker_id="w", group=group)
        with pytest.raises(LostLease):
            await store.fail(t.id, worker_id="w", group=group, error="x")
    # A group that never saw the task: not found for it.
    with pytest.raises(NotFound):
        await store.succeed(t.id, worker_id="w", group="never-subscribed")

    for group in (None, "b"):
        view = await store.get(task.id, group=group)
        assert view is not None and view.status is Status.QUEUED and view.progress is None
    a = await store.get(task.id, group="a")
    assert a is not None and a.status is Status.RUNNING and a.progress == 0.5


async def test_get_and_list_with_group(store: TaskStore) -> None:
    await store.subscribe(Q, "a")
    ids = [(await store.submit("e", {"n": n}, queue=Q)).id for n in range(4)]
    [first, second] = await store.claim(Q, worker_id="w", group="a", limit=2)
    await store.succeed(first.id, worker_id="w", group="a")

    page = await store.list(queue=Q, group="a")
    assert [t.id for t in page.items] == ids and all(t.group == "a" for t in page.items)
    assert [t.status for t in page.items] == [
        Status.SUCCEEDED,
        Status.RUNNING,
        Status.QUEUED,
        Status.QUEUED,
    ]
    assert [t.id for t in (await store.list(group="a", status="queued")).items] == ids[2:]
    assert [t.id for t in (await store.list(group="a", status="running")).items] == [second.id]
    assert [t.id for t in (await store.list(queue=Q, status="queued")).items] == ids
    assert (await store.list(queue=Q, status="succeeded")).items == []
    # Paging inside a group.
    p1 = await store.list(queue=Q, group="a", limit=3)
    assert p1.next_cursor is not None
    p2 = await store.list(queue=Q, group="a", limit=3, cursor=p1.next_cursor)
    assert [t.id for t in p1.items + p2.items] == ids and p2.next_cursor is None
    # A group that does not exist sees nothing.
    assert (await store.list(queue=Q, group="zzz")).items == []
    assert await store.get(ids[0], group="zzz") is None


async def test_consumers_inside_a_group_compete(store: TaskStore) -> None:
    n_tasks, n_consumers = 80, 10
    await store.subscribe(Q, "g")
    await store.submit_many([{"name": "e", "payload": i, "queue": Q} for i in range(n_tasks)])
    seen: Counter[str] = Counter()
    qm_seen: Counter[str] = Counter()

    async def consumer(worker: str, group: str | None, log: Counter[str]) -> None:
        while True:
            got = await store.claim(Q, worker_id=worker, group=group, limit=3, lease=60)
            if not got:
                return
            for t in got:
                log[t.id] += 1
                await asyncio.sleep(0)
                await store.succeed(t.id, worker_id=worker, group=group, attempt=t.attempt)

    await asyncio.gather(
        *(consumer(f"g{i}", "g", seen) for i in range(n_consumers)),
        *(consumer(f"q{i}", None, qm_seen) for i in range(n_consumers // 2)),
    )
    assert len(seen) == n_tasks and set(seen.values()) == {1}
    assert len(qm_seen) == n_tasks and set(qm_seen.values()) == {1}
    page = await store.list(queue=Q, group="g", status="succeeded", limit=1000)
    assert len(page.items) == n_tasks


async def test_queue_mode_is_unchanged_by_groups(store: TaskStore) -> None:
    """Mixed mode: queue-mode consumers see exactly what they would without groups."""
    await store.subscribe(Q, "a")
    t1 = await store.submit("e", queue=Q, priority=1)
    t2 = await store.submit("e", queue=Q, priority=5)
    # Group a drains everything first; queue mode is not affected.
    for t in await store.claim(Q, worker_id="wa", group="a", limit=10):
        await store.succeed(t.id, worker_id="wa", group="a")
    got = await store.claim(Q, worker_id="wq", limit=10)
    assert [t.id for t in got] == [t2.id, t1.id]  # priority order, as in plain queue mode
    assert all(t.group is None and t.attempt == 1 for t in got)
    # Another queue is untouched by the group.
    other = await store.submit("e", queue="other")
    assert await store.get(other.id, group="a") is None
    with pytest.raises(NotFound, match="group 'a' on queue 'other'"):
        await store.claim("other", worker_id="wa", group="a")  # not subscribed there
    assert await store.claim("other", worker_id="wa", group="a", subscribe="all") != []


# ------------------------------------------------------- leases, retries


async def test_lease_expiry_is_per_group(store: TaskStore) -> None:
    await store.subscribe(Q, "a")
    await store.subscribe(Q, "b")
    task = await store.submit("e", queue=Q, max_attempts=2)
    [a1] = await store.claim(Q, worker_id="a1", group="a", lease=10)
    [b1] = await store.claim(Q, worker_id="b1", group="b", lease=1000)
    [q1] = await store.claim(Q, worker_id="q1", lease=1000)

    store.clock_offset = 20  # a's lease ran out; b's and queue mode's did not
    [a2] = await store.claim(Q, worker_id="a2", group="a", lease=10)
    assert a2.id == task.id and a2.attempt == 2
    assert await store.claim(Q, worker_id="b2", group="b") == []
    assert await store.claim(Q, worker_id="q2") == []
    with pytest.raises(LostLease):
        await store.succeed(a1.id, worker_id="a1", group="a", attempt=1)
    # b and queue mode holders still own their leases.
    await store.heartbeat(b1.id, worker_id="b1", group="b")
    await store.succeed(q1.id, worker_id="q1")

    store.clock_offset = 40  # a's second (last) lease ran out: failed for a only
    assert await store.claim(Q, worker_id="a3", group="a") == []
    a = await store.get(task.id, group="a")
    assert a is not None and a.status is Status.FAILED
    assert a.error is not None and a.error["code"] == "lease_expired"
    b = await store.get(task.id, group="b")
    qm = await store.get(task.id)
    assert b is not None and b.status is Status.RUNNING and b.attempt == 1
    assert qm is not None and qm.status is Status.SUCCEEDED


async def test_recover_counts_every_group(store: TaskStore) -> None:
    await store.subscribe(Q, "a")
    await store.subscribe(Q, "b")
    task = await store.submit("e", queue=Q, max_attempts=1)
    other = await store.submit("e", queue=Q, max_attempts=5)
    for group in ("a", "b", None):
        got = await store.claim(Q, worker_id="w", group=group, lease=5, limit=2)
        assert len(got) == 2
    store.clock_offset = 10
    assert await store.recover() == (3, 3)
    for group in ("a", "b", None):
        t = await store.get(task.id, group=group)
        o = await store.get(other.id, group=group)
        assert t is not None and t.status is Status.FAILED
        assert o is not None and o.status is Status.QUEUED and o.attempt == 1


async def test_retry_with_delay_and_retry_call_are_per_group(store: TaskStore) -> None:
    await store.subscribe(Q, "a")
    task = await store.submit("e", queue=Q, max_attempts=2)
    [t] = await store.claim(Q, worker_id="w", group="a")
    waiting = await store.fail(t.id, worker_id="w", group="a", error="later", delay=30)
    assert waiting.status is Status.QUEUED and waiting.run_at > t.run_at
    assert await store.claim(Q, worker_id="w", group="a") == []
    # queue mode is not held back by a's retry delay.
    [qm] = await store.claim(Q, worker_id="q")
    assert qm.id == task.id and qm.attempt == 1
    store.clock_offset = 31
    [t] = await store.claim(Q, worker_id="w", group="a")
    assert t.attempt == 2
    final = await store.fail(t.id, worker_id="w", group="a", error="again")
    assert final.status is Status.FAILED  # attempts used up

    # retry(group=...) only touches that group's view.
    again = await store.retry(task.id, group="a")
    assert again is not None and again.status is Status.QUEUED and again.group == "a"
    qm_view = await store.get(task.id)
    assert qm_view is not None and qm_view.status is Status.RUNNING
    assert await store.retry(task.id) == qm_view  # running: unchanged
    [t] = await store.claim(Q, worker_id="w", group="a")
    assert t.attempt == 3
    reset = await store.fail(t.id, worker_id="w", group="a", error="x", retryable=False)
    assert reset.status is Status.FAILED
    fresh = await store.retry(task.id, group="a", reset_attempts=True)
    assert fresh is not None and fresh.attempt == 3 and fresh.max_attempts == 3 + 2


async def test_cancel_withdraws_for_queue_mode_and_every_group(store: TaskStore) -> None:
    await store.subscribe(Q, "a")
    await store.subscribe(Q, "b")
    await store.subscribe(Q, "c")
    task = await store.submit("e", queue=Q)
    [held] = await store.claim(Q, worker_id="wa", group="a")
    [done] = await store.claim(Q, worker_id="wc", group="c")
    await store.succeed(done.id, worker_id="wc", group="c")

    cancelled = await store.cancel(task.id)
    assert cancelled is not None and cancelled.status is Status.CANCELLED
    assert await _statuses(store, [task.id], "a") == [Status.CANCELLED]
    assert await _statuses(store, [task.id], "b") == [Status.CANCELLED]
    assert await _statuses(store, [task.id], "c") == [Status.SUCCEEDED]  # terminal: unchanged
    with pytest.raises(TaskCancelled):
        await store.succeed(held.id, worker_id="wa", group="a")
    for group in ("a", "b", None):
        assert await _claim_all(store, group) == []


# -------------------------------------------------------------- registry


async def test_subscribe_returns_the_group_and_is_idempotent(store: TaskStore) -> None:
    group = await store.subscribe(Q, "a")
    assert isinstance(group, ConsumerGroup)
    assert (group.queue, group.name, group.active) == (Q, "a", True)
    assert group.created_at.tzinfo is not None
    again = await store.subscribe(Q, "a", start="new")
    assert again == group  # already active: unchanged
    listed = await store.groups(Q)
    assert listed == [group]
    assert await store.groups("nope") == []


async def test_a_claim_never_creates_a_group_by_itself(store: TaskStore) -> None:
    """A misspelt group name must not register a new group that replays the whole
    history: the claim is refused, naming the group, the queue, the groups it has
    and how to subscribe, and nothing is written."""
    await store.subscribe(Q, "billing")
    ids = [(await store.submit("e", {"n": n}, queue=Q)).id for n in range(3)]
    with pytest.raises(NotFound) as refused:
        await store.claim(Q, worker_id="w", group="biling", limit=10)
    message = str(refused.value)
    assert "group 'biling' on queue 'events' not found" in message
    assert "groups of 'events': 'billing'" in message
    assert "subscribe('events', 'biling', start=\"new\")" in message
    assert 'subscribe="new" or "all"' in message
    assert [g.name for g in await store.groups(Q)] == ["billing"]
    assert await store.get(ids[0], group="biling") is None
    # Still refused the next time (nothing was cached), on a queue with no group too.
    with pytest.raises(NotFound, match="biling"):
        await store.claim(Q, worker_id="w", group="biling")
    with pytest.raises(NotFound, match="queue 'empty' has no groups"):
        await store.claim("empty", worker_id="w", group="g")
    assert [g.name for g in await store.groups()] == ["billing"]


async def test_a_claim_subscribes_a_new_group_when_asked(store: TaskStore) -> None:
    ids = [(await store.submit("e", {"n": n}, queue=Q)).id for n in range(3)]
    [t] = await store.claim(Q, worker_id="w")
    await store.succeed(t.id, worker_id="w")  # queue mode finished one: irrelevant for a group
    got = await store.claim(Q, worker_id="w", group="late", limit=10, subscribe="all")
    assert [t.id for t in got] == ids
    [group] = await store.groups(Q)
    assert group.name == "late" and group.active and group.start is None
    # Tasks submitted from now on are delivered as well; subscribe= on an active
    # group changes nothing.
    new = await store.submit("e", queue=Q)
    got = await store.claim(Q, worker_id="w", group="late", subscribe="new")
    assert [t.id for t in got] == [new.id]
    # "new": only what is submitted after the claim subscribed the group.
    assert await store.claim(Q, worker_id="w", group="fresh", subscribe="new", limit=10) == []
    later = await store.submit("e", queue=Q)
    assert [t.id for t in await store.claim(Q, worker_id="w", group="fresh")] == [later.id]
    # A datetime: tasks created since then.
    since = await store.claim(
        Q, worker_id="w", group="replay", limit=10, subscribe=later.created_at
    )
    assert [t.id for t in since] == [later.id]


async def test_claim_subscribe_argument_is_checked(store: TaskStore) -> None:
    await store.submit("e", queue=Q)
    with pytest.raises(InvalidArgument, match=r"subscribe.*group="):
        await store.claim(Q, worker_id="w", subscribe="all")
    for bad in ("everything", True, 3, datetime(2026, 1, 1)):
        with pytest.raises(InvalidArgument, match="subscribe"):
            await store.claim(Q, worker_id="w", group="g", subscribe=bad)  # type: ignore[arg-type]
    assert await store.groups() == []


async def test_subscribe_new_sees_only_later_tasks(store: TaskStore) -> None:
    before = await store.submit("e", queue=Q)
    await store.subscribe(Q, "n", start="new")
    after = await store.submit("e", queue=Q)
    got = await store.claim(Q, worker_id="w", group="n", limit=10)
    assert [t.id for t in got] == [after.id]
    assert await store.get(before.id, group="n") is None
    # A group subscribed with "all" at the same moment sees both.
    await store.subscribe(Q, "all")
    got = await store.claim(Q, worker_id="w", group="all", limit=10)
    assert [t.id for t in got] == [before.id, after.id]


async def test_subscribe_from_datetime_replays_from_that_moment(store: TaskStore) -> None:
    tasks = []
    for n in range(5):
        tasks.append(await store.submit("e", {"n": n}, queue=Q))
        await asyncio.sleep(0.002)
    assert tasks[1].created_at < tasks[2].created_at  # a real boundary
    boundary = tasks[2].created_at
    group = await store.subscribe(Q, "replay", start=boundary)
    assert group.start == boundary
    got = await store.claim(Q, worker_id="w", group="replay", limit=10)
    assert [t.id for t in got] == [t.id for t in tasks[2:]]
    # Replay from the future: nothing of the past, everything later.
    future = datetime.now(UTC) + timedelta(hours=1)
    await store.subscribe(Q, "future", start=future)
    assert await store.claim(Q, worker_id="w", group="future") == []
    # A naive datetime is refused.
    with pytest.raises(InvalidArgument):
        await store.subscribe(Q, "naive", start=datetime(2020, 1, 1))
    with pytest.raises(InvalidArgument):
        await store.subscribe(Q, "bad", start="yesterday")  # type: ignore[arg-type]


async def test_datetime_start_tolerates_backfill_racing_producers(store: TaskStore) -> None:
    """Tasks submitted while a replaying group backfills are delivered once."""
    for n in range(30):
        await store.submit("e", {"n": n}, queue=Q)
    start = datetime.now(UTC) - timedelta(hours=1)

    async def produce() -> list[str]:
        out = []
        for n in range(30):
            out.append((await store.submit("e", {"n": 100 + n}, queue=Q)).id)
        return out

    producer = asyncio.create_task(produce())
    await asyncio.sleep(0.01)
    await store.subscribe(Q, "g", start=start)
    await producer
    got = await store.claim(Q, worker_id="w", group="g", limit=1000)
    assert len(got) == 60 and len({t.id for t in got}) == 60


async def test_unsubscribe_stops_delivery(store: TaskStore) -> None:
    await store.subscribe(Q, "a")
    old = await store.submit("e", queue=Q)
    assert await store.unsubscribe(Q, "a") is True
    assert await store.unsubscribe(Q, "a") is False
    assert await store.unsubscribe(Q, "never") is False
    new = await store.submit("e", queue=Q)
    assert await store.get(new.id, group="a") is None
    assert await store.get(old.id, group="a") is None  # its state is dropped
    # A claim as the group is refused, with or without subscribe=: only subscribe()
    # starts an unsubscribed group over.
    for start in (None, "all"):
        with pytest.raises(NotFound, match="unsubscribed"):
            await store.claim(Q, worker_id="w", group="a", subscribe=start)  # type: ignore[arg-type]
    [group] = await store.groups(Q)
    assert group.active is False
    # Queue mode is untouched.
    assert [t.id for t in await store.claim(Q, worker_id="w", limit=10)] == [old.id, new.id]
    stats = await store.stats(Q)
    assert stats[0].groups == {}


async def test_resubscribe_after_unsubscribe_starts_over(store: TaskStore) -> None:
    await store.subscribe(Q, "a")
    t1 = await store.submit("e", queue=Q)
    [t] = await store.claim(Q, worker_id="w", group="a")
    await store.succeed(t.id, worker_id="w", group="a")
    await store.unsubscribe(Q, "a")
    t2 = await store.submit("e", queue=Q)
    group = await store.subscribe(Q, "a", start="all")
    assert group.active
    got = await store.claim(Q, worker_id="w", group="a", limit=10)
    assert [t.id for t in got] == [t1.id, t2.id] and all(t.attempt == 1 for t in got)


GOOD_NAMES = [
    "with spaces in it",
    "it's",
    'say "hi"',
    "'; DROP TABLE conveyor_tasks; --",
    "grüße-日本語-🚀",
    "g" * 255,
    "ü" * 255,
]


async def test_group_names(store: TaskStore) -> None:
    for i, name in enumerate(GOOD_NAMES):
        queue = f"names-{i}"
        task = await store.submit("e", queue=queue)
        group = await store.subscribe(queue, name)
        assert group.name == name
        [t] = await store.claim(queue, worker_id="w", group=name)
        assert t.group == name and t.id == task.id
        await store.heartbeat(t.id, worker_id="w", group=name)
        await store.progress(t.id, worker_id="w", group=name, progress=1.0)
        await store.succeed(t.id, worker_id="w", group=name, result=name)
        got = await store.get(task.id, group=name)
        assert got is not None and got.status is Status.SUCCEEDED and got.result == name
        assert [x.id for x in (await store.list(group=name)).items] == [task.id]
        stats = await store.stats(queue)
        assert stats[0].groups[name].lag == 0
        assert [g.name for g in await store.groups(queue)] == [name]
        qm = await store.get(task.id)
        assert qm is not None and qm.status is Status.QUEUED
        assert await store.unsubscribe(queue, name) is True
    # All of them side by side on one queue stay distinct.
    task = await store.submit("e", queue=Q)
    for name in GOOD_NAMES:
        got = await store.claim(Q, worker_id="w", group=name, subscribe="all")
        assert [t.id for t in got] == [task.id]
    assert sorted(g.name for g in await store.groups(Q)) == sorted(GOOD_NAMES)


async def test_bad_group_names_are_refused(store: TaskStore) -> None:
    task = await store.submit("e", queue=Q)
    for name in ("", "g" * 256, "ü" * 256):
        with pytest.raises(InvalidArgument):
            await store.subscribe(Q, name)
        with pytest.raises(InvalidArgument):
            await store.claim(Q, worker_id="w", group=name)
        with pytest.raises(InvalidArgument):
            await store.get(task.id, group=name)
        with pytest.raises(InvalidArgument):
            await store.list(group=name)
        with pytest.raises(InvalidArgument):
            await store.succeed(task.id, worker_id="w", group=name)
        with pytest.raises(InvalidArgument):
            await store.unsubscribe(Q, name)
    assert await store.groups() == []


async def test_task_cancelled_before_subscribe_arrives_cancelled(store: TaskStore) -> None:
    """Documented decision: a cancel withdraws a task for groups that come later too."""
    gone = await store.submit("e", queue=Q)
    kept = await store.submit("e", queue=Q)
    await store.cancel(gone.id)
    await store.subscribe(Q, "late", start="all")
    view = await store.get(gone.id, group="late")
    assert view is not None and view.status is Status.CANCELLED and view.attempt == 0
    assert [t.id for t in await store.claim(Q, worker_id="w", group="late", limit=9)] == [kept.id]
    # The group can still choose to process it.
    again = await store.retry(gone.id, group="late")
    assert again is not None and again.status is Status.QUEUED
    assert [t.id for t in await store.claim(Q, worker_id="w", group="late")] == [gone.id]


async def test_a_group_unsubscribed_elsewhere_stays_unsubscribed_until_subscribe(
    store: TaskStore, store_url: str
) -> None:
    """Unsubscribing is an operator's decision: a worker still claiming as the group
    (here with a cached subscription, in another store) gets nothing and does not
    bring the group back; an explicit subscribe() does, from its start."""
    old = await store.submit("e", queue=Q)
    [t] = await store.claim(Q, worker_id="w", group="g", subscribe="all")
    await store.succeed(t.id, worker_id="w", group="g")
    async with conveyor.connect(store_url) as admin:
        assert await admin.unsubscribe(Q, "g") is True
        assert await admin.get(old.id, group="g") is None
    new = await store.submit("e", queue=Q)
    assert await store.claim(Q, worker_id="w", group="g", limit=10) == []
    [group] = await store.groups(Q)
    assert not group.active
    async with conveyor.connect(store_url) as admin:
        await admin.subscribe(Q, "g", start="all")
    got = await store.claim(Q, worker_id="w", group="g", limit=10)
    assert [x.id for x in got] == [old.id, new.id]


async def test_a_group_claiming_several_queues_is_subscribed_to_each(store: TaskStore) -> None:
    t1 = await store.submit("e", queue="q1")
    t2 = await store.submit("e", queue="q2")
    await store.subscribe("q2", "g")
    with pytest.raises(NotFound, match="group 'g' on queue 'q1'"):
        await store.claim(["q1", "q2"], worker_id="w", group="g", limit=10)
    got = await store.claim(["q1", "q2"], worker_id="w", group="g", limit=10, subscribe="all")
    assert sorted(t.id for t in got) == sorted([t1.id, t2.id])
    assert [(g.queue, g.name) for g in await store.groups()] == [("q1", "g"), ("q2", "g")]
    t3 = await store.submit("e", queue="q2")
    assert [t.id for t in await store.claim("q2", worker_id="w", group="g")] == [t3.id]
