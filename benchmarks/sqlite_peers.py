"""SQLite peers: raw ``sqlite3`` doing the least that could work, and huey's
``SqliteHuey`` (from the ``[bench]`` extra, through its public API).

Raw baseline: WAL, ``synchronous=NORMAL`` (conveyor's own setting), one table with a
status column and a partial index on queued rows. A claim is ``BEGIN IMMEDIATE``;
``UPDATE ... WHERE id = (SELECT ... LIMIT 1) RETURNING``; ``COMMIT``, a completion
one autocommitted ``UPDATE``. Consumer threads share one in-process lock around
writes (SQLite has one writer; the lock spares them busy-retry sleeps). An idle
consumer polls every 10 ms.

huey runs with its defaults (thread workers, 0.1 s initial poll backing off by
1.15x); a consumer is ``huey.create_consumer(workers=C, worker_type="thread")``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from typing import Any

from benchmarks.harness import Outcome, Probe, cpu_seconds

RAW_DDL = [
    "CREATE TABLE IF NOT EXISTS raw_jobs (id INTEGER PRIMARY KEY, queue TEXT NOT NULL, "
    "payload TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'queued', worker TEXT)",
    "CREATE INDEX IF NOT EXISTS raw_jobs_ready ON raw_jobs (queue, id) WHERE status = 'queued'",
]
RAW_INSERT = "INSERT INTO raw_jobs (queue, payload) VALUES ('q', ?)"
RAW_CLAIM = (
    "UPDATE raw_jobs SET status = 'running', worker = ? WHERE id = ("
    "SELECT id FROM raw_jobs WHERE queue = 'q' AND status = 'queued' ORDER BY id LIMIT 1) "
    "RETURNING id, payload"
)
RAW_ACK = "UPDATE raw_jobs SET status = 'succeeded' WHERE id = ? AND worker = ?"


def payload(i: int, sent_at: float | None = None) -> str:
    return json.dumps({"i": i} if sent_at is None else {"i": i, "t": sent_at})


def _raw_conn(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    for stmt in RAW_DDL:
        conn.execute(stmt)
    return conn


def _timed(n: int, body: Any) -> Outcome:
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    body()
    t1, cpu1 = time.perf_counter(), cpu_seconds()
    return Outcome(n=n, seconds=t1 - t0, cpu=cpu1 - cpu0)


def raw_enqueue_single(path: str, n: int) -> Outcome:
    conn = _raw_conn(path)

    def body() -> None:
        for i in range(n):
            conn.execute(RAW_INSERT, (payload(i),))

    try:
        return _timed(n, body)
    finally:
        conn.close()


def raw_enqueue_batch(path: str, n: int, size: int = 1000) -> Outcome:
    conn = _raw_conn(path)

    def body() -> None:
        for start in range(0, n, size):
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                RAW_INSERT, [(payload(i),) for i in range(start, min(n, start + size))]
            )
            conn.execute("COMMIT")

    try:
        return _timed(n, body)
    finally:
        conn.close()


def raw_prefill(path: str, n: int) -> None:
    raw_enqueue_batch(path, n)


def raw_consume(spec: dict[str, Any], probe: Probe) -> None:
    """``concurrency`` threads, each with its own connection: claim 1, run, complete."""
    path = spec["db"]
    conns = [_raw_conn(path) for _ in range(spec["concurrency"])]
    write = threading.Lock()
    poll = spec.get("poll")  # latency: an idle consumer polls this often

    def loop(conn: sqlite3.Connection, worker: str) -> None:
        while not probe.stopped:
            with write:
                conn.execute("BEGIN IMMEDIATE")
                row = conn.execute(RAW_CLAIM, (worker,)).fetchone()
                conn.execute("COMMIT")
            if row is None:
                if poll is None:
                    return
                time.sleep(poll)
                continue
            body = json.loads(row[1])
            probe.ran(body["i"], body.get("t"))
            with write:
                conn.execute(RAW_ACK, (row[0], worker))

    threads = [
        threading.Thread(target=loop, args=(c, f"w{j}"), daemon=True) for j, c in enumerate(conns)
    ]
    probe.ready_sync()
    probe.begin()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for conn in conns:
        conn.close()


def raw_produce_latency(path: str, m: int, gap: float) -> None:
    conn = _raw_conn(path)
    try:
        _paced(m, gap, lambda i, t: conn.execute(RAW_INSERT, (payload(i, t),)))
    finally:
        conn.close()


def _paced(m: int, gap: float, send: Any) -> None:
    start = time.perf_counter()
    for i in range(m):
        delay = start + i * gap - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        send(i, time.time())


# ------------------------------------------------------------------------ huey
_HUEY_PROBE: list[Any] = [None]


def _huey(path: str) -> tuple[Any, Any]:
    from huey import SqliteHuey

    huey = SqliteHuey("bench", filename=path)

    @huey.task(name="noop")
    def noop(i: int, t: float | None = None) -> None:
        _HUEY_PROBE[0].ran(i, t)

    return huey, noop


def huey_enqueue_single(path: str, n: int) -> Outcome:
    huey, noop = _huey(path)

    def body() -> None:
        for i in range(n):
            noop(i)

    try:
        return _timed(n, body)
    finally:
        huey.storage.close()


def huey_prefill(path: str, n: int) -> None:
    huey_enqueue_single(path, n)


def huey_consume(spec: dict[str, Any], probe: Probe) -> None:
    _HUEY_PROBE[0] = probe
    huey, _ = _huey(spec["db"])
    consumer = huey.create_consumer(
        workers=spec["concurrency"], worker_type="thread", periodic=False
    )
    probe.ready_sync()
    consumer.start()
    probe.wait_done_sync(600)
    # Every task has run: stop without joining workers that may sleep in their poll
    # back-off for up to 10 s (timing ended already; this only saves wall time).
    consumer.stop(graceful=False)


def huey_produce_latency(path: str, m: int, gap: float) -> None:
    huey, noop = _huey(path)
    try:
        _paced(m, gap, lambda i, t: noop(i, t))
    finally:
        huey.storage.close()
