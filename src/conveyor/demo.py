"""``conveyor demo``: a tour of conveyor the way an application uses it.

Tasks are defined with ``@app.task`` and run by real :class:`~conveyor.worker.Worker`
instances (four of them, in this process) on a throwaway SQLite file:

* ``demo.jobs``: image jobs, consumed in queue mode by two competing workers; a
  few fail once and are retried; one of them, followed closely, tells its whole
  story (submitted, claimed, progress, failed, retried, succeeded);
* ``demo.events``: a bus: consumer groups ``analytics`` and ``audit`` each
  receive every event, while the queue-mode workers consume them too (mixed mode);
* ``demo.orders``: a partitioned stream (one partition per customer) that must
  be handled in submit order within each partition, by the two competing workers.

It is paced to last a few seconds, shows live progress per consumer, then prints
a table (in the order of the bars), the followed task's story, the ordering
check (exit 1 if any partition ran out of order) and where the database is.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Table

import conveyor
from conveyor.models import Status
from conveyor.task_functions import TaskCall
from conveyor.worker import Context, Worker

GROUPS = ("analytics", "audit")
TARGET_SECONDS = 3.0  # how long the default run should take: long enough to watch
SLOTS = 4  # concurrency of each worker
FLAKY_EVERY = 15  # one job in this many fails once, then succeeds on retry
STORY_STEPS = (("downloading", 0.2), ("resizing", 0.5), ("uploading", 0.8))
RETRY_DELAY = 0.6  # seconds: the followed task's backoff, so its retry is visible


@dataclass(frozen=True)
class Plan:
    """How many tasks go where, and how long each handler takes."""

    jobs: int
    events: int
    orders: int
    partitions: int
    pace: float  # mean seconds a handler works

    @classmethod
    def split(cls, tasks: int) -> Plan:
        """40% jobs, 30% events, 30% orders, paced to last about TARGET_SECONDS."""
        jobs, orders = tasks * 4 // 10, tasks * 3 // 10
        events = tasks - jobs - orders
        # The two queue-mode workers carry every task: that is the longest line.
        pace = min(0.2, max(0.001, TARGET_SECONDS * 2 * SLOTS / tasks))
        return cls(jobs, events, orders, max(2, min(8, orders // 6)), pace)

    def consumers(self, names: dict[str, str]) -> list[tuple[str, str, int]]:
        """``(label, queue, expected)`` per consumer, in display order."""
        rows = [("queue mode", names["jobs"], self.jobs)]
        rows.append(("queue mode", names["events"], self.events))
        rows += [(f"group {g}", names["events"], self.events) for g in GROUPS]
        rows.append(("partitioned, 2 workers", names["orders"], self.orders))
        return rows


@dataclass
class Tour:
    """What the handlers saw, for the bars and the summary."""

    plan: Plan
    names: dict[str, str]
    done: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    retried: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    order: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    story: list[tuple[float, str]] = field(default_factory=list)
    story_id: str | None = None
    #: When the followed task was submitted (its ``created_at``), the story's zero.
    story_start: datetime | None = None
    t0: float = field(default_factory=time.monotonic)
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    def tell(self, line: str) -> None:
        """Add a line to the followed task's story."""
        self.story.append((time.monotonic() - self.t0, line))

    def finished(self, ctx: Context, label: str | None = None) -> None:
        """Count a handler that is about to succeed."""
        task = ctx.task
        key = (label or (f"group {task.group}" if task.group else "queue mode"), task.queue)
        self.done[key] += 1
        if task.attempt > 1:
            self.retried[key] += 1

    async def work(self, spread: float = 0.5) -> None:
        """Pretend to work for about ``plan.pace`` seconds."""
        await asyncio.sleep(self.plan.pace * random.uniform(1 - spread, 1 + spread))


