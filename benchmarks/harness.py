"""What every measurement shares: fresh databases, timing, client CPU, consumer
processes, and the check that exactly N tasks ran, none twice.

A measurement is one :class:`Outcome`. Enqueue workloads run in this process;
processing and latency workloads run their consumers in child processes
(``multiprocessing`` forkserver), which get ready (import, connect), meet at a
barrier, and then consume. Every handler reports the task number it ran to a
:class:`Probe`; the parent collects them and fails the run unless every number
from 0 to N-1 ran exactly once.

Time of a processing run: from the first task started in any process to the N-th
task finished (so process start-up is not counted). Client CPU: user + system
time of the consumer processes (all their threads) over the same span, or of
this process for enqueue workloads; the database server's CPU is not counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import multiprocessing as mp
import os
import queue as queue_mod
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

# Consumer processes come from a fork server that has imported the systems once, so
# each measurement's processes start in milliseconds rather than re-importing.
SPAWN = mp.get_context("forkserver")
SPAWN.set_forkserver_preload(
    [
        "sqlalchemy",
        "psycopg",
        "conveyor",
        "conveyor.worker",
        "benchmarks.conveyor_side",
        "benchmarks.flow",
        "benchmarks.pg_peers",
        "benchmarks.sqlite_peers",
        "asyncpg",
        "pgqueuer",
        "procrastinate",
        "huey",
    ]
)


class BenchError(Exception):
    """A workload did not do what it must (a task missing, one run twice, a timeout)."""


@dataclass
class Outcome:
    """One measurement: ``n`` tasks in ``seconds`` using ``cpu`` client CPU seconds."""

    n: int
    seconds: float
    cpu: float
    latencies: list[float] = field(default_factory=list)  # seconds, latency workloads
    per_group: list[float] = field(default_factory=list)  # tasks/s per consumer group
    #: What a workload measures beside tasks/s (flow control: a rate's ratio to
    #: its limit, the most tasks seen running per key), by name.
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.n / self.seconds if self.seconds > 0 else float("inf")

    @property
    def cpu_us(self) -> float:
        return self.cpu / self.n * 1e6 if self.n else 0.0


def cpu_seconds() -> float:
    """User + system CPU of this process, all threads."""
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0..100)."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def median(values: list[float]) -> float:
    return statistics.median(values)


def check_exactly_once(ids: list[int], n: int, what: str) -> None:
    """Every task number 0..n-1 ran once: raise BenchError naming what went wrong."""
    seen: set[int] = set()
    twice = sorted({i for i in ids if i in seen or seen.add(i)})  # type: ignore[func-returns-value]
    missing = n - len(seen)
    extra = sorted(seen - set(range(n)))
    if twice or missing or extra:
        raise BenchError(
            f"{what}: expected tasks 0..{n - 1} to run once each; "
            f"{len(ids)} runs, {len(twice)} ran twice (e.g. {twice[:5]}), "
            f"{missing} never ran, {len(extra)} unknown"
        )


async def timed(n: int, body: Callable[[], Any]) -> Outcome:
    """Time an in-process coroutine (an enqueue workload) with this process's CPU."""
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    await body()
    t1, cpu1 = time.perf_counter(), cpu_seconds()
    return Outcome(n=n, seconds=t1 - t0, cpu=cpu1 - cpu0)


# ------------------------------------------------------------------ databases
class Databases:
    """Fresh, empty databases: one per measurement, dropped afterwards.

    Postgres: ``CREATE DATABASE ... TEMPLATE`` from a template that holds the
    system's schema (installing a schema is not what is measured). SQLite: a new
    file in a scratch folder.
    """

    def __init__(self, pg_url: str | None, scratch: str | None = None) -> None:
        self.pg_url = pg_url
        self.scratch = scratch or tempfile.mkdtemp(prefix="conveyor-bench-")
        self._own_scratch = scratch is None
        self._count = 0
        self._templates: dict[str, str] = {}
        self._tag = f"bench_{os.getpid()}"

    def _admin(self) -> Any:
        import psycopg

        assert self.pg_url is not None
        return psycopg.connect(pg_dsn(self.pg_url), autocommit=True)

    def pg_db_url(self, name: str) -> str:
        from sqlalchemy.engine import make_url

        assert self.pg_url is not None
        return make_url(self.pg_url).set(database=name).render_as_string(hide_password=False)

    def template(self, kind: str, setup: Callable[[str], None]) -> str:
        """The name of a template database for ``kind``, made once by ``setup(url)``."""
        if kind not in self._templates:
            name = f"{self._tag}_tpl_{kind}"
            with self._admin() as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                admin.execute(f'CREATE DATABASE "{name}"')
            setup(self.pg_db_url(name))
            self._templates[kind] = name
        return self._templates[kind]

    @contextlib.contextmanager
    def postgres(self, template: str, *, big: bool = False) -> Iterator[str]:
        """A new database copied from ``template``; its URL. Dropped on exit."""
        self._count += 1
        name = f"{self._tag}_{self._count}"
        # FILE_COPY: a large template (the history) is copied as files, not through WAL.
        strategy = " STRATEGY FILE_COPY" if big else ""
        with self._admin() as admin:
            admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"{strategy}')
        try:
            yield self.pg_db_url(name)
        finally:
            with self._admin() as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    @contextlib.contextmanager
    def sqlite(self, copy_of: str | None = None) -> Iterator[str]:
        """A new SQLite file (empty, or a copy of ``copy_of``); its path. Removed on exit."""
        self._count += 1
        path = os.path.join(self.scratch, f"db{self._count}.sqlite")
        if copy_of is not None:
            shutil.copyfile(copy_of, path)
        try:
            yield path
        finally:
            for suffix in ("", "-wal", "-shm", "-journal"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path + suffix)

    def sqlite_path(self, name: str) -> str:
        """A long-lived file in the scratch folder (a template)."""
        return os.path.join(self.scratch, name)

    def close(self) -> None:
        if self.pg_url is not None and self._templates:
            with self._admin() as admin:
                for name in self._templates.values():
                    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if self._own_scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)


