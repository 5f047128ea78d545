"""The worker: claims tasks of an :class:`~conveyor.app.App`, runs their handlers,
records the outcome.

What it does, in order of a task's life:

* **claim** in batches sized by :class:`~conveyor.worker.feed.Feed`: the free slots
  plus a small prefetch buffer while tasks are quick, a cap per partition so one
  round takes several streams; an empty claim sends it to sleep in
  :meth:`TaskStore.wait_for_work` until a notification (in-process commit,
  Postgres NOTIFY) or ``poll_interval``;
* **run**: coroutine handlers on the event loop, plain functions each in a
  thread of their own. Tasks of one partition claimed together run one after
  another, in order; if one of them does not finish for good (a retry is
  scheduled, the lease is lost), the rest are handed back untouched, because
  running them would overtake it. A slot is given up when a handler returns,
  while its success is written: other work runs meanwhile, and a stream's next
  task takes a slot again once that write is done;
* **heartbeat** every third of the lease while a task is held (running or
  waiting its turn in a partition batch);
* **time out** at the task's ``timeout``: a coroutine is cancelled; a thread
  cannot be killed in Python, so the attempt is recorded as timed out and the
  thread is left to finish in the background, its result ignored;
* **record**: ``succeed(result)``, or ``fail(error, retryable=True)`` (the store
  applies the task's backoff and attempt budget and keeps the traceback). A
  task whose name the app has no handler for is handed back for a worker that
  knows it (no attempt spent, with a growing delay; see
  :mod:`conveyor.worker.unknown`), or with ``unknown="fail"`` failed for good
  (``code="unknown_task"``). Every write carries ``attempt=`` so a stale attempt
  can never complete a newer one; ``LostLease``/``TaskCancelled`` drop the task
  quietly;
* **settle the collector**: at its first start in a process, a worker collects
  garbage once and freezes what is alive (``gc.freeze()``): the modules, the app,
  the store. Python's full collections then skip them; otherwise each one walks
  them all, a 30-60 ms pause in the middle of the work (``gc_freeze=False``
  leaves the collector alone);
* **maintain**: ``store.maintain()`` once at start, then every
  ``maintain_interval`` (the store makes sure one caller at a time does the
  work);
* **stop**: on :meth:`Worker.stop` (SIGINT/SIGTERM under
  :meth:`App.run_worker`) it stops claiming, lets running tasks finish within
  ``grace`` seconds, then hands the rest back with :meth:`TaskStore.release`
  (claimable at once, the attempt not counted) and returns.

Logs go to the ``conveyor.worker`` logger; every line about a task starts with
its id, name and attempt and carries them as ``extra`` fields (see
:mod:`conveyor.worker.logs`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Coroutine, Sequence
from datetime import datetime
from typing import Any, Literal

from conveyor import _values as v
from conveyor.collector import settle_collector
from conveyor.connect import display_url
from conveyor.errors import ConfigurationError, ConveyorError, InvalidArgument, NotFound
from conveyor.models import Task
from conveyor.outcomes import TaskTimeout, UnknownTask
from conveyor.schedule import scheduler_for
from conveyor.store.base import TaskStore
from conveyor.task_functions import TaskHost
from conveyor.worker.attempt import Attempts
from conveyor.worker.context import Context
from conveyor.worker.feed import Feed
from conveyor.worker.group_commit import Acks
from conveyor.worker.heartbeats import Heartbeats
from conveyor.worker.instrument import Instruments
from conveyor.worker.liveness import Announcer
from conveyor.worker.maintenance import maintain_every
from conveyor.worker.recording import Held, Recorder, Run
from conveyor.worker.slots import Slots
from conveyor.worker.startup import join_group, open_when_ready, subscribe_start
from conveyor.worker.stopping import Stopping
from conveyor.worker.unknown import Policy, UnknownNames, policy

log = logging.getLogger("conveyor.worker")

HANDOFF_TURNS = 3  # loop turns from a runner's creation to its handler's first line
# An empty claim of flow-controlled queues (at their limits) waits 25 ms, then twice
# as long each time up to the poll interval.
LIMITED_RETRY_FIRST = 0.025
# A claim that fails waits 0.5 s, then twice as long each time up to 5 s, or less
# when the wake channel reconnects (the database is back).
CLAIM_RETRY_FIRST = 0.5
CLAIM_RETRY_MAX = 5.0


class Worker:
    """Runs an app's tasks from ``queues`` until :meth:`stop`; see the module docs.

    ``lease`` (seconds) is the lease asked for each claim; ``None`` uses the
    queue's configured lease, else 30 s. ``group`` consumes as that consumer
    group (bus mode): it must be subscribed to every queue, or :meth:`run` raises
    :class:`NotFound` before claiming anything, unless ``subscribe`` (``"all"``,
    ``"new"`` or a datetime, as :meth:`TaskStore.subscribe`'s ``start``) asks the
    worker to subscribe a group never registered from there.
    ``unknown`` says what happens to a claimed task whose name the app has no
    handler for: ``"release"`` (hand it back, no attempt spent, claimable again
    after a growing delay) or ``"fail"`` (fail it for good).
    ``maintain_interval=None`` leaves maintenance to others.
    ``gc_freeze=False`` leaves the garbage collector alone (see
    :func:`conveyor.collector.settle_collector`).
    """

    def __init__(
        self,
        app: TaskHost,
        queues: str | Sequence[str] = "default",
        *,
        store: TaskStore | None = None,
        concurrency: int = 10,
        group: str | None = None,
        subscribe: Literal["all", "new"] | datetime | None = None,
        lease: v.Duration | None = None,
        poll_interval: v.Duration = 1.0,
        grace: v.Duration = 30.0,
        maintain_interval: v.Duration | None = 30.0,
        worker_id: str | None = None,
        gc_freeze: bool = True,
        unknown: Policy = "release",
    ) -> None:
        self.app = app
        self.store = store if store is not None else app.store
        self.queues = v.names("queues", queues)
        self.concurrency = v.positive_int("concurrency", concurrency)
        self.group = v.opt_name("group", group)
        self.subscribe = subscribe_start(subscribe, self.group)
        self.lease = None if lease is None else v.duration_seconds("lease", lease, allow_zero=False)
        self.poll_interval = v.duration_seconds("poll_interval", poll_interval, allow_zero=False)
        self.grace = v.duration_seconds("grace", grace)
        self.maintain_interval = (
            None
            if maintain_interval is None
            else v.duration_seconds("maintain_interval", maintain_interval, allow_zero=False)
        )
        self.worker_id = v.name(
            "worker_id",
            worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}",
        )
        if not isinstance(gc_freeze, bool):
            raise InvalidArgument("gc_freeze", "must be True or False")
        self.gc_freeze = gc_freeze
        unknown_names = UnknownNames(policy(unknown))
        self._held: dict[str, Held] = {}
        self._feed: Feed[Held] = Feed(self.concurrency)
        self._acks = Acks(self.store, self.worker_id, self.group)
        self._runners: set[asyncio.Task[None]] = set()
        self._heartbeats = Heartbeats(
            self.store,
            worker_id=self.worker_id,
            group=self.group,
            queues=self.queues,
            lease=self.lease,
            held=self._held,
        )
        self._record = Recorder(
            self.store, self.worker_id, self.group, self._acks, self._heartbeats, self._let_go
        )
        self._attempts = Attempts(
            self.app,
            self.store,
            self.worker_id,
            self.group,
            unknown_names,
            self._record,
            self._returned,
        )
        #: Keeps this worker among the store's live workers while it runs.
        self._announcer = Announcer(
            self.store,
            worker_id=self.worker_id,
            queues=self.queues,
            group=self.group,
            concurrency=self.concurrency,
        )
        self._stop = Stopping(self._held)
        self._slots = Slots(self._feed, self._stop, self._fill)
        # Set when what a claim finds may have changed here: a stream whose last held
        # task was let go (its next task is claimable), or a drain's last task.
        self._stream_freed = asyncio.Event()
        self._running = False
        self._fatal: NotFound | ConfigurationError | None = None  # raised by run() once wound down
        #: Drain mode (``conveyor.testing.run_tasks``): return once a claim finds
        #: nothing and nothing is held, instead of waiting for more work.
        self.stop_when_idle = False
        #: Whether this worker also submits the ticks of the app's periodic schedules.
        self.run_schedules = True
        #: Whether :meth:`run` closes the store when it ends, before it logs that it
        #: stopped (``App.run_worker``: the store belongs to the loop that ends).
        self.close_store = False
        #: Seconds :meth:`run` keeps trying to reach a database that does not answer
        #: before it gives up (``App.run_worker`` and the CLI wait a minute).
        self.wait_for_db = 0.0
        #: Where the store's URL came from (``"$CONVEYOR_URL"``, ...), for the start
        #: line; None says nothing.
        self.database_origin: str | None = None
        self.instruments = Instruments(self)
        self._acks.observe = self.instruments.acked

    # ----------------------------------------------------------- control
    @property
    def held(self) -> int:
        """How many tasks the worker holds leases on right now."""
        return len(self._held)

    def stop(self) -> None:
        """Ask the worker to stop (safe from any thread and from signal handlers).

        The first call stops claiming and starts the grace period; a second one
        ends the grace period at once.
        """
        self._stop.request()

    async def run(self) -> None:
        """Claim and run tasks until :meth:`stop`, then wind down and return."""
        if self._running:
            raise RuntimeError("this worker is already running")
        self._running = True
        self._stop.begin()  # stop() called before run() takes effect now
        self._slots.freed, self._stream_freed = asyncio.Event(), asyncio.Event()
        farewell: str | None = None  # said once everything is closed
        try:
            if not await open_when_ready(self.store, self.wait_for_db, self._stop.asked):
                return
            if self.group is not None and not await join_group(
                self.store, self.queues, self.group, self.subscribe, self._stop.asked
            ):
                return
            if self._stop.asked.is_set():  # asked to stop before it began: claim nothing
                farewell = "worker %s stopped before its first claim"
                return
            await self._heartbeats.refresh()
            await self._announcer.announce()
            if self.gc_freeze:
                settle_collector()
            background = [
                asyncio.create_task(self._heartbeats.run(), name="conveyor-heartbeat"),
                asyncio.create_task(self._announcer.run(), name="conveyor-announce"),
            ]
            if self.maintain_interval is not None:
                maintain = maintain_every(self.maintain_interval, self.store, self._heartbeats)
                background.append(asyncio.create_task(maintain, name="conveyor-maintain"))
            scheduler = scheduler_for(self.app, self.store)  # periodic tasks, if the app has any
            if scheduler is not None and self.run_schedules:
                background.append(asyncio.create_task(scheduler.run(), name="conveyor-scheduler"))
            origin = f" (from {self.database_origin})" if self.database_origin else ""
            log.info(
                "worker %s started: queues %s, concurrency %d%s, database %s%s",
                self.worker_id,
                ",".join(self.queues),
                self.concurrency,
                f", group {self.group}" if self.group else "",
                display_url(self.store.url),
                origin,
            )
            try:
                await self._claim_loop()
                await self._stop.wind_down(self._runners, self.grace, self._record.release)
            finally:
                jobs = [*background, *self._heartbeats.beats]
                for job in jobs:
                    job.cancel()
                await asyncio.gather(*jobs, return_exceptions=True)
                await self._announcer.retire()
            farewell = "worker %s stopped"
            if self._fatal is not None:
                raise self._fatal
        finally:
            if self.close_store:
                await self.store.close()
            self._running = False
            # Last, so that "stopped" means it: nothing of the worker's runs after it.
            if farewell is not None:
                log.info(farewell, self.worker_id)

    # ------------------------------------------------------------ claiming
    async def _claim_loop(self) -> None:
        slot_freed = self._slots.freed
        failures = 0
        saturated = 0  # empty claims in a row of flow-controlled queues
        while not self._stop.asked.is_set():
            room = self._feed.room()
            if room <= 0:
                slot_freed.clear()
                await self._stop.until(slot_freed.wait())
                continue
            idle_before = not self._held  # drain mode: a claim made while idle decides
            # Cleared before claiming, not after: a stream let go while the claim is
            # in flight (its next task just became claimable) must still wake the
            # wait below.
            slot_freed.clear()
            self._stream_freed.clear()
            try:
                found, took_all = await self._claim_round(room)
            except (NotFound, ConfigurationError) as exc:
                # The group was unsubscribed through this worker's store, or a queue
                # is encrypted and this store has no keys: every claim would fail
                # the same way. Stop, hand back what is held, then raise.
                log.error("%s; stopping", exc)
                self._fatal = exc
                self._stop.request()
                break
            except (ConveyorError, OSError) as exc:
                failures += 1
                pause = min(CLAIM_RETRY_FIRST * 2 ** min(failures - 1, 6), CLAIM_RETRY_MAX)
                log.warning("claim failed (%s); trying again in %.1f s", exc, pause)
                await self._stop.until(self.store.wait_for_work(self.queues, pause))
                continue
            failures = 0
            if found:
                # Let the handlers just started reach their first line before this
                # loop claims again: the next claim's client work would otherwise run
                # ahead of them (about 0.5 ms of enqueue-to-start latency).
                for _ in range(HANDOFF_TURNS):
                    await asyncio.sleep(0)
                if not took_all:
                    continue
            elif self.stop_when_idle and idle_before and not self._held:
                break  # drained: nothing claimable, nothing running or being acked
            if found:
                saturated = 0
            elif self.store.internal.flow_controlled(self.queues):
                # A flow-controlled queue at its limit (conveyor.store.protocol.limits):
                # its new work wakes this loop for claims that find nothing, so wait a
                # back-off instead (doubling to poll_interval), or until a task of
                # this worker ends (its slot may be the queue's too). A slot freed by
                # another worker is found at the next try.
                saturated += 1
                pause = min(LIMITED_RETRY_FIRST * 2 ** min(saturated - 1, 6), self.poll_interval)
                await self._stop.until(asyncio.sleep(pause), slot_freed.wait())
                continue
            # The last claim took fewer tasks than it asked for (or none): another
            # now would find nothing until new work comes or one of this worker's
            # streams is let go (its next task becomes claimable). A freed slot
            # alone changes nothing a claim finds: on one stream, waking for it
            # cost an empty claim per task.
            await self._stop.until(
                self.store.wait_for_work(self.queues, self.poll_interval),
                self._stream_freed.wait(),
            )
        # Stopped: what was claimed but never started goes back at once.
        await asyncio.gather(*(self._record.release(held) for held in self._feed.drain()))

    async def _claim_round(self, room: int) -> tuple[int, bool]:
        """Claim up to ``room`` units (several claims when streams are capped);
        start what slots allow and buffer the rest. How many tasks were found, and
        whether the last claim took fewer than it asked for (it saw them all)."""
        found = 0
        took_all = False
        while room > 0 and not self._stop.asked.is_set():
            claim_started = time.monotonic()
            tasks = await self.store.claim(
                self.queues,
                worker_id=self.worker_id,
                lease=self.lease,
                limit=room,
                group=self.group,
                per_stream=self._feed.per_stream(self._streams_held()),
            )
            took = time.monotonic() - claim_started
            self.instruments.claimed(tasks, took)
            if not tasks:
                break
            self._feed.claimed(took)
            found += len(tasks)
            took_all = len(tasks) < room
            room -= self._feed.add([self._hold(t) for t in tasks], lambda h: h.task.partition)
            self._fill()
            if took_all or not self._feed.streams:
                break  # it saw them all, or no stream in it: asking again finds nothing
        return found, took_all

    def _streams_held(self) -> int:
        """How many streams this worker holds tasks of (claimed and not let go)."""
        return len({h.task.partition for h in self._held.values() if h.task.partition is not None})

    def _hold(self, task: Task) -> Held:
        # Every third of the lease this claim was granted (the queue's setting may
        # have changed since this worker last read it).
        interval = (task.lease or self._heartbeats.lease_for(task.queue)) / 3
        held = Held(task=task, interval=interval, next_beat=time.monotonic() + interval)
        self._held[task.id] = held
        return held

    def _fill(self) -> None:
        """Start buffered units while slots are free (none after stop())."""
        while not self._stop.asked.is_set() and (unit := self._feed.take()) is not None:
            first = unit[0]
            # A unit of one task, a stream's head included, runs alone in its slot
            # (its handler inline, its slot freed when the handler returns); only a
            # run of several tasks of one stream needs the run's ordering.
            if len(unit) == 1:
                first.slot = True
                self._start(self._run_one(first), first.task.id)
            else:
                run = Run(left=len(unit))
                for held in unit:
                    held.run = run
                self._start(self._run_stream(unit, run), f"{first.task.partition}:{first.task.id}")

    def _start(self, coro: Coroutine[Any, Any, None], label: str) -> None:
        runner = asyncio.create_task(coro, name=f"conveyor-run-{label}")
        self._runners.add(runner)
        runner.add_done_callback(self._runners.discard)

    def _let_go(self, held: Held) -> None:
        held_back = self._feed.held_back
        if held.acking:
            held.acking = False
            self._feed.acking -= 1
        if self._held.get(held.task.id) is held:
            del self._held[held.task.id]
            if held.run is not None:
                held.run.left -= 1
            # Wake the claim loop only where this can change what a claim finds: the
            # next task of the stream, or a drain waiting for nothing to be held; or
            # where it makes room that back-pressure held back. (An unpartitioned
            # task's slot was freed when its handler returned; a claim now would only
            # find nothing again.)
            if (held.task.partition is not None and (held.run is None or held.run.left == 0)) or (
                self.stop_when_idle and not self._held
            ):
                self._stream_freed.set()
            if held_back:
                self._slots.freed.set()

    # ------------------------------------------------------------- running
    async def _run_one(self, held: Held) -> None:
        try:
            await self.instruments.attempt(held, self._attempts.run(held))
        finally:
            self._slots.free(held)
            self._let_go(held)

    async def _run_stream(self, helds: list[Held], run: Run) -> None:
        try:
            await self._run_in_order(helds, run)
        finally:
            self._slots.free(run=run)

    async def _run_in_order(self, helds: list[Held], run: Run) -> None:
        for i, held in enumerate(helds):
            if not run.holding and not await self._slots.back(run):
                for later in helds[i:]:  # stopped while waiting for a slot
                    await self._record.release(later)
                    self._let_go(later)
                return
            try:
                settled = await self.instruments.attempt(held, self._attempts.run(held))
            finally:
                self._let_go(held)
            rest = helds[i + 1 :]
            if rest and (not settled or self._stop.asked.is_set()):
                # A later task must not overtake one that will run again, and after
                # stop() nothing new starts: hand the rest back, in order.
                for later in rest:
                    await self._record.release(later)
                    self._let_go(later)
                return

    def _returned(self, held: Held, took: float) -> None:
        """``held``'s handler returned after ``took`` seconds; its success is about
        to be written."""
        self._feed.ran(took)
        if held.slot or (held.run is not None and held.run.holding):
            # The slot goes to other work now; the success is written meanwhile (the
            # lease stays ours until it is). A stream run's next task waits for that
            # write, then takes a slot again.
            held.acking = True
            self._feed.acking += 1
            if held.slot:
                self._slots.free(held)
            else:
                self._slots.free(run=held.run)


__all__ = ["Context", "TaskTimeout", "UnknownTask", "Worker"]
