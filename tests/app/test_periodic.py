"""Periodic tasks: each tick once whatever the number of schedulers, the missed-tick
policies, daylight-saving changes, and the worker running its app's schedules.

Time is injected (``Scheduler.tick(now)``): an hour passes in a few passes.
"""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import conveyor
from conveyor.schedule import Scheduler, list_schedules
from conveyor.store.base import TaskStore

T0 = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)


async def all_tasks(store: TaskStore) -> list[conveyor.Task]:
    tasks: list[conveyor.Task] = []
    cursor = None
    while True:
        page = await store.list(limit=500, cursor=cursor)
        tasks.extend(page.items)
        cursor = page.next_cursor
        if cursor is None:
            return tasks


def ticks_of(tasks: list[conveyor.Task], schedule: str) -> list[datetime]:
    return sorted(
        datetime.fromisoformat(t.metadata["tick"]).astimezone(UTC)
        for t in tasks
        if t.metadata.get("periodic") == schedule
    )


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


async def test_two_schedulers_submit_each_tick_once(store: TaskStore, store_url: str) -> None:
    app = conveyor.App(store_url)

    @app.periodic(every=5)
    async def beat(ctx: Any) -> None: ...

    @app.periodic(cron="*/10 * * * * *", tz="Europe/Paris", name="pulse")
    async def pulse(ctx: Any, level: int) -> None: ...

    rng = random.Random(12)
    async with conveyor.connect(store_url) as other:
        first, second = Scheduler(app, store), Scheduler(app, other)
        await asyncio.gather(first.tick(T0), second.tick(T0))  # both register
        now, latest = T0, T0
        while now < T0 + timedelta(minutes=1):
            now += timedelta(seconds=rng.uniform(0.2, 1.5))
            other_now = now + timedelta(seconds=rng.uniform(0.0, 0.3))
            latest = max(latest, other_now)
            await asyncio.gather(first.tick(now), second.tick(other_now))
    tasks = await all_tasks(store)
    beats = ticks_of(tasks, beat.name)
    assert beats == [T0 + timedelta(seconds=5 * k) for k in range(1, 13)]
    assert ticks_of(tasks, "pulse") == [T0 + timedelta(seconds=10 * k) for k in range(1, 7)]
    assert len(tasks) == 12 + 6  # one task per tick, nothing else
    assert all(t.name in (beat.name, pulse.name) for t in tasks)
    assert {t.key for t in tasks} == {
        f"periodic:{t.metadata['periodic']}:"
        f"{datetime.fromisoformat(t.metadata['tick']).astimezone(UTC):%Y-%m-%dT%H:%M:%S.%fZ}"
        for t in tasks
    }
    infos = {i.name: i for i in await list_schedules(store)}
    assert infos[beat.name].last_tick == T0 + timedelta(seconds=60)
    assert infos[beat.name].next_tick == T0 + timedelta(seconds=65)
    assert infos["pulse"].spec == "cron */10 * * * * * Europe/Paris"


@pytest.mark.parametrize(
    ("catch_up", "expected_minutes"),
    [(None, [70]), (True, [20, 30, 40, 50, 60, 70]), (False, [])],
)
async def test_missed_ticks_follow_the_policy(
    store: TaskStore, store_url: str, catch_up: bool | None, expected_minutes: list[int]
) -> None:
    app = conveyor.App(store_url)

    @app.periodic(every=timedelta(minutes=10), catch_up=catch_up, name="report")
    def report(ctx: Any) -> None: ...

    scheduler = Scheduler(app, store)
    minute = timedelta(minutes=1)
    assert await scheduler.tick(T0) == []  # registered now: earlier ticks are not ours
    on_time = await scheduler.tick(T0 + 10 * minute + timedelta(seconds=2))
    assert ticks_of(on_time, "report") == [T0 + 10 * minute]
    # No scheduler ran for an hour: the ticks of minutes 20..70 were missed.
    after_gap = await scheduler.tick(T0 + 75 * minute)
    assert ticks_of(after_gap, "report") == [T0 + m * minute for m in expected_minutes]
    assert await scheduler.tick(T0 + 76 * minute) == []  # nothing is offered twice
    back = await scheduler.tick(T0 + 80 * minute + timedelta(seconds=1))
    assert ticks_of(back, "report") == [T0 + 80 * minute]
    tasks = await all_tasks(store)
    assert ticks_of(tasks, "report") == [T0 + m * minute for m in [10, *expected_minutes, 80]]
    (info,) = await list_schedules(store)
    assert info.last_tick == T0 + 80 * minute
    assert info.next_tick == T0 + 90 * minute
    assert info.catch_up == {None: "latest", True: "all", False: "none"}[catch_up]


