"""Throughput: conveyor against a raw-SQL queue doing the least that could work.

    python benchmarks/throughput.py --url sqlite:///bench.db
    python benchmarks/throughput.py --url postgresql://postgres@127.0.0.1/bench

Both sides run the same workload in one process: submit N tasks in batches,
then C concurrent consumers claim batches of B and acknowledge each batch in one
call, until the queue is empty. The baseline is one table with a status column,
a partial index on queued rows, a claim of ``UPDATE ... WHERE id IN (SELECT ...
FOR UPDATE SKIP LOCKED)`` (Postgres) or ``BEGIN IMMEDIATE`` (SQLite), and an
acknowledgement by id list: no leases, attempts, fencing, groups, partitions or
keys. The ratio says what the protocol costs on top of that.

Use a scratch database: the script drops and creates its tables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import time

import conveyor
from conveyor.connect import resolve_url


async def run_conveyor(url: str, n: int, consumers: int, batch: int) -> tuple[float, float]:
    async with conveyor.connect(url) as store:
        queue = f"bench-{time.time_ns()}"
        started = time.perf_counter()
        for i in range(0, n, 1000):
            await store.submit_many(
                [
                    {"name": "t", "queue": queue, "payload": {"i": j}}
                    for j in range(i, min(n, i + 1000))
                ]
            )
        submitted = time.perf_counter()

        async def consume(me: int) -> None:
            worker = f"w{me}"
            while True:
                tasks = await store.claim(queue, worker_id=worker, limit=batch)
                if not tasks:
                    return
                await store.succeed_many(
                    [{"task_id": t.id, "worker_id": worker, "attempt": t.attempt} for t in tasks]
                )

        await asyncio.gather(*(consume(i) for i in range(consumers)))
        done = time.perf_counter()
    return n / (submitted - started), n / (done - submitted)


BASELINE_DDL = [
    "DROP TABLE IF EXISTS raw_jobs",
    "CREATE TABLE raw_jobs (id {pk}, queue TEXT NOT NULL, payload TEXT NOT NULL, "
    "status TEXT NOT NULL, worker TEXT)",
    "CREATE INDEX raw_jobs_ready ON raw_jobs (queue, id) WHERE status = 'queued'",
]


async def run_raw_postgres(url: str, n: int, consumers: int, batch: int) -> tuple[float, float]:
    import psycopg
    from sqlalchemy.engine import make_url

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    for stmt in BASELINE_DDL:
        await conn.execute(stmt.format(pk="BIGSERIAL PRIMARY KEY"))
    started = time.perf_counter()
    for i in range(0, n, 1000):
        async with conn.transaction(), conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO raw_jobs (queue, payload, status) VALUES ('q', %s, 'queued')",
                [(json.dumps({"i": j}),) for j in range(i, min(n, i + 1000))],
            )
    submitted = time.perf_counter()

    async def consume(me: int) -> None:
        c = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        while True:
            async with c.transaction():
                rows = await (
                    await c.execute(
                        "UPDATE raw_jobs SET status = 'running', worker = %s WHERE id IN ("
                        "SELECT id FROM raw_jobs WHERE queue = 'q' AND status = 'queued' "
                        "ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING id, payload",
                        (f"w{me}", batch),
                    )
                ).fetchall()
            if not rows:
                break
            async with c.transaction():
                await c.execute(
                    "UPDATE raw_jobs SET status = 'succeeded' WHERE id = ANY(%s) AND worker = %s",
                    ([r[0] for r in rows], f"w{me}"),
                )
        await c.close()

    await asyncio.gather(*(consume(i) for i in range(consumers)))
    done = time.perf_counter()
    await conn.execute("DROP TABLE raw_jobs")
    await conn.close()
    return n / (submitted - started), n / (done - submitted)


def run_raw_sqlite(url: str, n: int, consumers: int, batch: int) -> tuple[float, float]:
    from sqlalchemy.engine import make_url

    path = make_url(url).database or ":memory:"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    for stmt in BASELINE_DDL:
        conn.execute(stmt.format(pk="INTEGER PRIMARY KEY"))
    started = time.perf_counter()
    for i in range(0, n, 1000):
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO raw_jobs (queue, payload, status) VALUES ('q', ?, 'queued')",
            [(json.dumps({"i": j}),) for j in range(i, min(n, i + 1000))],
        )
        conn.execute("COMMIT")
    submitted = time.perf_counter()
    # One writer: consumers take turns; running them in threads would only add lock waits.
    while True:
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute(
            "SELECT id, payload FROM raw_jobs WHERE queue = 'q' AND status = 'queued' "
            "ORDER BY id LIMIT ?",
            (batch,),
        ).fetchall()
        ids = [r[0] for r in rows]
        conn.executemany("UPDATE raw_jobs SET status = 'running' WHERE id = ?", [(i,) for i in ids])
        conn.execute("COMMIT")
        if not rows:
            break
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "UPDATE raw_jobs SET status = 'succeeded' WHERE id = ?", [(i,) for i in ids]
        )
        conn.execute("COMMIT")
    done = time.perf_counter()
    conn.execute("DROP TABLE raw_jobs")
    conn.close()
    return n / (submitted - started), n / (done - submitted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="sqlite:///bench-throughput.db")
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=50)
    args = parser.parse_args()
    dialect, _ = resolve_url(args.url)
    shape = (args.tasks, args.consumers, args.batch)

    if dialect == "postgresql":
        raw_numbers = asyncio.run(run_raw_postgres(args.url, *shape))
    else:
        raw_numbers = run_raw_sqlite(args.url, *shape)
    ours = asyncio.run(run_conveyor(args.url, *shape))
    print(f"{dialect}: {args.tasks} tasks, {args.consumers} consumers, batches of {args.batch}")
    print(f"{'':24}{'submit/s':>12}{'claim+ack/s':>14}")
    for label, (sub, cons) in (("raw SQL baseline", raw_numbers), ("conveyor", ours)):
        print(f"{label:24}{sub:12.0f}{cons:14.0f}")
    ratio = (ours[0] / raw_numbers[0], ours[1] / raw_numbers[1])
    print(f"{'conveyor / baseline':24}{ratio[0]:12.2f}{ratio[1]:14.2f}")


if __name__ == "__main__":
    main()