def build_app(url: str, tour: Tour) -> conveyor.App:
    """The demo's App: four task functions, as an application would write them."""
    app = conveyor.App(url)
    names = tour.names

    @app.task(name="demo.resize", queue=names["jobs"], backoff=RETRY_DELAY, max_attempts=3)
    async def resize(ctx: Context, image: str, flaky: bool = False) -> dict[str, Any]:
        follow = ctx.task.id == tour.story_id
        if follow:
            claimed = f"claimed by {ctx.worker_id}, attempt {ctx.task.attempt}"
            if ctx.task.attempt > 1:  # when the retry was due, on the story's clock
                due = (ctx.task.run_at - ctx.task.created_at).total_seconds()
                claimed += f" (its retry was due at {due:.2f})"
            tour.tell(claimed)
            for message, fraction in STORY_STEPS:
                await ctx.progress(fraction, message)
                tour.tell(f"progress {fraction:.0%} {message}")
                await tour.work(0)
        else:
            await tour.work()
        if flaky and ctx.task.attempt == 1:
            if follow:
                tour.tell(
                    f"fails: ConnectionError; queued again, due in {RETRY_DELAY:g} s (backoff)"
                )
            raise ConnectionError(f"the image store timed out on {image}")
        tour.finished(ctx)
        result = {"image": image, "thumbnail": image.replace(".png", "-64.png")}
        if follow:  # told now, when it happens, not when the tour ends
            tour.tell(f"succeeded on attempt {ctx.task.attempt}, result {result}")
        return result

    @app.task(name="demo.event", queue=names["events"])
    async def event(ctx: Context, kind: str, n: int) -> None:
        await tour.work()
        tour.finished(ctx)

    @app.task(name="demo.order_step", queue=names["orders"], partition=lambda c, s: c)
    async def order_step(ctx: Context, customer: str, seq: int) -> None:
        tour.order[customer].append(seq)
        await tour.work()
        tour.finished(ctx, "partitioned, 2 workers")

    return app


def run(*, url: str | None, tasks: int, keep: bool, console: Console) -> int:
    """Run the demo and print what happened; returns the exit code (0, or 1 on failure)."""
    tmp: Path | None = None
    suffix = ""
    if url is None:
        tmp = Path(tempfile.mkdtemp(prefix="conveyor-demo-"))
        url = f"sqlite:///{tmp / 'demo.db'}"
    else:
        # A user's database may hold earlier runs: give this one its own queues.
        suffix = f"-{int(time.time()) % 100000:05d}{random.randrange(100):02d}"
    names = {q: f"demo.{q}{suffix}" for q in ("jobs", "events", "orders")}
    tour = Tour(plan=Plan.split(tasks), names=names)
    console.print(f"[bold]conveyor demo[/]  database: {escape(url)}")
    try:
        asyncio.run(_tour(url, tour, console))
    finally:
        if tmp is not None and not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    _summary(url, tour, console, temporary=tmp is not None, keep=keep)
    return 1 if tour.problems else 0


async def _tour(url: str, tour: Tour, console: Console) -> None:
    app = build_app(url, tour)
    # The demo's database is the one it chose (a temporary file unless --url):
    # pinned, so that a $CONVEYOR_URL set for real work is left alone.
    with app.using(conveyor.connect(url)):
        async with app:
            await _run(app, tour, console)
    _check_order(tour)


async def _run(app: conveyor.App, tour: Tour, console: Console) -> None:
    plan, names = tour.plan, tour.names
    store = app.store
    for group in GROUPS:
        await store.subscribe(names["events"], group, start="all")
    resize, event, step = (app.tasks[n] for n in ("demo.resize", "demo.event", "demo.order_step"))
    followed = await resize.submit("cover.png", flaky=True)
    tour.story_id = followed.id
    tour.story_start = followed.created_at
    tour.t0 = time.monotonic()
    tour.tell(f"submitted to {names['jobs']} as {followed.id}")
    kinds = ["job"] * (plan.jobs - 1) + ["event"] * plan.events + ["order"] * plan.orders
    random.Random(7).shuffle(kinds)
    requests: list[dict[str, Any]] = []
    seq: dict[str, int] = defaultdict(int)
    for i, kind in enumerate(kinds):  # numbered in submit order, per partition
        if kind == "job":
            args: list[Any] = [f"img-{i}.png"]
            requests.append(TaskCall(resize, {}).request(args, {"flaky": i % FLAKY_EVERY == 1}))
        elif kind == "event":
            requests.append(TaskCall(event, {}).request(["click", i], {}))
        else:
            customer = f"customer-{i % plan.partitions}"
            requests.append(TaskCall(step, {}).request([customer, seq[customer]], {}))
            seq[customer] += 1
    for i in range(0, len(requests), 500):
        await store.submit_many(requests[i : i + 500])
    console.print(
        f"submitted {tasks_total(plan)} tasks: {plan.jobs} jobs, {plan.events} events "
        f"(also to groups {' and '.join(GROUPS)}), {plan.orders} orders in "
        f"{plan.partitions} partitions; 4 workers on it now"
    )
    workers = [
        app.worker(list(names.values()), concurrency=SLOTS, worker_id=f"worker-{i}") for i in (1, 2)
    ]
    workers += [
        app.worker(names["events"], concurrency=SLOTS, group=g, worker_id=f"worker-{g}")
        for g in GROUPS
    ]
    for w in workers:
        w.poll_interval = 0.05
    started = time.monotonic()
    runs = [asyncio.create_task(w.run()) for w in workers]
    try:
        await _watch(tour, console)
    finally:
        tour.seconds = time.monotonic() - started
        tour.tell("every consumer is done: the workers stop")
        await _stop(workers, runs)
    final = await store.get(followed.id)
    if final is None or final.status is not Status.SUCCEEDED:
        tour.problems.append(f"the followed task ended {final and final.status.value}")