async def test_catch_up_is_bounded_per_pass(store: TaskStore, store_url: str) -> None:
    app = conveyor.App(store_url)

    @app.periodic(every=60, catch_up=True, name="minutely")
    def minutely(ctx: Any) -> None: ...

    scheduler = Scheduler(app, store, max_catch_up=25)
    await scheduler.tick(T0)
    later = T0 + timedelta(hours=1, seconds=30)
    sizes = [len(await scheduler.tick(later)) for _ in range(4)]
    assert sizes == [25, 25, 10, 0]
    assert len(ticks_of(await all_tasks(store), "minutely")) == 60


async def run_through(
    scheduler: Scheduler, start: datetime, end: datetime, step: timedelta
) -> None:
    now = start
    await scheduler.tick(now)
    while now < end:
        now = min(now + step, end)
        await scheduler.tick(now)


async def test_daily_cron_across_daylight_saving_changes(store: TaskStore, store_url: str) -> None:
    """02:30 Paris time: on the spring day that hour does not exist and the run
    happens when the clocks jump (03:00 CEST); on the autumn day it exists twice
    and the run happens once."""
    app = conveyor.App(store_url)

    @app.periodic(cron="30 2 * * *", tz="Europe/Paris", catch_up=True, name="nightly")
    def nightly(ctx: Any) -> None: ...

    scheduler = Scheduler(app, store)
    step = timedelta(hours=1)
    await run_through(scheduler, utc(2026, 3, 27, 12), utc(2026, 3, 31, 12), step)
    await run_through(scheduler, utc(2026, 10, 24, 12), utc(2026, 10, 27, 12), step)
    assert ticks_of(await all_tasks(store), "nightly") == [
        utc(2026, 3, 28, 1, 30),  # 02:30 CET
        utc(2026, 3, 29, 1, 0),  # 03:00 CEST: 02:30 was skipped by the clocks
        utc(2026, 3, 30, 0, 30),  # 02:30 CEST
        utc(2026, 3, 31, 0, 30),
        # October: the missed days between the two runs were caught up (catch_up=True)
        *[utc(2026, m, d, 0, 30) for m, d in _days((4, 1), (10, 25))],
        utc(2026, 10, 26, 1, 30),  # 02:30 CET: the repeated hour ran once, above
        utc(2026, 10, 27, 1, 30),
    ]


def _days(first: tuple[int, int], last: tuple[int, int]) -> list[tuple[int, int]]:
    """(month, day) pairs from ``first`` to ``last`` inclusive, in 2026."""
    day = datetime(2026, *first)
    out = []
    while (day.month, day.day) <= last:
        out.append((day.month, day.day))
        day += timedelta(days=1)
    return out


async def test_hourly_cron_counts_real_hours_across_daylight_saving(
    store: TaskStore, store_url: str
) -> None:
    app = conveyor.App(store_url)

    @app.periodic(cron="0 * * * *", tz="Europe/Paris", name="hourly")
    def hourly(ctx: Any) -> None: ...

    # A grace of an hour with half-hour steps: every tick is seen on time.
    scheduler = Scheduler(app, store, grace=3600)
    start, end = utc(2026, 10, 24, 21, 30), utc(2026, 10, 25, 23, 30)
    await run_through(scheduler, start, end, timedelta(minutes=30))
    ticks = ticks_of(await all_tasks(store), "hourly")
    # The local day of 25 October has 25 hours, each one ticks once.
    local_day = [t for t in ticks if utc(2026, 10, 24, 22) <= t < utc(2026, 10, 25, 23)]
    assert len(local_day) == 25
    assert local_day == [utc(2026, 10, 24, 22) + timedelta(hours=h) for h in range(25)]


