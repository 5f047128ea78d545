"""Flow control's workloads (``configure_queue(concurrency=, key_concurrency=,
rate=, key_rate=, fair=)``), on either backend, run by ``python -m benchmarks``:

- **rate-limited drain**: 4 worker processes (``App`` + ``Worker``, concurrency
  10 each) drain a queue set ``rate=Rate(R, per=1)``. A limit allows a burst of
  R after a quiet period, then R a second, so the drain of N tasks is timed from
  the R-th start to the N-th: ``sustained ÷ R`` is the rate held after the burst
  over the configured one (at most 1.0 by the limit's design; below it is what
  the workers leave unused). ``overall ÷ R`` is N over the whole drain.
- **key-concurrency drain**: 4 worker processes drain a queue set
  ``key_concurrency=2``, its tasks spread over 10 keys, each task taking 20 ms;
  a thread of the parent counts the running tasks per key in the database every
  few milliseconds. The run fails if a count ever exceeds the limit. Throughput
  is bounded by keys × limit ÷ 20 ms (1,000 tasks/s): ``÷ bound`` is how near.
- **the cost of each setting**: store-level ``claim(10)`` + ``ack_many`` at
  concurrency 10, one process, on a plain queue and on the same queue with one
  setting that never binds (``concurrency=1000``, ``key_concurrency=1000``,
  ``rate=Rate(1,000,000)``, ``key_rate=Rate(1,000,000)``, ``fair=True``); every
  queue's tasks carry concurrency keys over 100 keys. Shown as a ratio to plain.

Every workload checks that each of its N tasks ran exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import conveyor
from benchmarks.conveyor_side import QUEUE, request, url_for
from benchmarks.harness import BenchError, Outcome, Probe, combine, pg_dsn, run_consumers

RATE = 100  # tasks/s of the rate-limited drain
RATE_SECONDS_QUICK = 4  # after the burst: --quick drains ~5 s, a full run a minute
RATE_SECONDS = 60
PROCESSES = 4
WORKER_CONCURRENCY = 10
KEYS = 10
KEY_LIMIT = 2
WORK = 0.020  # seconds a task of the key-concurrency drain takes
SAMPLE_EVERY = 0.005
COST_KEYS = 100
NEVER = 1_000_000  # a rate no claim loop here reaches
#: (column label, configure_queue settings) of the cost workload; the first is the
#: base. A rate is given as (limit, per) and made a conveyor.Rate when used, so
#: this module imports on a conveyor without flow control (the plain claim path's
#: before/after comparison runs this suite on the tree before the feature).
COSTS: list[tuple[str, dict[str, Any]]] = [
    ("plain", {}),
    ("concurrency=1000", {"concurrency": 1000}),
    ("key_concurrency=1000", {"key_concurrency": 1000}),
    ("rate=Rate(10⁶)", {"rate": (NEVER, 1)}),
    ("key_rate=Rate(10⁶)", {"key_rate": (NEVER, 1)}),
    ("fair=True", {"fair": True}),
]

Case = tuple[str, Any]  # (column label, run(cfg) -> Outcome), as benchmarks.run's


@contextlib.contextmanager
def fresh(cfg: Any, backend: str) -> Iterator[str]:
    """An empty migrated database on ``backend``: a Postgres URL or a SQLite path."""
    if backend == "pg":
        from benchmarks.conveyor_side import setup

        with cfg.dbs.postgres(cfg.dbs.template("conveyor", setup)) as url:
            yield url
    else:
        with cfg.dbs.sqlite() as path:
            yield path


async def prefill(db: str, n: int, settings: dict[str, Any], keys: int) -> None:
    """The queue configured with ``settings`` (a rate as ``(limit, per)``), then N
    tasks, keyed over ``keys`` keys."""
    given = {
        name: conveyor.Rate(*value) if isinstance(value, tuple) else value
        for name, value in settings.items()
    }
    async with conveyor.connect(url_for(db)) as store:
        if given:
            await store.configure_queue(QUEUE, **given)
        for start in range(0, n, 1000):
            batch = []
            for i in range(start, min(n, start + 1000)):
                req = request(i)
                req["concurrency_key"] = f"k{i % keys}"
                batch.append(req)
            await store.submit_many(batch)


# ------------------------------------------------------------ child processes
async def worker_consume(spec: dict[str, Any], probe: Probe) -> None:
    """A Worker at ``concurrency`` on the queue; each task notes when it started
    and sleeps ``work`` seconds."""
    app = conveyor.App(url_for(spec["db"]))
    work = float(spec.get("work", 0.0))

    @app.task(name="noop", queue=QUEUE)
    async def noop(ctx: Any, i: int) -> None:
        probe.marks.append(time.time())
        if work:
            await asyncio.sleep(work)
        probe.ran(i)

    async with app:
        worker = app.worker(QUEUE, concurrency=spec["concurrency"])
        await app.store.open()
        await probe.ready()
        runner = asyncio.create_task(worker.run())
        await probe.wait_done()
        worker.stop()
        await asyncio.wait_for(runner, 60)


# -------------------------------------------------------------------- sampler
class RunningPerKey:
    """A thread that counts the queue's running tasks per concurrency key, in the
    database, until stopped; the most seen for any key."""

    SQL = (
        "SELECT concurrency_key, count(*) FROM conveyor_deliveries "
        f"WHERE status = 'running' AND queue = '{QUEUE}' GROUP BY concurrency_key"
    )

    def __init__(self, db: str) -> None:
        self.db = db
        self.most = 0
        self.samples = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        if self.error is not None:
            raise BenchError(f"sampling the running tasks failed: {self.error}")

    def _run(self) -> None:
        try:
            if self.db.startswith("postgresql"):
                import psycopg

                with psycopg.connect(pg_dsn(self.db), autocommit=True) as conn:
                    while not self._stop.is_set():
                        self._note(conn.execute(self.SQL).fetchall())
                        time.sleep(SAMPLE_EVERY)
            else:
                import sqlite3

                lite = sqlite3.connect(self.db, timeout=30, isolation_level=None)
                try:
                    while not self._stop.is_set():
                        self._note(lite.execute(self.SQL).fetchall())
                        time.sleep(SAMPLE_EVERY)
                finally:
                    lite.close()
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def _note(self, rows: list[Any]) -> None:
        self.samples += 1
        for key, count in rows:
            if key is not None:
                self.most = max(self.most, int(count))


# ---------------------------------------------------------------------- cases
def rate_case(backend: str, quick: bool) -> Case:
    """The rate-limited drain (see the module docs)."""

    def run(cfg: Any) -> Outcome:
        n = RATE * (1 + (RATE_SECONDS_QUICK if quick else RATE_SECONDS))
        with fresh(cfg, backend) as db:
            asyncio.run(prefill(db, n, {"rate": (RATE, 1)}, 1))
            specs = [
                {"db": db, "concurrency": WORKER_CONCURRENCY, "index": i} for i in range(PROCESSES)
            ]
            what = f"rate-limited drain ({backend}, rate {RATE}/s)"
            reports = run_consumers(
                "benchmarks.flow:worker_consume", specs, total=n, timeout=cfg.timeout, what=what
            )
            out = combine(reports, n, what)
        marks = sorted(m for r in reports for m in r["marks"])
        sustained = (n - RATE) / (marks[-1] - marks[RATE - 1])
        out.extra = {"sustained ÷ R": sustained / RATE, "overall ÷ R": out.rate / RATE}
        return out

    return f"App+Worker ×{PROCESSES}, N = {{n}}", run


def key_case(backend: str) -> Case:
    """The key-concurrency drain (see the module docs)."""

    def run(cfg: Any) -> Outcome:
        n = cfg.n
        with fresh(cfg, backend) as db:
            asyncio.run(prefill(db, n, {"key_concurrency": KEY_LIMIT}, KEYS))
            specs = [
                {"db": db, "concurrency": WORKER_CONCURRENCY, "index": i, "work": WORK}
                for i in range(PROCESSES)
            ]
            what = f"key-concurrency drain ({backend})"
            sampler = RunningPerKey(db)
            try:
                reports = run_consumers(
                    "benchmarks.flow:worker_consume",
                    specs,
                    total=n,
                    timeout=cfg.timeout,
                    produce=sampler.start,
                    what=what,
                )
            finally:
                sampler.stop()
            out = combine(reports, n, what)
        if sampler.most > KEY_LIMIT:
            raise BenchError(f"{what}: {sampler.most} tasks of one key ran at once")
        if not sampler.samples:
            raise BenchError(f"{what}: no sample of the running tasks was taken")
        bound = KEYS * KEY_LIMIT / WORK
        out.extra = {
            "max running per key": float(sampler.most),
            "samples": float(sampler.samples),
            "÷ bound": out.rate / bound,
        }
        return out

    return f"App+Worker ×{PROCESSES}", run


def cost_case(backend: str, label: str, settings: dict[str, Any]) -> Case:
    """Store-level claim(10) + ack of N keyed tasks on a queue set ``settings``."""

    def run(cfg: Any) -> Outcome:
        with fresh(cfg, backend) as db:
            asyncio.run(prefill(db, cfg.n, settings, COST_KEYS))
            specs = [{"db": db, "concurrency": 10, "k": 10, "index": 0}]
            what = f"claim(10) + ack, {label} ({backend})"
            reports = run_consumers(
                "benchmarks.conveyor_side:store_consume",
                specs,
                total=cfg.n,
                timeout=cfg.timeout,
                what=what,
            )
            return combine(reports, cfg.n, what)

    return label, run


def workloads(backend: str, quick: bool) -> list[tuple[str, list[Case], str | None]]:
    """The flow-control rows of one backend: ``(name, cases, base column)``, the
    base column being what the row's other columns are shown as a ratio of."""
    label, rate_run = rate_case(backend, quick)
    n_rate = RATE * (1 + (RATE_SECONDS_QUICK if quick else RATE_SECONDS))
    return [
        (
            f"flow control: rate-limited drain, rate=Rate({RATE}, per=1)",
            [(label.format(n=f"{n_rate:,}"), rate_run)],
            None,
        ),
        (
            f"flow control: key_concurrency={KEY_LIMIT}, {KEYS} keys, tasks of "
            f"{WORK * 1000:.0f} ms",
            [key_case(backend)],
            None,
        ),
        (
            "flow control: cost, store claim(10) + ack, concurrency 10, 1 process",
            [cost_case(backend, name, settings) for name, settings in COSTS],
            COSTS[0][0],
        ),
    ]
