"""conveyor's side of every workload, on either backend: the store API, and
``App`` + ``Worker`` with their defaults (only ``concurrency`` and ``group`` set).

Store-level processing: ``concurrency`` coroutines over one store, each
``claim(limit=k)`` then ``ack_many()`` for the batch (the lean acknowledgement).

The finished history of the claim-cost workload is seeded with plain SQL: one
task is submitted, claimed and finished through the API, then its rows are
copied a million times (every tenth copy partitioned, over 1,000 partitions).
The copy reads its column list from ``conveyor.schema``, so it follows the schema.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import conveyor
from benchmarks.harness import Outcome, Probe, timed

QUEUE = "bench"
#: A queue no task is sent to (the store-level loops' warm-up claims).
IDLE_QUEUE = "bench-idle"
NAME = "noop"
HISTORY_PARTITIONS = 1_000


def url_for(db: str) -> str:
    """A conveyor URL: Postgres URLs pass through, anything else is a SQLite path."""
    return db if db.startswith("postgresql") else f"sqlite:///{db}"


def request(
    i: int, *, partition: str | None = None, sent_at: float | None = None
) -> dict[str, Any]:
    """What ``noop.submit(i)`` of the app below passes to ``store.submit``."""
    args: list[Any] = [i] if sent_at is None else [i, sent_at]
    req: dict[str, Any] = {
        "name": NAME,
        "queue": QUEUE,
        "payload": {"args": args, "kwargs": {}},
    }
    if partition is not None:
        req["partition"] = partition
    return req


def make_app(db: str, probe: Probe | None = None) -> tuple[conveyor.App, Any]:
    app = conveyor.App(url_for(db))

    @app.task(name=NAME, queue=QUEUE)
    async def noop(ctx: Any, i: int, t: float | None = None) -> None:
        if probe is not None:
            probe.ran(i, t)

    return app, noop


def setup(db: str) -> None:
    """Migrate an empty database (the template every measurement is copied from)."""

    async def migrate() -> None:
        async with conveyor.connect(url_for(db)):
            pass

    asyncio.run(migrate())


# --------------------------------------------------------------------- enqueue
async def store_enqueue_single(db: str, n: int) -> Outcome:
    async with conveyor.connect(url_for(db)) as store:

        async def body() -> None:
            for i in range(n):
                await store.submit(**request(i))

        return await timed(n, body)


async def store_enqueue_batch(db: str, n: int, size: int = 1000) -> Outcome:
    async with conveyor.connect(url_for(db)) as store:

        async def body() -> None:
            for start in range(0, n, size):
                await store.submit_many([request(i) for i in range(start, min(n, start + size))])

        return await timed(n, body)


async def app_enqueue_single(db: str, n: int) -> Outcome:
    app, noop = make_app(db)
    async with app:
        await app.store.open()

        async def body() -> None:
            for i in range(n):
                await noop.submit(i)

        return await timed(n, body)


async def app_enqueue_batch(db: str, n: int, size: int = 1000) -> Outcome:
    """The App has no batch submit: the requests its task function builds, in
    ``submit_many`` calls of ``size``."""
    app, noop = make_app(db)
    async with app:
        await app.store.open()
        call = noop.with_options()

        async def body() -> None:
            for start in range(0, n, size):
                await app.store.submit_many(
                    [call.request([i], {}) for i in range(start, min(n, start + size))]
                )

        return await timed(n, body)


async def prefill(db: str, n: int, *, partitions: int | None = None, groups: int = 0) -> None:
    """N queued tasks (spread over ``partitions`` streams if given); with ``groups``,
    that many consumer groups subscribed first and the queue declared groups-only."""
    async with conveyor.connect(url_for(db)) as store:
        if groups:
            await store.configure_queue(QUEUE, queue_mode=False)
            for g in range(groups):
                await store.subscribe(QUEUE, f"g{g}", start="all")
        for start in range(0, n, 1000):
            await store.submit_many(
                [
                    request(i, partition=None if partitions is None else f"p{i % partitions}")
                    for i in range(start, min(n, start + 1000))
                ]
            )


# ------------------------------------------------------------------ processing
async def store_consume(spec: dict[str, Any], probe: Probe) -> None:
    k, me = spec["k"], spec["index"]
    async with conveyor.connect(url_for(spec["db"])) as store:
        # Connections are made before the clock starts, as the raw baseline opens
        # its own: one empty claim per loop, on a queue nothing is sent to, at once
        # (the store makes a connection for each statement that finds none idle).
        workers = [f"p{me}w{j}" for j in range(spec["concurrency"])]
        await asyncio.gather(*(store.claim(IDLE_QUEUE, worker_id=w, limit=k) for w in workers))
        await probe.ready()
        probe.begin()

        async def loop(worker: str) -> None:
            while not probe.stopped:
                tasks = await store.claim(QUEUE, worker_id=worker, limit=k)
                if not tasks:
                    return
                failed = await store.ack_many(
                    [{"task_id": t.id, "worker_id": worker, "attempt": t.attempt} for t in tasks]
                )
                if any(failed):
                    raise RuntimeError(f"acknowledgements failed: {failed}")
                for task in tasks:
                    probe.ran(task.payload["args"][0])

        await asyncio.gather(*(loop(w) for w in workers))


async def worker_consume(spec: dict[str, Any], probe: Probe) -> None:
    app, _ = make_app(spec["db"], probe)
    async with app:
        options = {"poll_interval": spec["poll_interval"]} if "poll_interval" in spec else {}
        worker = app.worker(
            QUEUE, concurrency=spec["concurrency"], group=spec.get("group"), **options
        )
        await app.store.open()
        await probe.ready()
        runner = asyncio.create_task(worker.run())
        await probe.wait_done()
        worker.stop()
        await asyncio.wait_for(runner, 60)


async def app_produce_latency(db: str, m: int, gap: float) -> None:
    app, noop = make_app(db)
    async with app:
        await app.store.open()
        start = time.perf_counter()
        for i in range(m):
            delay = start + i * gap - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await noop.submit(i, time.time())


# --------------------------------------------------------------------- history
def seed_history(db: str, history: int) -> None:
    """Make ``db`` hold ``history`` finished tasks of QUEUE (see the module docs)."""
    asyncio.run(_seed(db, history))


async def _seed(db: str, history: int) -> None:
    from conveyor.schema import deliveries, streams, tasks

    async with conveyor.connect(url_for(db)) as store:
        await store.submit_many([request(-1), request(-2, partition="old-seed")])
        for _ in range(2):
            for task in await store.claim(QUEUE, worker_id="seed", limit=2):
                await store.succeed(task.id, worker_id="seed", attempt=task.attempt)
    pg = db.startswith("postgresql")

    def series(alias: str, lo: int, hi: int) -> str:
        if pg:
            return f"generate_series({lo}, {hi}) AS {alias}(x)"
        return (
            f"(WITH RECURSIVE s(x) AS (SELECT {lo} UNION ALL SELECT x + 1 FROM s "
            f"WHERE x < {hi}) SELECT x FROM s) AS {alias}"
        )

    def copy(table: Any, source: str, changed: dict[str, str]) -> tuple[str, str]:
        names = [c.name for c in table.columns if c.name != "seq"]
        exprs = [changed.get(c, f'{source}."{c}"') for c in names]
        return ", ".join(f'"{c}"' for c in names), ", ".join(exprs)

    new_id = "'H' || lpad(g.x::text, 25, '0')" if pg else "printf('H%025d', g.x)"
    partition = (
        f"CASE WHEN g.x % 10 = 0 THEN 'old-' || CAST(g.x % {HISTORY_PARTITIONS} AS TEXT) END"
    )
    sample = "(SELECT seq FROM conveyor_tasks WHERE name = 'noop' AND id NOT LIKE 'H%' "
    t_names, t_exprs = copy(tasks, "t", {"id": new_id, "partition": partition, "key": "NULL"})
    d_names, d_exprs = copy(
        deliveries, "d", {"task_seq": "nt.seq", "partition": "nt.partition", "rolled": "1"}
    )
    s_names, s_exprs = copy(streams, "s", {"partition": "'old-' || CAST(p.x AS TEXT)"})
    statements = [
        f"INSERT INTO conveyor_tasks ({t_names}) SELECT {t_exprs} "
        f"FROM conveyor_tasks t, {series('g', 1, history)} "
        f"WHERE t.seq = {sample}AND partition IS NULL)",
        f"INSERT INTO conveyor_deliveries ({d_names}) SELECT {d_exprs} "
        "FROM conveyor_tasks nt, conveyor_deliveries d "
        f"WHERE nt.id LIKE 'H%' AND d.task_seq = {sample}AND partition IS NULL)",
        f"INSERT INTO conveyor_streams ({s_names}) SELECT {s_exprs} "
        f"FROM conveyor_streams s, {series('p', 0, HISTORY_PARTITIONS - 1)} "
        "WHERE s.partition = 'old-seed'",
    ]
    if pg:
        import psycopg

        from benchmarks.harness import pg_dsn

        with psycopg.connect(pg_dsn(db)) as conn:
            for stmt in statements:
                conn.execute(stmt)
        with psycopg.connect(pg_dsn(db), autocommit=True) as admin:
            # What autovacuum does soon after a load this size.
            admin.execute("VACUUM ANALYZE conveyor_tasks, conveyor_deliveries, conveyor_streams")
    else:
        import sqlite3

        lite = sqlite3.connect(db, isolation_level=None)
        lite.execute("BEGIN IMMEDIATE")
        for stmt in statements:
            lite.execute(stmt)
        lite.execute("COMMIT")
        lite.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        lite.close()