async def test_a_worker_runs_its_apps_schedules(store: TaskStore, store_url: str) -> None:
    app = conveyor.App(store_url)
    ran: list[str] = []

    @app.periodic(every=1, name="heartbeat", kwargs={"who": "w"})
    async def heartbeat(ctx: Any, who: str) -> str:
        ran.append(ctx.task.metadata["tick"])
        return who

    worker = app.worker(store=store, poll_interval=0.2, maintain_interval=None)
    runner = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(30):
            while len(ran) < 2:
                await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await runner
    done = [t for t in await all_tasks(store) if t.status is conveyor.Status.SUCCEEDED]
    assert done and all(t.result == "w" and t.name == heartbeat.name for t in done)


def test_bad_schedules_are_refused_naming_the_field() -> None:
    app = conveyor.App("sqlite:///unused.db")

    def job(ctx: Any) -> None: ...

    cases: list[tuple[dict[str, Any], str]] = [
        ({}, "cron"),
        ({"cron": "* * * * *", "every": 5}, "cron"),
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * * * *", "tz": "Mars/Olympus"}, "tz"),
        ({"every": 60, "tz": "Europe/Paris"}, "tz"),
        ({"every": 0.5}, "every"),
        ({"every": -1}, "every"),
        ({"every": 60, "catch_up": "yes"}, "catch_up"),
        ({"every": 60, "args": [object()]}, "args"),
        ({"every": 60, "name": "x" * 201}, "name"),
    ]
    for options, field in cases:
        with pytest.raises(conveyor.InvalidArgument) as info:
            app.periodic(name=options.pop("name", f"job-{field}"), **options)(job)
        assert info.value.field == field, options
    assert app.schedules == {}
    app.periodic(every=60, name="once")(job)
    with pytest.raises(conveyor.ConfigurationError, match="two schedules"):
        app.periodic(every=30, name="once")(job)


def test_periodic_on_top_of_a_task_keeps_its_options() -> None:
    app = conveyor.App("sqlite:///unused.db")

    @app.periodic(cron="0 3 * * *", tz="Europe/Paris")
    @app.task(queue="reports", max_attempts=7, name="nightly")
    def nightly(ctx: Any) -> None: ...

    schedule = app.schedules["nightly"]
    request = schedule.request(utc(2026, 1, 1, 2))
    assert request["queue"] == "reports" and request["max_attempts"] == 7
    assert request["key"] == "periodic:nightly:2026-01-01T02:00:00.000000Z"
    assert schedule.next_after(utc(2026, 1, 1, 2)) == utc(2026, 1, 2, 2)


def test_conveyor_schedules_lists_last_and_next_run(store_url: str, tmp_path: Any) -> None:
    import json

    from conveyor.cli import run

    app = conveyor.App(store_url)

    @app.periodic(every=timedelta(minutes=5), name="sweep")
    def sweep(ctx: Any) -> None: ...

    async def two_passes() -> None:
        async with conveyor.connect(store_url) as st:
            scheduler = Scheduler(app, st)
            await scheduler.tick(T0)
            await scheduler.tick(T0 + timedelta(minutes=5, seconds=1))

    asyncio.run(two_passes())
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert run(["schedules", "--url", store_url, "--json"]) == 0
    (row,) = json.loads(out.getvalue())
    assert row["name"] == "sweep" and row["spec"] == "every 300s"
    assert row["last_tick"] == "2026-06-01T12:05:00+00:00"
    assert row["next_tick"] == "2026-06-01T12:10:00+00:00"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert run(["schedules", "--url", store_url]) == 0
    assert "sweep" in out.getvalue() and "2026-06-01 12:10:00.000Z" in out.getvalue()
