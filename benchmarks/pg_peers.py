"""PostgreSQL peers: a raw psycopg queue doing the least that could work, pgqueuer
and procrastinate, each installed from the ``[bench]`` extra and driven through
its own public API.

Raw baseline: one table with a status column and a partial index on queued rows;
a claim is ``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT k)
RETURNING``, an acknowledgement one ``UPDATE ... WHERE id = ANY(...)`` per batch,
each a single autocommitted statement; new work is announced by ``NOTIFY`` in the
inserting statement. No leases, attempts, fencing, groups, partitions or keys.

Every peer task payload carries its task number (and, for latency, the time it
was sent), which the consumer hands to the :class:`~benchmarks.harness.Probe`.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta
from typing import Any

from benchmarks.harness import Outcome, Probe, pg_dsn, timed

RAW_DDL = [
    "CREATE TABLE raw_jobs (id BIGSERIAL PRIMARY KEY, queue TEXT NOT NULL, "
    "payload TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'queued', worker TEXT)",
    "CREATE INDEX raw_jobs_ready ON raw_jobs (queue, id) WHERE status = 'queued'",
]
RAW_INSERT = "INSERT INTO raw_jobs (queue, payload) VALUES ('q', %s)"
RAW_INSERT_NOTIFY = (
    "WITH j AS (INSERT INTO raw_jobs (queue, payload) VALUES ('q', %s) RETURNING id) "
    "SELECT pg_notify('raw_jobs', '') FROM j"
)
RAW_INSERT_MANY = "INSERT INTO raw_jobs (queue, payload) SELECT 'q', p FROM unnest(%s::text[]) p"
RAW_CLAIM = (
    "WITH pick AS (SELECT id FROM raw_jobs WHERE queue = 'q' AND status = 'queued' "
    "ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) "
    "UPDATE raw_jobs r SET status = 'running', worker = %s FROM pick WHERE r.id = pick.id "
    "RETURNING r.id, r.payload"
)
RAW_ACK = "UPDATE raw_jobs SET status = 'succeeded' WHERE id = ANY(%s) AND worker = %s"


def payload(i: int, sent_at: float | None = None) -> str:
    return json.dumps({"i": i} if sent_at is None else {"i": i, "t": sent_at})


# ----------------------------------------------------------------- raw psycopg
def raw_setup(url: str) -> None:
    import psycopg

    with psycopg.connect(pg_dsn(url), autocommit=True) as conn:
        for stmt in RAW_DDL:
            conn.execute(stmt)


async def _raw_conn(url: str) -> Any:
    import psycopg

    return await psycopg.AsyncConnection.connect(pg_dsn(url), autocommit=True)


async def raw_enqueue_single(url: str, n: int) -> Outcome:
    conn = await _raw_conn(url)

    async def body() -> None:
        for i in range(n):
            await conn.execute(RAW_INSERT, (payload(i),))

    try:
        return await timed(n, body)
    finally:
        await conn.close()


async def raw_enqueue_batch(url: str, n: int, size: int = 1000) -> Outcome:
    conn = await _raw_conn(url)

    async def body() -> None:
        for start in range(0, n, size):
            await conn.execute(
                RAW_INSERT_MANY, ([payload(i) for i in range(start, min(n, start + size))],)
            )

    try:
        return await timed(n, body)
    finally:
        await conn.close()


async def raw_prefill(url: str, n: int) -> None:
    await raw_enqueue_batch(url, n)


async def raw_consume(spec: dict[str, Any], probe: Probe) -> None:
    """``concurrency`` connections, each claiming ``k`` and acknowledging the batch."""
    url, k, me = spec["db"], spec["k"], spec["index"]
    conns = [await _raw_conn(url) for _ in range(spec["concurrency"])]
    await probe.ready()
    probe.begin()

    async def loop(c: Any, worker: str) -> None:
        while not probe.stopped:
            rows = await (await c.execute(RAW_CLAIM, (k, worker))).fetchall()
            if not rows:
                return
            await c.execute(RAW_ACK, ([r[0] for r in rows], worker))
            for r in rows:
                probe.ran(json.loads(r[1])["i"])

    await asyncio.gather(*(loop(c, f"p{me}w{j}") for j, c in enumerate(conns)))
    for c in conns:
        await c.close()


async def raw_latency_consume(spec: dict[str, Any], probe: Probe) -> None:
    """One task at a time; an empty claim waits for ``NOTIFY`` (1 s fallback poll)."""
    url = spec["db"]
    work, listen = await _raw_conn(url), await _raw_conn(url)
    await listen.execute("LISTEN raw_jobs")
    await probe.ready()
    while not probe.stopped:
        rows = await (await work.execute(RAW_CLAIM, (1, "w"))).fetchall()
        if not rows:
            async for _ in listen.notifies(timeout=1.0, stop_after=1):
                pass
            continue
        body = json.loads(rows[0][1])
        probe.ran(body["i"], body["t"])
        await work.execute(RAW_ACK, ([rows[0][0]], "w"))
    await work.close()
    await listen.close()


async def raw_produce_latency(url: str, m: int, gap: float) -> None:
    conn = await _raw_conn(url)
    try:
        await _paced(m, gap, lambda i, t: conn.execute(RAW_INSERT_NOTIFY, (payload(i, t),)))
    finally:
        await conn.close()


async def _paced(m: int, gap: float, send: Any) -> None:
    """Send ``m`` tasks ``gap`` seconds apart (on a fixed schedule, not after each send)."""
    start = time.perf_counter()
    for i in range(m):
        delay = start + i * gap - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await send(i, time.time())


# -------------------------------------------------------------------- pgqueuer
PGQ_ENTRY = "noop"


async def _pgq_queries(url: str) -> tuple[Any, Any]:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(pg_dsn(url))
    return conn, Queries(AsyncpgDriver(conn))


def pgq_setup(url: str) -> None:
    async def install() -> None:
        conn, queries = await _pgq_queries(url)
        await queries.install()
        await conn.close()

    asyncio.run(install())


async def pgq_enqueue_single(url: str, n: int) -> Outcome:
    conn, queries = await _pgq_queries(url)

    async def body() -> None:
        for i in range(n):
            await queries.enqueue(PGQ_ENTRY, payload(i).encode())

    try:
        return await timed(n, body)
    finally:
        await conn.close()


async def pgq_enqueue_batch(url: str, n: int, size: int = 1000) -> Outcome:
    conn, queries = await _pgq_queries(url)

    async def body() -> None:
        for start in range(0, n, size):
            count = min(n, start + size) - start
            await queries.enqueue(
                [PGQ_ENTRY] * count,
                [payload(i).encode() for i in range(start, start + count)],
                [0] * count,
            )

    try:
        return await timed(n, body)
    finally:
        await conn.close()


async def pgq_prefill(url: str, n: int) -> None:
    await pgq_enqueue_batch(url, n)


async def pgq_consume(spec: dict[str, Any], probe: Probe) -> None:
    """pgqueuer's QueueManager; ``batch_size`` = the concurrency asked for."""
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries, QueueManager

    conn = await asyncpg.connect(pg_dsn(spec["db"]))
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint(PGQ_ENTRY)
    async def noop(job: Any) -> None:
        body = json.loads(job.payload)
        probe.ran(body["i"], body.get("t"))

    await probe.ready()
    runner = asyncio.create_task(
        qm.run(batch_size=spec["concurrency"], dequeue_timeout=timedelta(seconds=1))
    )
    await probe.wait_done()
    qm.shutdown.set()
    await asyncio.wait_for(runner, 30)
    await conn.close()