def tasks_total(plan: Plan) -> int:
    """How many tasks the plan submits."""
    return plan.jobs + plan.events + plan.orders


async def _watch(tour: Tour, console: Console) -> None:
    """Live bars, one per consumer, until every consumer has finished its share."""
    rows = tour.plan.consumers(tour.names)
    progress = Progress(
        TextColumn("{task.description:<34}"),
        BarColumn(bar_width=30),
        MofNCompleteColumn(),
        console=console,
        transient=False,
    )
    bars: list[tuple[TaskID, tuple[str, str], int]] = []
    for label, queue, expected in rows:
        bars.append(
            (progress.add_task(f"{label}: {queue}", total=expected), (label, queue), expected)
        )
    deadline = time.monotonic() + max(60.0, TARGET_SECONDS * 10)
    with progress:
        while True:
            for bar, key, _ in bars:
                progress.update(bar, completed=tour.done[key])
            if all(tour.done[key] >= expected for _, key, expected in bars):
                return
            if time.monotonic() > deadline:
                tour.problems.append("the workers did not finish within the time limit")
                return
            await asyncio.sleep(0.1)


async def _stop(workers: list[Worker], runs: list[asyncio.Task[None]]) -> None:
    for w in workers:
        w.stop()
    await asyncio.gather(*runs, return_exceptions=True)


def _clock(moment: datetime) -> str:
    """``14:19:25.426 UTC``: a time of day a reader can match with the logs."""
    return moment.astimezone(UTC).strftime("%H:%M:%S.%f")[:-3] + " UTC"


def _check_order(tour: Tour) -> None:
    for customer, seqs in tour.order.items():
        if seqs != sorted(seqs):
            tour.problems.append(f"{customer} ran out of order: {seqs}")


def _summary(url: str, tour: Tour, console: Console, *, temporary: bool, keep: bool) -> None:
    table = Table(box=box.SIMPLE_HEAD, title="what happened", title_justify="left")
    for column in ("consumer", "queue"):
        table.add_column(column)
    for column in ("tasks", "retried", "tasks/s"):
        table.add_column(column, justify="right")
    seconds = max(tour.seconds, 1e-9)
    for label, queue, _ in tour.plan.consumers(tour.names):
        done = tour.done[(label, queue)]
        table.add_row(
            label,
            escape(queue),
            str(done),
            str(tour.retried[(label, queue)]),
            f"{done / seconds:,.0f}",
        )
    total = sum(tour.done.values())
    console.print(table)
    console.print(
        f"{total} deliveries of {tasks_total(tour.plan)} tasks in {tour.seconds:.1f} s "
        f"({total / seconds:,.0f} tasks/s; each handler sleeps ~{tour.plan.pace * 1000:.0f} ms)"
    )
    start = "" if tour.story_start is None else f" at {_clock(tour.story_start)}"
    console.print(f"\n[bold]one task's story[/] (seconds since it was submitted{start})")
    for at, line in tour.story:
        console.print(f"  [dim]{at:5.2f}[/]  {escape(line)}")
    if any("ran out of order" in p for p in tour.problems):
        console.print("\n[red]✗ ordering check failed[/]")
    else:
        console.print(
            f"\n[green]✓[/] ordering checked: {len(tour.order)} partitions, each handled in "
            "submit order by two competing workers"
        )
    for problem in tour.problems:
        console.print(f"[red]problem:[/] {escape(problem)}")
    if temporary and not keep:
        console.print(
            f"\ndatabase: {escape(url)} [dim](a temporary file, deleted now; "
            "`conveyor demo --keep` keeps it to look around)[/]"
        )
    else:
        console.print(
            f"\ndatabase: {escape(url)}\nlook around: conveyor stats --url {escape(url)}  ·  "
            f"conveyor list --url {escape(url)}"
        )
