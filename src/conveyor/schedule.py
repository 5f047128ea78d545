"""Periodic tasks: ``@app.periodic(cron=..., tz=...)`` or ``@app.periodic(every=...)``.

Every worker of the app runs a :class:`Scheduler` beside its claim loop; no leader
is elected. Each tick is submitted under the idempotency key
``periodic:<schedule name>:<tick time in UTC>``, so however many schedulers see a
tick, one task exists for it. A registry row per schedule (``conveyor_schedules``)
records which ticks are behind us, so a scheduler that was not running knows what
it missed, and ``conveyor schedules`` can show the last and next run.

Ticks missed while no scheduler ran (older than ``grace`` when first seen):

* ``catch_up=None`` (default): run the latest missed tick once;
* ``catch_up=True``: run every missed tick (at most ``max_catch_up`` per pass; the
  next pass goes on from there);
* ``catch_up=False``: run none of them.

Cron expressions and their time-zone rules come from cronsim, which follows
Debian cron across daylight-saving changes: a job whose time falls in the hour
skipped in spring runs when the clocks jump, and one in the hour repeated in
autumn runs once. ``every=`` intervals are counted from the Unix epoch in UTC,
so all workers agree on the ticks (``every=3600`` ticks on each full hour).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from conveyor import _values as v
from conveyor.errors import ConveyorError, InvalidArgument
from conveyor.models import Task
from conveyor.store.api_internal import Handled, Registration, ScheduleInfo

if TYPE_CHECKING:
    from conveyor.store.base import TaskStore
    from conveyor.task_functions import TaskFunction

log = logging.getLogger("conveyor.schedule")

GRACE = 60.0  # seconds: a tick seen later than this after its time was missed
MAX_CATCH_UP = 1000  # ticks submitted per schedule per pass with catch_up=True
MAX_SLEEP = 30.0  # the scheduler looks at the clock at least this often
MAX_SCHEDULE_NAME = 200  # leaves room in the 255-character key for the tick time
POLICIES = {None: "latest", True: "all", False: "none"}
_US = timedelta(microseconds=1)


@dataclass(frozen=True)
class Schedule:
    """One periodic schedule of a task function; made by :meth:`App.periodic`."""

    name: str
    task: TaskFunction[..., Any]
    cron: str | None = None
    tz: str = "UTC"
    every: float | None = None
    catch_up: bool | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def build(
        task: TaskFunction[..., Any],
        *,
        cron: str | None,
        tz: str | None,
        every: v.Duration | None,
        catch_up: bool | None,
        name: str | None,
        args: Sequence[Any],
        kwargs: Mapping[str, Any] | None,
    ) -> Schedule:
        """Check the arguments of ``@app.periodic`` and make the schedule."""
        if (cron is None) == (every is None):
            raise InvalidArgument("cron", "give a cron expression or every=, exactly one")
        if catch_up not in (None, True, False):
            raise InvalidArgument("catch_up", f"must be None, True or False, got {catch_up!r}")
        sched_name = v.name("name", name or task.name)
        if len(sched_name) > MAX_SCHEDULE_NAME:
            raise InvalidArgument(
                "name", f"a schedule name must be at most {MAX_SCHEDULE_NAME} characters"
            )
        zone = "UTC" if tz is None else tz
        if not isinstance(zone, str):
            raise InvalidArgument("tz", f"must be an IANA time-zone name, got {tz!r}")
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidArgument(
                "tz", f"unknown time zone {zone!r}: use an IANA name such as 'Europe/Paris'"
            ) from None
        seconds = None
        if every is not None:
            if tz is not None:
                raise InvalidArgument("tz", "applies to cron= only; every= counts real time")
            seconds = v.duration_seconds("every", every, allow_zero=False)
            if seconds < 1:
                raise InvalidArgument("every", f"must be at least 1 second, got {seconds:g}")
        if cron is not None:
            if not isinstance(cron, str):
                raise InvalidArgument("cron", f"must be a cron expression, got {cron!r}")
            try:
                CronSim(cron, datetime(2000, 1, 1, tzinfo=ZoneInfo(zone)))
            except CronSimError as exc:
                raise InvalidArgument("cron", f"{cron!r} is not a cron expression: {exc}") from None
        # Refuse now what could never be a payload, rather than at every tick.
        v.to_json("args", list(args))
        v.to_json("kwargs", dict(kwargs or {}))
        return Schedule(
            name=sched_name,
            task=task,
            cron=cron,
            tz=zone,
            every=seconds,
            catch_up=catch_up,
            args=tuple(args),
            kwargs=dict(kwargs or {}),
        )

    @property
    def spec(self) -> str:
        """How the schedule reads in listings: ``cron 0 3 * * * Europe/Paris`` or ``every 300s``."""
        if self.cron is not None:
            return f"cron {self.cron} {self.tz}"
        assert self.every is not None
        return f"every {self.every:g}s"

    # ------------------------------------------------------------- ticks
    def ticks(self, after: datetime, until: datetime, limit: int) -> list[datetime]:
        """Ticks in ``(after, until]``, oldest first, at most ``limit``; aware UTC."""
        out: list[datetime] = []
        if self.every is not None:
            step = round(self.every * v.US)
            n = v.to_us(after) // step + 1
            last = v.to_us(until)
            while n * step <= last and len(out) < limit:
                out.append(v.from_us(n * step))
                n += 1
            return out
        it = CronSim(self.cron or "", after.astimezone(ZoneInfo(self.tz)))
        while len(out) < limit:
            tick = next(it, None)
            if tick is None:
                break
            tick = tick.astimezone(UTC)
            if tick > until:
                break
            out.append(tick)
        return out

    def latest(self, until: datetime) -> datetime | None:
        """The latest tick at or before ``until``."""
        if self.every is not None:
            step = round(self.every * v.US)
            return v.from_us(v.to_us(until) // step * step)
        it = CronSim(self.cron or "", (until + _US).astimezone(ZoneInfo(self.tz)), reverse=True)
        tick = next(it, None)
        return None if tick is None else tick.astimezone(UTC)

    def next_after(self, moment: datetime) -> datetime | None:
        """The first tick after ``moment``."""
        found = self.ticks(moment, datetime.max.replace(tzinfo=UTC) - timedelta(days=1), 1)
        return found[0] if found else None

    def due(
        self, after: datetime, now: datetime, *, grace: float, max_catch_up: int
    ) -> tuple[list[datetime], datetime | None]:
        """``(ticks to submit, new handled-until)`` for the ticks in ``(after, now]``."""
        if self.catch_up is True:
            ticks = self.ticks(after, now, max_catch_up)
            return ticks, (ticks[-1] if ticks else None)
        cut = max(after, now - timedelta(seconds=grace))
        on_time = self.ticks(cut, now, max_catch_up)
        missed = self.latest(cut) if cut > after else None
        if missed is not None and missed <= after:
            missed = None
        handled = on_time[-1] if on_time else missed
        if on_time or self.catch_up is False or missed is None:
            return on_time, handled
        return [missed], handled

    def key(self, tick: datetime) -> str:
        """The idempotency key of one tick: one task per tick, whoever submits it."""
        stamp = tick.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return f"periodic:{self.name}:{stamp}"

    def request(self, tick: datetime) -> dict[str, Any]:
        """The submit request of one tick (the task's own queue, priority, partition)."""
        from conveyor.task_functions import TaskCall

        request = TaskCall(self.task, {}).request(self.args, self.kwargs)
        request["key"] = self.key(tick)
        request["conflict"] = "reuse"
        request["metadata"] = {"periodic": self.name, "tick": tick.isoformat()}
        return request


# ------------------------------------------------------------------ registry
def _registration(s: Schedule, now: datetime) -> Registration:
    return Registration(
        name=s.name,
        task=s.task.name,
        queue=s.task.queue,
        spec=s.spec,
        catch_up=POLICIES[s.catch_up],
        next_tick=s.next_after(now),
    )


async def list_schedules(store: TaskStore) -> list[ScheduleInfo]:
    """Every schedule registered in the store, by name."""
    return await store.internal.schedules()


class ScheduleHost(Protocol):
    """What a scheduler needs from an app: its schedules and its store."""

    schedules: dict[str, Schedule]

    @property
    def store(self) -> TaskStore:
        """The store ticks are submitted to by default."""
        ...


def scheduler_for(host: object, store: TaskStore) -> Scheduler | None:
    """A scheduler for ``host``'s schedules on ``store``, or None if it has none
    (what a worker calls: it knows task hosts, not apps)."""
    found = getattr(host, "schedules", None)
    if not found:
        return None
    return Scheduler(cast(ScheduleHost, host), store)


class Scheduler:
    """Submits the ticks of an app's schedules; any number may run at once.

    :meth:`run` is what a worker runs; :meth:`tick` is one pass, and takes the
    time as an argument so tests can move through hours in milliseconds.
    """

    def __init__(
        self,
        app: ScheduleHost,
        store: TaskStore | None = None,
        *,
        grace: v.Duration = GRACE,
        max_catch_up: int = MAX_CATCH_UP,
    ) -> None:
        self.app = app
        self.store = store if store is not None else app.store
        self.grace = v.duration_seconds("grace", grace)
        self.max_catch_up = v.positive_int("max_catch_up", max_catch_up)
        self._registered = False
        #: The clock reading of the last pass (the store's clock unless given).
        self.last_now: datetime | None = None

    @property
    def schedules(self) -> list[Schedule]:
        """The app's schedules."""
        return list(self.app.schedules.values())

    async def tick(self, now: datetime | None = None) -> list[Task]:
        """One pass: submit every tick that is due at ``now`` (default: the store's
        clock) under the schedules' policies; returns the tasks of those ticks."""
        items = self.schedules
        if not items:
            return []
        store = self.store
        given = None if now is None else v.aware("now", now).astimezone(UTC)

        def register(moment: datetime) -> list[Registration]:
            return [_registration(s, moment) for s in items]

        moment, rows = await store.internal.read_schedules(
            [s.name for s in items],
            now=given,
            register=None if self._registered else register,
        )
        self._registered = True
        self.last_now = moment
        plans: list[tuple[Schedule, list[datetime], datetime]] = []
        requests: list[dict[str, Any]] = []
        for s in items:
            row = rows.get(s.name)
            if row is None:  # deleted behind our back: register again next pass
                self._registered = False
                continue
            start = row.handled_until if row.handled_until is not None else row.created_at
            ticks, handled = s.due(start, moment, grace=self.grace, max_catch_up=self.max_catch_up)
            if handled is None:
                continue
            plans.append((s, ticks, handled))
            requests.extend(s.request(t) for t in ticks)
        if not plans:
            return []
        tasks = await store.submit_many(requests) if requests else []
        by_key = {t.key: t for t in tasks}

        marks = [
            Handled(
                name=s.name,
                handled_until=handled,
                next_tick=s.next_after(max(handled, moment)),
                last_tick=ticks[-1] if ticks else None,
                last_task_id=by_key[s.key(ticks[-1])].id if ticks else None,
            )
            for s, ticks, handled in plans
        ]
        await store.internal.record_schedules(marks)
        for s, ticks, _ in plans:
            for t in ticks:
                log.info("periodic %s: submitted the tick of %s", s.name, t.isoformat())
        return tasks

    def seconds_to_next(self, now: datetime) -> float:
        """How long to sleep before the next tick of any schedule (at most MAX_SLEEP)."""
        soonest = MAX_SLEEP
        for s in self.schedules:
            nxt = s.next_after(now)
            if nxt is not None:
                soonest = min(soonest, (nxt - now).total_seconds())
        return max(0.0, soonest)

    async def run(self) -> None:
        """Submit ticks as they come due, until cancelled (the worker cancels it)."""
        if not self.schedules:
            return
        failures = 0
        while True:
            try:
                await self.tick()
                failures = 0
                # Counted on the store's clock, which decides what is due.
                pause = self.seconds_to_next(self.last_now or datetime.now(UTC)) + 0.01
            except (ConveyorError, OSError) as exc:
                failures += 1
                pause = min(2.0 ** min(failures, 5), MAX_SLEEP)
                log.warning("scheduler pass failed (%s); trying again in %.0f s", exc, pause)
            await asyncio.sleep(pause)


__all__ = [
    "GRACE",
    "Schedule",
    "ScheduleHost",
    "ScheduleInfo",
    "Scheduler",
    "list_schedules",
    "scheduler_for",
]