async def pgq_produce_latency(url: str, m: int, gap: float) -> None:
    conn, queries = await _pgq_queries(url)
    try:
        await _paced(m, gap, lambda i, t: queries.enqueue(PGQ_ENTRY, payload(i, t).encode()))
    finally:
        await conn.close()


# --------------------------------------------------------------- procrastinate
def _proc_app(url: str) -> tuple[Any, Any]:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=pg_dsn(url)))

    @app.task(name="noop")
    async def noop(i: int, t: float | None = None) -> None:
        _PROC_PROBE[0].ran(i, t)

    return app, noop


_PROC_PROBE: list[Any] = [None]


def proc_setup(url: str) -> None:
    async def install() -> None:
        app, _ = _proc_app(url)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    asyncio.run(install())


async def proc_enqueue_single(url: str, n: int) -> Outcome:
    app, noop = _proc_app(url)
    async with app.open_async():

        async def body() -> None:
            for i in range(n):
                await noop.defer_async(i=i)

        return await timed(n, body)


async def proc_enqueue_batch(url: str, n: int, size: int = 1000) -> Outcome:
    app, noop = _proc_app(url)
    async with app.open_async():

        async def body() -> None:
            for start in range(0, n, size):
                await noop.batch_defer_async(
                    *({"i": i} for i in range(start, min(n, start + size)))
                )

        return await timed(n, body)


async def proc_prefill(url: str, n: int) -> None:
    await proc_enqueue_batch(url, n)


async def proc_consume(spec: dict[str, Any], probe: Probe) -> None:
    """procrastinate's worker at ``concurrency``, LISTEN/NOTIFY on (its default)."""
    _PROC_PROBE[0] = probe
    app, _ = _proc_app(spec["db"])
    async with app.open_async():
        await probe.ready()
        runner = asyncio.create_task(
            app.run_worker_async(
                concurrency=spec["concurrency"],
                install_signal_handlers=False,
                fetch_job_polling_interval=1.0,
            )
        )
        await probe.wait_done()
        runner.cancel()
        try:
            await asyncio.wait_for(runner, 30)
        except asyncio.CancelledError:
            pass


async def proc_produce_latency(url: str, m: int, gap: float) -> None:
    app, noop = _proc_app(url)
    async with app.open_async():
        await _paced(m, gap, lambda i, t: noop.defer_async(i=i, t=t))
