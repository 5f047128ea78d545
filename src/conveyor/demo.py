"""``conveyor demo``: a self-contained tour of the store, on a throwaway SQLite file.

It submits tasks to three queues and consumes them with in-process workers that
use the store's claim/succeed API directly:

* ``demo.jobs`` — a plain job queue, consumed in queue mode by competing workers;
  a few tasks fail on their first attempt to show retries;
* ``demo.events`` — a bus: consumer groups ``analytics`` and ``audit`` each
  receive every event, while queue-mode workers also consume it (mixed mode);
* ``demo.stream`` — a partitioned stream (one partition per customer) that must be
  processed in submit order within each partition, by two competing workers.

At the end it prints throughput, what each mode processed, and checks that every
partition was processed in submit order (exit 1 if not).
"""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from sqlalchemy.engine import make_url

import conveyor
from conveyor.models import Status, Task
from conveyor.store.base import TaskStore

JOBS = "demo.jobs"
EVENTS = "demo.events"
STREAM = "demo.stream"
GROUPS = ("analytics", "audit")
BATCH = 32  # tasks per claim: amortises the write lock over many tasks
SUBMIT_CHUNK = 100
FLAKY_EVERY = 20  # one job in this many fails once, then succeeds on retry
IDLE_WAIT = 0.02