def pg_dsn(url: str) -> str:
    """A libpq URL (no SQLAlchemy driver suffix) for ``url``."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


# ------------------------------------------------------------ consumer side
class Probe:
    """Handed to a consumer in its child process: report each task run here."""

    def __init__(
        self, n: int, counter: Any, done: Any, barrier: Any, results: Any, index: int
    ) -> None:
        self.n = n
        self.index = index
        self._counter = counter
        self._done = done
        self._barrier = barrier
        self._results = results
        self.ids: list[int] = []
        self.latencies: list[float] = []
        #: Times (``time.time()``) a consumer notes for itself: flow control's
        #: workloads note when each task started.
        self.marks: list[float] = []
        self.t0: float | None = None
        self.t1: float | None = None
        self.cpu0 = 0.0
        self.cpu1 = 0.0

    def ready_sync(self) -> None:
        """Set-up is done: wait for every other consumer process and the parent."""
        self._barrier.wait(timeout=120)

    async def ready(self) -> None:
        await asyncio.to_thread(self.ready_sync)

    def begin(self) -> None:
        """Work starts now (store-level loops call it before their first claim)."""
        if self.t0 is None:
            self.t0 = time.time()
            self.cpu0 = cpu_seconds()

    def ran(self, i: int, sent_at: float | None = None) -> None:
        """Task number ``i`` ran (``sent_at``: when it was enqueued, for latency)."""
        now = time.time()
        if self.t0 is None:
            self.t0 = now
            self.cpu0 = cpu_seconds()
        if sent_at is not None:
            self.latencies.append(now - sent_at)
        self.ids.append(i)
        self.t1 = now
        with self._counter.get_lock():
            self._counter.value += 1
            total = self._counter.value
        if total >= self.n:
            self.cpu1 = cpu_seconds()
            self._done.set()

    @property
    def stopped(self) -> bool:
        return bool(self._done.is_set())

    def wait_done_sync(self, timeout: float) -> None:
        self._done.wait(timeout)

    async def wait_done(self, timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while not self._done.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    def report(self) -> None:
        if not self.cpu1:
            self.cpu1 = cpu_seconds()
        self._results.put(
            {
                "index": self.index,
                "ids": self.ids,
                "latencies": self.latencies,
                "marks": self.marks,
                "t0": self.t0,
                "t1": self.t1,
                "cpu": self.cpu1 - self.cpu0 if self.t0 is not None else 0.0,
            }
        )


def _child(target: str, spec: Mapping[str, Any], probe: Probe) -> None:
    module, _, name = target.partition(":")
    func = getattr(importlib.import_module(module), name)
    try:
        if inspect.iscoroutinefunction(func):
            asyncio.run(func(spec, probe))
        else:
            func(spec, probe)
    finally:
        probe.report()


def run_consumers(
    target: str,
    specs: list[dict[str, Any]],
    *,
    total: int,
    timeout: float,
    produce: Callable[[], None] | None = None,
    what: str,
) -> list[dict[str, Any]]:
    """Run ``target`` ("module:function", taking ``(spec, probe)``) in one child
    process per spec until ``total`` tasks have run; the children's reports.

    ``produce`` (optional) runs in this process once every child is ready (the
    latency workloads submit their tasks there).
    """
    counter = SPAWN.Value("q", 0)
    done = SPAWN.Event()
    barrier = SPAWN.Barrier(len(specs) + 1)
    results = SPAWN.Queue()
    procs = [
        SPAWN.Process(
            target=_child,
            args=(target, spec, Probe(total, counter, done, barrier, results, i)),
            name=f"bench-{i}",
        )
        for i, spec in enumerate(specs)
    ]
    for proc in procs:
        proc.start()
    reports: list[dict[str, Any]] = []
    try:
        try:
            barrier.wait(timeout=180)
        except Exception as exc:  # threading.BrokenBarrierError: a child died getting ready
            raise BenchError(f"{what}: a consumer process failed to start") from exc
        if produce is not None:
            produce()
        if not done.wait(timeout):
            raise BenchError(f"{what}: only {counter.value} of {total} tasks ran in {timeout} s")
        deadline = time.monotonic() + 60
        while len(reports) < len(procs):
            try:
                reports.append(results.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue_mod.Empty:
                raise BenchError(f"{what}: a consumer process did not report back") from None
    finally:
        done.set()
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
    for proc in procs:
        if proc.exitcode != 0:
            raise BenchError(f"{what}: consumer process exited with {proc.exitcode}")
    return sorted(reports, key=lambda r: int(r["index"]))


def combine(reports: list[dict[str, Any]], n: int, what: str) -> Outcome:
    """One Outcome from the children's reports, after the exactly-once check."""
    ids = [i for r in reports for i in r["ids"]]
    check_exactly_once(ids, n, what)
    t0 = min(r["t0"] for r in reports if r["t0"] is not None)
    t1 = max(r["t1"] for r in reports if r["t1"] is not None)
    return Outcome(
        n=n,
        seconds=t1 - t0,
        cpu=sum(float(r["cpu"]) for r in reports),
        latencies=[x for r in reports for x in r["latencies"]],
    )
