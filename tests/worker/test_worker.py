"""The App and the worker, in one process, on both backends (SPEC §2.6)."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from datetime import datetime, timedelta
from typing import Any

import pytest

import conveyor
from _support import idle_waits, running, seconds
from conveyor import LostLease, Status
from conveyor.app import load_app, payload_arguments
from conveyor.errors import ConfigurationError
from conveyor.worker import Context


async def test_tasks_run_and_results_are_stored(app: conveyor.App) -> None:
    seen: list[int] = []

    @app.task(queue="math")
    async def add(ctx: Context, a: int, b: int = 0) -> dict[str, int]:
        seen.append(ctx.task.attempt)
        await ctx.progress(0.5, "halfway")
        return {"sum": a + b}

    async with running(app.worker("math", concurrency=3, poll_interval=0.2)):
        handles = [await add.submit(i, b=10) for i in range(5)]
        done = [await app.store.wait(h.id, timeout=10) for h in handles]
    assert [d.status for d in done] == [Status.SUCCEEDED] * 5
    assert [d.result for d in done] == [{"sum": i + 10} for i in range(5)]
    assert all(d.progress == 0.5 and d.progress_message == "halfway" for d in done)
    assert handles[0].payload == {"args": [0], "kwargs": {"b": 10}}
    assert handles[0].name == f"{__name__}.test_tasks_run_and_results_are_stored.<locals>.add"
    assert seen == [1] * 5


async def test_task_function_is_still_callable_and_options_apply(app: conveyor.App) -> None:
    @app.task(name="greet", queue="q", priority=3, max_attempts=7)
    async def greet(ctx: Any, who: str) -> str:
        return f"hi {who}"

    assert await greet(None, "you") == "hi you"
    plain = await greet.submit("a")
    assert (plain.name, plain.queue, plain.priority, plain.max_attempts) == ("greet", "q", 3, 7)
    bound = greet.with_options(key="k1", priority=9, queue="other", correlation_id="c", delay=60)
    t = await bound.submit("b")
    assert (t.key, t.priority, t.queue, t.correlation_id) == ("k1", 9, "other", "c")
    assert t.run_at > plain.run_at
    again = await bound.submit("b")  # the key reuses the first task
    assert again.id == t.id
    child = await greet.with_options(parent=t, metadata={"m": 1}).submit("c")
    assert (child.parent_id, child.root_id, child.metadata) == (t.id, t.id, {"m": 1})


async def test_submit_sync_from_a_thread(app: conveyor.App) -> None:
    @app.task(queue="q")
    def job(ctx: Context, n: int) -> int:
        return n

    task = await asyncio.to_thread(job.submit_sync, 41)
    stored = await app.store.get(task.id)
    assert stored is not None and stored.payload == {"args": [41], "kwargs": {}}
    part = await asyncio.to_thread(job.with_options(partition="p").submit_sync, 1)
    assert part.partition == "p"


async def test_retries_use_the_backoff_then_succeed(app: conveyor.App) -> None:
    lease = timedelta(seconds=30)
    # Per attempt: when it was due, and when it was claimed (its lease's start).
    attempts: list[tuple[int, datetime, datetime]] = []

    @app.task(queue="q", backoff=0.05, max_attempts=3)
    async def flaky(ctx: Context) -> str:
        assert ctx.task.lease_expires_at is not None
        attempts.append((ctx.task.attempt, ctx.task.run_at, ctx.task.lease_expires_at - lease))
        if ctx.task.attempt < 3:
            raise RuntimeError(f"boom {ctx.task.attempt}")
        return "ok"

    async with running(app.worker("q", poll_interval=0.05, lease=lease)):
        task = await flaky.submit()
        done = await app.store.wait(task.id, timeout=10)
    assert done.status is Status.SUCCEEDED and done.result == "ok" and done.attempt == 3
    assert [a for a, _, _ in attempts] == [1, 2, 3]
    # On the store's clock: each retry was due its backoff after the attempt before
    # it was claimed (0.05 s; jitter only shortens it, by up to 20 %), and was not
    # claimed before it was due.
    for (_, _, before), (_, due, began) in itertools.pairwise(attempts):
        assert seconds(due - before) >= 0.04
        assert began >= due
    assert done.error is not None and done.error["message"] == "boom 2"


async def test_attempts_exhausted_is_failed_with_the_traceback(app: conveyor.App) -> None:
    @app.task(queue="q", backoff=0.01, max_attempts=2)
    async def broken(ctx: Context) -> None:
        raise KeyError("missing")

    async with running(app.worker("q", poll_interval=0.05)):
        task = await broken.submit()
        done = await app.store.wait(task.id, timeout=10)
    assert done.status is Status.FAILED and done.attempt == 2
    assert done.error is not None
    assert done.error["type"] == "KeyError" and done.error["retryable"] is True
    assert "in broken" in done.error["traceback"]


async def test_timeout_fails_the_attempt(app: conveyor.App) -> None:
    cancelled = asyncio.Event()

    @app.task(queue="q", timeout=0.2, max_attempts=1)
    async def slow(ctx: Context) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    release, returned = threading.Event(), threading.Event()

    @app.task(queue="q", timeout=0.2, max_attempts=1)
    def slow_sync(ctx: Context) -> None:
        release.wait(30)  # a thread cannot be killed: it finishes after the timeout
        returned.set()

    async with running(app.worker("q", poll_interval=0.05)):
        a = await slow.submit()
        b = await slow_sync.submit()
        # The waits' timeouts only guard against a hang: both attempts are recorded
        # as timed out while their handlers would still be running (the thread is
        # released only afterwards; the coroutine was cancelled).
        done_a = await app.store.wait(a.id, timeout=10)
        done_b = await app.store.wait(b.id, timeout=10)
        assert not returned.is_set()
        release.set()
    assert cancelled.is_set()
    for done in (done_a, done_b):
        assert done.status is Status.FAILED
        assert done.error is not None and done.error["code"] == "timeout"
        assert "timeout of 0.2 s" in done.error["message"]


async def test_timeout_is_retryable(app: conveyor.App) -> None:
    @app.task(queue="q", timeout=0.2, max_attempts=2, backoff=0.01)
    async def first_slow(ctx: Context) -> int:
        if ctx.task.attempt == 1:
            await asyncio.sleep(30)
        return ctx.task.attempt

    async with running(app.worker("q", poll_interval=0.05)):
        done = await app.store.wait((await first_slow.submit()).id, timeout=10)
    assert (done.status, done.result) == (Status.SUCCEEDED, 2)


async def test_sync_handler_runs_in_a_thread(app: conveyor.App) -> None:
    loop_thread = threading.get_ident()
    threads: list[int] = []

    @app.task(queue="q")
    def child(ctx: Context, n: int) -> int:
        return n * 2

    @app.task(queue="q")
    def parent(ctx: Context, n: int) -> str:
        threads.append(threading.get_ident())
        time.sleep(0.05)  # blocking is fine here: the event loop keeps going
        ctx.progress_sync(0.9, "nearly")
        return ctx.submit_child_sync(child, n).id

    async with running(app.worker("q", concurrency=4, poll_interval=0.05)):
        task = await parent.submit(21)
        done = await app.store.wait(task.id, timeout=10)
        kid = await app.store.wait(done.result, timeout=10)
    assert threads and threads[0] != loop_thread
    assert done.status is Status.SUCCEEDED and done.progress == 0.9
    assert (kid.status, kid.result, kid.parent_id, kid.root_id) == (
        Status.SUCCEEDED,
        42,
        task.id,
        task.id,
    )


async def test_submit_child_by_name_and_function(app: conveyor.App) -> None:
    @app.task(name="leaf", queue="q")
    async def leaf(ctx: Context, x: int) -> int:
        return x + 1

    @app.task(queue="q")
    async def root(ctx: Context) -> list[str]:
        a = await ctx.submit_child(leaf, 1)
        b = await ctx.submit_child("leaf", x=2)
        c = await ctx.submit_child(leaf.with_options(priority=5), 3)
        return [a.id, b.id, c.id]

    async with running(app.worker("q", poll_interval=0.05)):
        task = await root.with_options(correlation_id="corr").submit()
        done = await app.store.wait(task.id, timeout=10)
        kids = [await app.store.wait(i, timeout=10) for i in done.result]
    assert [k.result for k in kids] == [2, 3, 4]
    assert all(k.parent_id == task.id and k.correlation_id == "corr" for k in kids)
    assert kids[2].priority == 5


async def test_result_that_is_not_json_fails_for_good(app: conveyor.App) -> None:
    @app.task(queue="q")
    async def weird(ctx: Context) -> object:
        return object()

    async with running(app.worker("q", poll_interval=0.05)):
        done = await app.store.wait((await weird.submit()).id, timeout=10)
    assert done.status is Status.FAILED and done.attempt == 1
    assert done.error is not None and done.error["code"] == "invalid_argument"


async def test_result_over_the_stores_limit_fails_for_good(app: conveyor.App) -> None:
    app.store.max_result_size = 100

    @app.task(queue="q")
    async def chatty(ctx: Context) -> str:
        return "x" * 1000

    async with running(app.worker("q", poll_interval=0.05)):
        done = await app.store.wait((await chatty.submit()).id, timeout=10)
    assert done.status is Status.FAILED and done.attempt == 1 and done.result is None
    assert done.error is not None and done.error["code"] == "invalid_argument"
    assert "over the limit of 100 bytes" in done.error["message"]


async def test_partition_stream_runs_in_order(app: conveyor.App) -> None:
    order: list[int] = []
    running_now = 0
    overlap = False

    @app.task(queue="q", backoff=0.05)
    async def step(ctx: Context, i: int) -> None:
        nonlocal running_now, overlap
        running_now += 1
        overlap = overlap or running_now > 1
        try:
            await asyncio.sleep(0.01)
            if i == 3 and ctx.task.attempt == 1:
                raise RuntimeError("once")  # its retry must not be overtaken by 4, 5, ...
            order.append(i)
        finally:
            running_now -= 1

    handles = [await step.with_options(partition="cust-7").submit(i) for i in range(8)]
    async with running(app.worker("q", concurrency=4, poll_interval=0.05)):
        done = [await app.store.wait(h.id, timeout=10) for h in handles]
    assert all(d.status is Status.SUCCEEDED for d in done)
    assert order == list(range(8))
    assert not overlap
    # Attempts spent (max_attempts - attempt: a release spends none, so tasks handed
    # back after 3 failed still show 2 left): task 3 one more than the others.
    assert [d.max_attempts - d.attempt for d in done] == [2, 2, 2, 1, 2, 2, 2, 2]


async def test_partition_from_a_function_of_the_arguments(app: conveyor.App) -> None:
    @app.task(queue="q", partition=lambda customer, **_: f"cust-{customer}")
    async def bill(ctx: Context, customer: int, amount: int) -> None:
        return None

    t = await bill.submit(7, amount=3)
    assert t.partition == "cust-7"
    assert (await bill.with_options(partition="x").submit(7, amount=1)).partition == "x"


async def test_claims_in_batches_up_to_concurrency(app: conveyor.App) -> None:
    gate = asyncio.Event()
    peak = 0
    now = 0

    @app.task(queue="q")
    async def hold(ctx: Context) -> None:
        nonlocal peak, now
        now += 1
        peak = max(peak, now)
        await gate.wait()
        now -= 1

    handles = [await hold.submit() for _ in range(7)]
    async with running(app.worker("q", concurrency=3, poll_interval=0.05)) as worker:
        for _ in range(200):
            if worker.held == 3:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        assert worker.held == 3 and peak == 3
        gate.set()
        done = [await app.store.wait(h.id, timeout=10) for h in handles]
    assert all(d.status is Status.SUCCEEDED for d in done) and peak == 3


async def test_an_in_process_submit_wakes_an_idle_worker_at_once(app: conveyor.App) -> None:
    @app.task(queue="q")
    async def ping(ctx: Context) -> str:
        return "pong"

    # Without the wake-up the task waits out the worker's nap: the idle wait then
    # ends by running out its poll interval, which is what is checked (the wait's
    # timeout, longer than the nap, only guards against a hang).
    poll = 20.0
    worker = app.worker("q", poll_interval=poll)
    with idle_waits(app.store) as waits:
        async with running(worker):
            await asyncio.wait_for(waits.idle.wait(), 30)  # asleep now, for up to `poll` s
            done = await app.store.wait((await ping.submit()).id, timeout=3 * poll)
    assert done.result == "pong"
    assert waits and False not in waits, f"the worker polled: idle waits ended {waits}"


async def _until_nothing_held(worker: Any, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while worker.held:
        assert time.monotonic() < deadline, f"the worker still holds {worker.held} task(s)"
        await asyncio.sleep(0.02)


async def test_cancel_while_running_stops_the_handler(app: conveyor.App) -> None:
    started = asyncio.Event()
    stopped = asyncio.Event()

    @app.task(queue="q")
    async def endless(ctx: Context) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped.set()
            raise

    # lease 0.6 s: a heartbeat every 0.2 s notices the cancellation.
    async with running(app.worker("q", lease=0.6, poll_interval=0.05)) as worker:
        task = await endless.submit()
        await asyncio.wait_for(started.wait(), 5)
        await app.store.cancel(task.id)
        await asyncio.wait_for(stopped.wait(), 5)
        await _until_nothing_held(worker)
    final = await app.store.get(task.id)
    assert final is not None and final.status is Status.CANCELLED


async def test_a_handler_that_swallows_the_lost_lease_leaves_the_worker_sound(
    app: conveyor.App,
) -> None:
    """The handler catches the cancel that a lost lease (here: a cancel of the
    task) sends it and returns a result: the result is not written, the task
    stays cancelled, and the worker goes on running other tasks."""
    started = asyncio.Event()

    @app.task(queue="q")
    async def stubborn(ctx: Context) -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "kept going"
        return "slept"

    @app.task(queue="q")
    async def after(ctx: Context) -> str:
        return "ran"

    async with running(app.worker("q", lease=0.6, poll_interval=0.05)) as worker:
        task = await stubborn.submit()
        await asyncio.wait_for(started.wait(), 5)
        await app.store.cancel(task.id)
        await _until_nothing_held(worker)
        done = await app.store.wait((await after.submit()).id, timeout=10)
        assert done.result == "ran"
    final = await app.store.get(task.id)
    assert final is not None and final.status is Status.CANCELLED and final.result is None


async def test_heartbeats_keep_a_long_task_leased(app: conveyor.App) -> None:
    @app.task(queue="q")
    async def long(ctx: Context) -> int:
        await asyncio.sleep(3.2)  # over twice the lease
        return ctx.task.attempt

    # A heartbeat every 0.5 s (a third of the lease): a loaded machine may delay
    # one by a second and the lease still holds.
    async with running(app.worker("q", lease=1.5, poll_interval=0.05)):
        task = await long.submit()
        done = await app.store.wait(task.id, timeout=10)
    assert (done.status, done.result, done.attempt) == (Status.SUCCEEDED, 1, 1)


async def test_stop_hands_back_what_outlives_the_grace_period(app: conveyor.App) -> None:
    started = asyncio.Event()

    @app.task(queue="q")
    async def stuck(ctx: Context) -> None:
        started.set()
        await asyncio.sleep(30)

    @app.task(queue="q")
    async def quick(ctx: Context) -> str:
        started.set()
        await asyncio.sleep(0.1)
        return "done"

    worker = app.worker("q", concurrency=2, grace=0.5, poll_interval=0.05)
    job = asyncio.create_task(worker.run())
    a = await stuck.submit()
    b = await quick.submit()
    for _ in range(200):
        if worker.held == 2:
            break
        await asyncio.sleep(0.01)
    began = time.monotonic()
    worker.stop()
    await asyncio.wait_for(job, 10)  # not the 30 s of `stuck`: it was handed back
    # The grace period is real time (the worker's own clock): it was waited out for
    # `stuck` before the hand-back. Only a lower bound: a slow machine cannot fail it.
    assert time.monotonic() - began >= 0.4
    back = await app.store.get(a.id)
    assert back is not None
    # Handed back without spending the budget: attempt numbers only grow, so the
    # budget (max_attempts) grows by one instead.
    assert (back.status, back.attempt, back.worker_id, back.lease_expires_at) == (
        Status.QUEUED,
        1,
        None,
        None,
    )
    assert back.max_attempts == a.max_attempts + 1
    finished = await app.store.get(b.id)
    assert finished is not None and finished.status is Status.SUCCEEDED
    [again] = await app.store.claim("q", worker_id="other")  # claimable at once
    assert again.id == a.id and again.attempt == 2


async def test_second_stop_cuts_the_grace_period_short(app: conveyor.App) -> None:
    started = asyncio.Event()

    @app.task(queue="q")
    async def stuck(ctx: Context) -> None:
        started.set()
        await asyncio.sleep(30)

    worker = app.worker("q", grace=20, poll_interval=0.05)
    job = asyncio.create_task(worker.run())
    task = await stuck.submit()
    await asyncio.wait_for(started.wait(), 5)
    worker.stop()
    await asyncio.sleep(0.1)
    worker.stop()
    await asyncio.wait_for(job, 5)
    back = await app.store.get(task.id)
    assert back is not None and back.status is Status.QUEUED


async def test_group_worker_consumes_as_its_group(app: conveyor.App) -> None:
    @app.task(queue="bus")
    async def event(ctx: Context, n: int) -> str:
        return f"{ctx.task.group}:{n}"

    await app.store.subscribe("bus", "audit")
    task = await event.submit(1)
    async with running(app.worker("bus", group="audit", poll_interval=0.05)):
        done = await app.store.wait(task.id, group="audit", timeout=10)
    assert done.result == "audit:1"
    queue_mode = await app.store.get(task.id)
    assert queue_mode is not None and queue_mode.status is Status.QUEUED


async def test_a_running_worker_is_listed_busy_or_idle_until_it_stops(
    app: conveyor.App,
) -> None:
    release = asyncio.Event()

    @app.task(name="hold", queue="seen")
    async def hold(ctx: Context) -> None:
        await release.wait()

    worker = app.worker(["seen", "also"], concurrency=3, worker_id="shown-worker")
    async with running(worker):
        for _ in range(50):  # announced before its first claim
            live = {w.worker_id: w for w in await app.store.workers()}
            if "shown-worker" in live:
                break
            await asyncio.sleep(0.05)
        idle = live["shown-worker"]
        assert (idle.tasks, idle.queues, idle.concurrency) == ([], ["seen", "also"], 3)
        task = await hold.submit()
        for _ in range(100):
            busy = {w.worker_id: w for w in await app.store.workers()}["shown-worker"]
            if busy.tasks:
                break
            await asyncio.sleep(0.05)
        assert [t.id for t in busy.tasks] == [task.id] and busy.queues == ["seen", "also"]
        release.set()
    assert await app.store.workers() == []  # stopped: gone


async def test_release_costs_no_attempt(store: conveyor.TaskStore) -> None:
    task = await store.submit("x", queue="q")
    [claimed] = await store.claim("q", worker_id="w1")
    with pytest.raises(LostLease):
        await store.release(task.id, worker_id="someone-else")
    with pytest.raises(LostLease):
        await store.release(task.id, worker_id="w1", attempt=2)
    back = await store.release(task.id, worker_id="w1", attempt=claimed.attempt)
    # The attempt number stays (they only grow: a fence never matches two runs);
    # the budget grows by one instead, so the release cost nothing.
    assert (back.status, back.attempt, back.worker_id, back.lease_expires_at) == (
        Status.QUEUED,
        1,
        None,
        None,
    )
    assert back.max_attempts == claimed.max_attempts + 1
    assert back.run_at >= claimed.run_at
    [again] = await store.claim("q", worker_id="w2")
    assert again.attempt == 2
    with pytest.raises(LostLease):
        await store.release(task.id, worker_id="w1")


def test_payload_arguments() -> None:
    assert payload_arguments(None) == ([], {})
    assert payload_arguments({"args": [1], "kwargs": {"a": 2}}) == ([1], {"a": 2})
    assert payload_arguments({"args": [1]}) == ([1], {})
    assert payload_arguments({"to": "a@b.c"}) == ([], {"to": "a@b.c"})
    assert payload_arguments([1, 2]) == ([1, 2], {})
    assert payload_arguments(5) == ([5], {})


def test_load_app(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "myapp_for_load.py").write_text(
        "import conveyor\napp = conveyor.App('sqlite://')\nnot_app = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert isinstance(load_app("myapp_for_load:app"), conveyor.App)
    with pytest.raises(ConfigurationError):
        load_app("myapp_for_load:not_app")
    with pytest.raises(ConfigurationError):
        load_app("myapp_for_load:missing")
    with pytest.raises(ConfigurationError):
        load_app("no-colon")
    with pytest.raises(ModuleNotFoundError):
        load_app("no_such_module_here:app")


def test_duplicate_task_names_are_refused() -> None:
    app = conveyor.App("sqlite://")

    @app.task(name="same")
    async def one(ctx: Context) -> None: ...

    with pytest.raises(ConfigurationError):

        @app.task(name="same")
        async def two(ctx: Context) -> None: ...


async def test_a_worker_maintains_once_when_it_starts(app: conveyor.App) -> None:
    """The first maintenance pass runs at start, not somewhere in the first interval."""

    @app.task(queue="m")
    async def nothing(ctx: Context) -> None:
        return None

    await app.store.open()
    assert await app.store.maintenance_history() == []
    async with running(app.worker("m", poll_interval=0.2, maintain_interval=3600)):
        deadline = time.monotonic() + 10
        while not await app.store.maintenance_history():
            assert time.monotonic() < deadline, "no maintenance pass at start"
            await asyncio.sleep(0.05)


async def test_a_workers_first_pass_recovers_and_leaves_bookkeeping_for_later(
    app: conveyor.App,
) -> None:
    """The pass at start recovers expired leases at once, and leaves retention (and
    the roll-up of finished rows) to the next full pass."""
    ran: list[str] = []

    @app.task(name="job", queue="m2")
    async def job(ctx: Context) -> None:
        ran.append(ctx.task.id)

    store = app.store
    await store.open()
    await store.configure_queue("m2", retention=1)
    old = await store.submit("job", queue="m2")
    [got] = await store.claim("m2", worker_id="before")
    await store.succeed(got.id, worker_id="before")
    stuck = await store.submit("job", queue="m2")
    await store.claim("m2", worker_id="crashed", lease=1)
    store.clock_offset = 5  # the success is past retention, the lease expired
    async with running(app.worker("m2", poll_interval=0.1, maintain_interval=3600)):
        deadline = time.monotonic() + 10
        while stuck.id not in ran:
            assert time.monotonic() < deadline, "the expired lease was not recovered"
            await asyncio.sleep(0.05)
        history = await store.maintenance_history()
        while not (history and history[0]["duration"]):  # the start pass has finished
            assert time.monotonic() < deadline, "the pass at start did not finish"
            await asyncio.sleep(0.05)
            history = await store.maintenance_history()
    [first] = history
    assert first["deleted"] == 0  # (the lease: recovered by this pass or the first claim)
    assert await store.get(old.id) is not None
    assert (await store.maintain())["deleted"] == 1  # the next full pass
    assert await store.get(old.id) is None


async def test_a_worker_started_on_a_filled_young_queue_analyses_it(pg_url: str) -> None:
    """Postgres: tasks queued before any worker ran, on tables never analysed (a
    server with autovacuum off, or not yet come round): the worker's first pass
    gives the planner its statistics at once."""
    import psycopg

    from _support import scratch_pg_database

    with scratch_pg_database("conveyor_young") as url:
        app = conveyor.App(url)

        @app.task(queue="bulk")
        async def slow(ctx: Context) -> None:
            await asyncio.sleep(60)

        dsn = url.replace("postgresql+psycopg://", "postgresql://")

        def analysed() -> int:
            with psycopg.connect(dsn) as conn:
                [(n,)] = conn.execute(
                    "SELECT count(*) FROM pg_stats WHERE tablename = 'conveyor_deliveries'"
                ).fetchall()
            return int(n)

        # Queued by a producer of its own, gone before the worker starts (the
        # server counts a connection's changes when it ends, or within seconds).
        async with conveyor.connect(url) as producer:
            await producer.submit_many([{"name": slow.name, "queue": "bulk"}] * 2000)
        assert analysed() == 0
        async with app:
            worker = app.worker("bulk", concurrency=2, poll_interval=0.2, grace=0.1)
            async with running(worker):
                deadline = time.monotonic() + 10
                while not analysed():
                    assert time.monotonic() < deadline, "the tables were never analysed"
                    await asyncio.sleep(0.05)