@dataclass(frozen=True, slots=True)
class Plan:
    """How many tasks go where."""

    jobs: int
    events: int
    stream: int
    partitions: int

    @classmethod
    def split(cls, tasks: int) -> Plan:
        """Spread ``tasks`` over the three queues (40% jobs, 30% events, 30% stream)."""
        jobs = tasks * 4 // 10
        stream = tasks * 3 // 10
        events = tasks - jobs - stream
        return cls(jobs=jobs, events=events, stream=stream, partitions=max(2, min(8, stream // 4)))

    @property
    def targets(self) -> dict[str, int]:
        """Deliveries each consumer must finish: queue mode takes jobs and events."""
        out = {"queue mode": self.jobs + self.events, "partitioned": self.stream}
        for group in GROUPS:
            out[f"group {group}"] = self.events
        return out


@dataclass
class Outcome:
    """What happened during one demo run."""

    url: str
    plan: Plan
    queues: dict[str, str]
    submit_seconds: float = 0.0
    run_seconds: float = 0.0
    done: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    retried: int = 0
    order: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    problems: list[str] = field(default_factory=list)

    @property
    def deliveries(self) -> int:
        """Task deliveries completed across every mode."""
        return sum(self.done.values())


def run(*, url: str | None, tasks: int, keep: bool, console: Console) -> int:
    """Run the demo and print what happened; returns the exit code (0, or 1 on failure)."""
    tmp: Path | None = None
    if url is None:
        tmp = Path(tempfile.mkdtemp(prefix="conveyor-demo-"))
        url = f"sqlite:///{tmp / 'demo.db'}"
        suffix = ""
    else:
        # A user's database may hold earlier runs: give this one its own queues.
        suffix = "-" + _run_tag()
    queues = {"jobs": JOBS + suffix, "events": EVENTS + suffix, "stream": STREAM + suffix}
    outcome = Outcome(url=url, plan=Plan.split(tasks), queues=queues)
    try:
        asyncio.run(_tour(outcome, console))
    finally:
        if tmp is not None and not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    _summary(outcome, console, temporary=tmp is not None, keep=keep)
    return 1 if outcome.problems else 0


def _run_tag() -> str:
    return f"{int(time.time()) % 100000:05d}{random.randrange(100):02d}"


async def _tour(outcome: Outcome, console: Console) -> None:
    plan, names = outcome.plan, outcome.queues
    store = conveyor.connect(outcome.url)
    async with store:
        for group in GROUPS:
            await store.subscribe(names["events"], group, start="new")
        started = time.perf_counter()
        with console.status("submitting tasks…"):
            requests = _requests(plan, names)
            for i in range(0, len(requests), SUBMIT_CHUNK):
                await store.submit_many(requests[i : i + SUBMIT_CHUNK])
        outcome.submit_seconds = time.perf_counter() - started
        console.print(
            f"submitted [bold]{len(requests)}[/] tasks in {outcome.submit_seconds:.2f} s "
            f"to {escape(names['jobs'])}, {escape(names['events'])} "
            f"(+ groups {' and '.join(GROUPS)}) and {escape(names['stream'])} "
            f"({plan.partitions} partitions)"
        )
        await _consume(store, outcome, console)
        await _verify(store, outcome)


def _requests(plan: Plan, names: dict[str, str]) -> list[dict[str, Any]]:
    """The tasks to submit, interleaved across queues and partitions."""
    rng = random.Random(7)
    kinds = ["jobs"] * plan.jobs + ["events"] * plan.events + ["stream"] * plan.stream
    rng.shuffle(kinds)
    per_partition: dict[str, int] = defaultdict(int)
    out: list[dict[str, Any]] = []
    for i, kind in enumerate(kinds):
        if kind == "jobs":
            flaky = i % FLAKY_EVERY == 0
            out.append(
                {
                    "name": "flaky_job" if flaky else "resize_image",
                    "payload": {"image": f"img-{i}.png", "width": 64 + i % 7 * 32},
                    "queue": names["jobs"],
                    "priority": rng.choice((0, 0, 0, 5)),
                }
            )
        elif kind == "events":
            out.append(
                {
                    "name": "order_placed",
                    "payload": {"order": i, "amount": rng.randrange(5, 500)},
                    "queue": names["events"],
                }
            )
        else:
            partition = f"customer-{rng.randrange(plan.partitions)}"
            n = per_partition[partition]
            per_partition[partition] += 1
            out.append(
                {
                    "name": "apply_change",
                    "payload": {"customer": partition, "n": n},
                    "queue": names["stream"],
                    "partition": partition,
                }
            )
    return out


async def _consume(store: TaskStore, outcome: Outcome, console: Console) -> None:
    targets = outcome.plan.targets
    names = outcome.queues
    progress = Progress(
        TextColumn("{task.description:<18}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    bars = {mode: progress.add_task(mode, total=total) for mode, total in targets.items()}
    started = time.perf_counter()
    with progress:
        workers = [
            _worker(
                store,
                outcome,
                progress,
                bars,
                "queue mode",
                [names["jobs"], names["events"]],
                None,
                f"demo-q{i}",
            )
            for i in range(2)
        ]
        workers += [
            _worker(store, outcome, progress, bars, f"group {g}", [names["events"]], g, f"demo-{g}")
            for g in GROUPS
        ]
        workers += [
            _worker(
                store, outcome, progress, bars, "partitioned", [names["stream"]], None, f"demo-s{i}"
            )
            for i in range(2)
        ]
        # Generous: a healthy run takes seconds; this only keeps a stuck run from hanging.
        limit = 60.0 + outcome.plan.jobs / 20
        try:
            await asyncio.wait_for(asyncio.gather(*workers), timeout=limit)
        except TimeoutError:
            outcome.problems.append(f"workers did not finish within {limit:.0f} s")
    outcome.run_seconds = time.perf_counter() - started


async def _worker(
    store: TaskStore,
    outcome: Outcome,
    progress: Progress,
    bars: dict[str, TaskID],
    mode: str,
    queues: list[str],
    group: str | None,
    worker_id: str,
) -> None:
    """Claim batches and finish them in order until ``mode`` has done its share."""
    target = outcome.plan.targets[mode]
    while outcome.done[mode] < target:
        claimed = await store.claim(queues, worker_id=worker_id, limit=BATCH, group=group, lease=30)
        if not claimed:
            await store.wait_for_work(queues, IDLE_WAIT)
            continue
        acks: list[dict[str, Any]] = []
        for task in claimed:
            await asyncio.sleep(0)  # stands in for real work; lets the others interleave
            if task.name == "flaky_job" and task.attempt == 1 and group is None:
                await store.fail(
                    task.id,
                    worker_id=worker_id,
                    error="simulated failure on the first attempt",
                    delay=0,
                    attempt=task.attempt,
                )
                outcome.retried += 1
                continue
            if task.partition is not None:
                # Recorded before the write: the order in which work happened.
                outcome.order[task.partition].append(int(task.payload["n"]))
            acks.append(
                {
                    "task_id": task.id,
                    "worker_id": worker_id,
                    "result": _result(task),
                    "group": group,
                    "attempt": task.attempt,
                }
            )
        # One commit acknowledges the whole batch, each task still fenced on its own.
        for result in await store.succeed_many(acks):
            if isinstance(result, Exception):
                outcome.problems.append(f"an acknowledgement failed: {result}")
                continue
            outcome.done[mode] += 1
            progress.advance(bars[mode])


def _result(task: Task) -> dict[str, Any]:
    if task.partition is not None:
        return {"applied": task.payload["n"]}
    return {"ok": True}


async def _verify(store: TaskStore, outcome: Outcome) -> None:
    """Check partition order as the workers saw it and as the store recorded it."""
    for partition, seen in sorted(outcome.order.items()):
        if seen != list(range(len(seen))):
            first = next(i for i, n in enumerate(seen) if n != i)
            outcome.problems.append(
                f"{partition}: position {first} processed task #{seen[first]}, expected #{first}"
            )
    # The store's view: within each partition, finish times follow submit order.
    finished: dict[str, list[tuple[int, Any]]] = defaultdict(list)
    cursor: str | None = None
    while True:
        page = await store.list(queue=outcome.queues["stream"], limit=1000, cursor=cursor)
        for task in page.items:
            if task.status is not Status.SUCCEEDED:
                outcome.problems.append(f"stream task {task.id} ended {task.status.value}")
            elif task.partition is not None:
                finished[task.partition].append((task.payload["n"], task.finished_at))
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    for partition, rows in sorted(finished.items()):
        times = [when for _, when in rows]
        if [n for n, _ in rows] != list(range(len(rows))) or times != sorted(times):
            outcome.problems.append(f"{partition}: finish times do not follow submit order")
    for report in await store.stats():
        if report.queue not in outcome.queues.values():
            continue
        views: list[tuple[str, dict[str, int]]] = [("queue mode", report.counts)]
        views += [(f"group {n}", g.counts) for n, g in report.groups.items()]
        for label, counts in views:
            open_ = counts.get("queued", 0) + counts.get("running", 0)
            if open_:
                outcome.problems.append(f"{report.queue} ({label}): {open_} task(s) unfinished")


def _summary(outcome: Outcome, console: Console, *, temporary: bool, keep: bool) -> None:
    plan, names = outcome.plan, outcome.queues
    rate = outcome.deliveries / outcome.run_seconds if outcome.run_seconds else 0.0
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="what happened", title_justify="left")
    table.add_column("mode")
    table.add_column("queue")
    table.add_column("done", justify="right")
    table.add_column("notes")
    notes: dict[str, tuple[str, str]] = {
        "queue mode": (
            f"{names['jobs']}, {names['events']}",
            f"competing workers; {outcome.retried} retried after a simulated failure",
        ),
        "partitioned": (names["stream"], f"{plan.partitions} partitions, FIFO within each"),
    }
    for group in GROUPS:
        notes[f"group {group}"] = (names["events"], "receives every event")
    for mode in ("queue mode", *(f"group {g}" for g in GROUPS), "partitioned"):
        queue, note = notes[mode]
        done, total = outcome.done[mode], plan.targets[mode]
        shown = f"{done}" if done == total else f"[red]{done}/{total}[/]"
        table.add_row(mode, escape(queue), shown, escape(note))
    console.print(table)
    console.print(
        f"throughput: [bold]{rate:,.0f} tasks/s[/] ({outcome.deliveries} deliveries in "
        f"{outcome.run_seconds:.2f} s; submit {outcome.submit_seconds:.2f} s)"
    )
    streams = len(outcome.order)
    if outcome.problems:
        console.print(f"ordering checked: [bold red]✗[/] {len(outcome.problems)} problem(s)")
        for problem in outcome.problems[:10]:
            console.print(f"  [red]•[/] {escape(problem)}")
    else:
        console.print(
            f"ordering checked: [bold green]✓[/] all {streams} partitions processed in "
            "submit order; every delivery succeeded"
        )
    safe_url = make_url(outcome.url).render_as_string(hide_password=True)
    if temporary and keep:
        console.print(f"database kept: try [bold]conveyor stats --url {escape(safe_url)}[/]")
    elif not temporary:
        console.print(f"inspect it: [bold]conveyor stats --url {escape(safe_url)}[/]")
