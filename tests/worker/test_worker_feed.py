"""How the worker feeds its slots (conveyor.worker.feed): acknowledgements that do not
hold a slot, claims across several streams, the prefetch buffer. Real stores on
both backends; the Feed's arithmetic alone at the end."""

from __future__ import annotations

import asyncio
from typing import Any

import conveyor
from _support import running
from conveyor import Status
from conveyor.worker import Context
from conveyor.worker.feed import PREFETCH_BELOW, PREFETCH_MOST, STREAM_RUN_MOST, Feed

SETTLE = 0.3  # seconds given to a claim that must (or must not) happen


async def wait_until(check: Any, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


async def test_concurrency_one_starts_the_next_task_before_the_ack_is_written(
    app: conveyor.App,
) -> None:
    started: list[int] = []

    @app.task(queue="q")
    async def step(ctx: Context, i: int) -> int:
        started.append(i)
        return i

    # Hold every acknowledgement until released: the store itself stays real.
    gate = asyncio.Event()
    real = app.store.internal.ack_claimed  # what the worker acknowledges through

    async def held_back(*items: Any, **options: Any) -> Any:
        await gate.wait()
        return await real(*items, **options)

    app.store.internal.ack_claimed = held_back  # type: ignore[method-assign]
    first = await step.submit(0)
    second = await step.submit(1)
    async with running(app.worker("q", concurrency=1, poll_interval=0.05)):
        # The first task's success is not written yet, and the second runs anyway.
        await wait_until(lambda: started == [0, 1])
        assert (await app.store.get(first.id)).status is Status.RUNNING  # type: ignore[union-attr]
        gate.set()
        done = [await app.store.wait(t.id, timeout=10) for t in (first, second)]
    assert [d.status for d in done] == [Status.SUCCEEDED, Status.SUCCEEDED]
    assert [d.result for d in done] == [0, 1]


async def test_a_stream_gives_its_slot_up_while_its_ack_is_written(app: conveyor.App) -> None:
    started: list[str] = []

    @app.task(queue="q")
    async def step(ctx: Context, tag: str) -> str:
        started.append(tag)
        return tag

    gate = asyncio.Event()
    real = app.store.internal.ack_claimed  # what the worker acknowledges through

    async def held_back(*items: Any, **options: Any) -> Any:
        await gate.wait()
        return await real(*items, **options)

    app.store.internal.ack_claimed = held_back  # type: ignore[method-assign]
    a0 = await step.with_options(partition="a").submit("a0")
    a1 = await step.with_options(partition="a").submit("a1")
    b0 = await step.with_options(partition="b").submit("b0")
    async with running(app.worker("q", concurrency=1, poll_interval=0.05)):
        # a0's success is not written yet: its stream waits (a1 may not overtake
        # it), but the one slot goes to the other stream meanwhile.
        await wait_until(lambda: "b0" in started)
        assert "a1" not in started
        assert (await app.store.get(a0.id)).status is Status.RUNNING  # type: ignore[union-attr]
        gate.set()
        done = [await app.store.wait(t.id, timeout=10) for t in (a0, a1, b0)]
    assert [d.status for d in done] == [Status.SUCCEEDED] * 3
    assert started.index("a0") < started.index("a1")


async def test_one_round_takes_several_streams(app: conveyor.App) -> None:
    gate = asyncio.Event()
    running_now: set[str] = set()
    peak = 0

    @app.task(queue="q")
    async def work(ctx: Context, i: int) -> None:
        nonlocal peak
        assert ctx.task.partition is not None
        running_now.add(ctx.task.partition)
        peak = max(peak, len(running_now))
        await gate.wait()
        running_now.discard(ctx.task.partition)

    # Four streams of three tasks each; the first claim takes one stream's tasks.
    handles = [await work.with_options(partition=f"s{i % 4}").submit(i) for i in range(12)]
    async with running(app.worker("q", concurrency=4, poll_interval=0.05)):
        await wait_until(lambda: peak == 4)
        gate.set()
        done = [await app.store.wait(h.id, timeout=10) for h in handles]
    assert all(d.status is Status.SUCCEEDED for d in done)


async def test_stop_hands_back_prefetched_tasks_at_once(app: conveyor.App) -> None:
    started: list[int] = []
    release = asyncio.Event()

    @app.task(queue="q")
    async def step(ctx: Context, i: int) -> None:
        started.append(i)
        if i == 1:
            await release.wait()

    handles = [await step.submit(i) for i in range(4)]
    worker = app.worker("q", concurrency=1, poll_interval=0.05, grace=5)
    job = asyncio.create_task(worker.run())
    # Task 0 is quick, so the worker buffers ahead while task 1 blocks its slot.
    await wait_until(lambda: started == [0, 1])
    await app.store.wait(handles[0].id, timeout=10)
    await wait_until(lambda: worker.held == 3)  # task 1, and tasks 2 and 3 buffered
    worker.stop()
    # Whatever was buffered is claimable again while task 1 still runs.
    for _ in range(500):
        later = [await app.store.get(h.id) for h in handles[2:]]
        if all(t is not None and t.status is Status.QUEUED for t in later):
            break
        await asyncio.sleep(0.02)
    assert all(t is not None and t.status is Status.QUEUED for t in later)
    assert not release.is_set() and started == [0, 1]
    release.set()
    await asyncio.wait_for(job, 10)
    assert started == [0, 1]
    final = [await app.store.get(h.id) for h in handles]
    assert [t.status for t in final if t] == [
        Status.SUCCEEDED,
        Status.SUCCEEDED,
        Status.QUEUED,
        Status.QUEUED,
    ]


# ------------------------------------------------------------ Feed arithmetic
def test_no_prefetch_until_handlers_prove_quick() -> None:
    feed: Feed[str] = Feed(10)
    assert feed.prefetch == 0 and feed.room() == 10
    feed.ran(PREFETCH_BELOW * 2)
    assert feed.prefetch == 0
    for _ in range(30):
        feed.ran(0.001)
    assert feed.prefetch == 5 and feed.room() == 15


def test_the_buffer_covers_a_claims_round_trip() -> None:
    feed: Feed[str] = Feed(10)
    for _ in range(60):
        feed.ran(0.001)
    feed.claimed(0.002)
    # Ten slots of 1 ms tasks get through 20 during a 2 ms claim.
    assert feed.prefetch == 20 and feed.room() == 30
    for _ in range(60):
        feed.ran(0.02)
    # 20 ms tasks: one round trip is a tenth of a task per slot; half the
    # concurrency still waits in the buffer.
    assert feed.prefetch == 5
    for _ in range(60):
        feed.ran(0.00001)
    assert feed.prefetch == PREFETCH_MOST * 10  # no deeper than that, however quick
    for _ in range(60):
        feed.claimed(0.0)
    assert feed.prefetch == 5
    for _ in range(60):
        feed.ran(PREFETCH_BELOW * 2)
    assert feed.prefetch == 0  # slow tasks: nothing held back from other workers


def test_a_busy_worker_waits_for_a_quarter_of_its_room() -> None:
    feed: Feed[str] = Feed(8)
    feed.add([f"t{i}" for i in range(8)], lambda _: None)
    while feed.take() is not None:
        pass
    assert feed.busy == 8 and feed.room() == 0
    feed.busy = 7  # one slot free, nothing buffered: it would sit idle, so claim
    assert feed.room() == 1
    feed.add(["x"], lambda _: None)
    assert feed.room() == 0  # a slot is covered by the buffer: wait for more room
    feed.busy = 5
    assert feed.room() == 2


def test_partitioned_work_is_taken_one_per_stream_unless_streams_are_few() -> None:
    feed: Feed[tuple[str, str | None]] = Feed(10)
    assert feed.per_stream(0) == 1  # not prefetching: the head alone
    made = feed.add([("a", "p1"), ("b", "p1"), ("c", "p2")], lambda t: t[1])
    assert made == 2 and feed.streams
    assert feed.add([("d", None), ("e", None)], lambda t: t[1]) == 2 and feed.streams is False
    for _ in range(30):
        feed.ran(0.001)
    # Prefetching: a short run of each stream while the streams held are few...
    assert feed.per_stream(1) == feed.per_stream(2) == STREAM_RUN_MOST
    assert feed.per_stream(3) == feed.per_stream(10) == 2
    # ...and the head alone once more streams are held than there are slots.
    assert feed.per_stream(11) == feed.per_stream(100) == 1
    assert feed.take() == [("a", "p1"), ("b", "p1")]
    assert feed.drain() == [("c", "p2"), ("d", None), ("e", None)] and feed.buffered == 0


def test_acknowledgements_far_behind_stop_the_claims() -> None:
    feed: Feed[str] = Feed(2)
    feed.acking = 5
    assert feed.room() == 0
    feed.acking = 4
    assert feed.room() == 2


def test_the_buffer_raises_the_acknowledgement_limit() -> None:
    feed: Feed[str] = Feed(10)
    for _ in range(60):
        feed.ran(0.001)
    feed.claimed(0.002)
    assert feed.prefetch == 20
    # Twice the slots and the buffer: 60 successes being written, not 20.
    feed.acking = 60
    assert not feed.held_back and feed.room() == 30
    feed.acking = 61
    assert feed.held_back and feed.room() == 0


async def test_a_stream_task_finishing_during_an_empty_claim_is_not_missed(
    app: conveyor.App,
) -> None:
    """No wake-up from the store (as across processes on SQLite): the worker's own
    freed slot must lead to the stream's next task, not the poll interval."""
    done: list[int] = []

    @app.task(queue="q")
    async def step(ctx: Context, i: int) -> None:
        # Longer than one slow empty claim, shorter than two: the task ends while
        # the second empty claim of its run is in flight.
        await asyncio.sleep(0.45)
        done.append(i)

    async def no_wake(queues: Any, timeout: float) -> bool:
        await asyncio.sleep(timeout)
        return False

    real_claim = app.store.claim

    async def slow_empty_claim(*args: Any, **kwargs: Any) -> Any:
        got = await real_claim(*args, **kwargs)
        if not got:
            await asyncio.sleep(0.3)  # the running head finishes meanwhile
        return got

    app.store.wait_for_work = no_wake  # type: ignore[method-assign]
    app.store.claim = slow_empty_claim  # type: ignore[method-assign]
    handles = [await step.with_options(partition="s").submit(i) for i in range(3)]
    async with running(app.worker("q", concurrency=2, poll_interval=30)):
        finished = [await app.store.wait(h.id, timeout=10) for h in handles]
    assert [t.status for t in finished] == [Status.SUCCEEDED] * 3
    assert done == [0, 1, 2]


async def test_an_unpartitioned_ack_does_not_make_an_idle_worker_claim_again(
    app: conveyor.App,
) -> None:
    """Its slot was freed when the handler returned (and the claim made then found
    nothing): the acknowledgement committing later changes nothing a claim could
    find, so it must not cost another claim round trip."""

    ran = asyncio.Event()

    @app.task(queue="q")
    async def step(ctx: Context) -> None:
        ran.set()

    gate = asyncio.Event()
    real_ack, real_claim = app.store.internal.ack_claimed, app.store.claim
    claims: list[int] = []

    async def held_back(*items: Any, **options: Any) -> Any:
        await gate.wait()
        return await real_ack(*items, **options)

    async def counted(*args: Any, **kwargs: Any) -> Any:
        found = await real_claim(*args, **kwargs)
        claims.append(len(found))
        return found

    app.store.internal.ack_claimed = held_back  # type: ignore[method-assign]
    app.store.claim = counted  # type: ignore[method-assign]
    task = await step.submit()
    async with running(app.worker("q", concurrency=1, poll_interval=30)):
        await asyncio.wait_for(ran.wait(), 10)
        await asyncio.sleep(SETTLE)  # the claims its freed slot makes (they find nothing)
        before = list(claims)
        gate.set()
        done = await app.store.wait(task.id, timeout=10)
        await asyncio.sleep(SETTLE)  # room for a (wrong) claim after the ack
        assert claims == before
    assert before[0] == 1 and not any(before[1:])
    assert done.status is Status.SUCCEEDED
