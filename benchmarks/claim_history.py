"""Claim cost against a large finished history.

    python benchmarks/claim_history.py --url sqlite:///bench.db --history 100000
    python benchmarks/claim_history.py --url postgresql://user@host/db --history 100000

Measures the median latency of one claim + succeed (limit=1), for queue mode and
for a consumer group, for unpartitioned and for partitioned tasks: first on an
empty store, then after ``--history`` tasks have been submitted (with the group
subscribed, so every task has a queue-mode and a group delivery), claimed and
finished by both. A claim whose cost grows with the history shows a ratio well
above 1.

Loading: ``submit_many`` in chunks of 5,000; the history is then claimed through
the API (``limit=1000``) by queue mode and by the group. ``--finish bulk`` (the
default) acknowledges each claimed batch with one UPDATE that writes what
``succeed()`` writes (status, result, finished_at, cleared lease) and refreshes
the touched streams the way ``succeed()`` does; ``--finish api`` calls
``succeed()`` for every task (the same end state, many times slower to load).

On Postgres the history is vacuumed and analyzed before the second measurement,
as autovacuum would do (``--no-vacuum`` skips it: then the dead index entries of
rows that just left the claimable state are what a claim steps over, until a
vacuum runs — keep autovacuum on).

Use an empty database: other queues' rows would count as history too.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

import conveyor
from conveyor import statements as q
from conveyor.schema import deliveries as d
from conveyor.store.base import TaskStore

CHUNK = 5_000
CLAIM_CHUNK = 1_000
GROUP = "analytics"
QUEUE = "bench"
PARTITIONS = 1_000  # partitions the history's partitioned tasks are spread over
LIVE_PARTITIONS = 20


@dataclass
class Sample:
    view: str
    kind: str
    median_ms: float
    p90_ms: float


def ms(seconds: float) -> float:
    return seconds * 1000.0


async def drain(store: TaskStore, queue: str, view: str | None) -> None:
    while got := await store.claim(queue, worker_id="drain", group=view, limit=CLAIM_CHUNK):
        for task in got:
            await store.succeed(task.id, worker_id="drain", group=view)


async def measure(store: TaskStore, queue: str, samples: int, label: str) -> list[Sample]:
    """Median claim + succeed latency for each (view, kind), one task at a time."""
    out: list[Sample] = []
    for view in (None, GROUP):
        for kind in ("plain", "partitioned"):
            tag = uuid.uuid4().hex[:6]
            await store.submit_many(
                [
                    {
                        "name": f"live-{label}",
                        "queue": queue,
                        "partition": f"live-{tag}-{n % LIVE_PARTITIONS}"
                        if kind == "partitioned"
                        else None,
                    }
                    for n in range(samples + 20)
                ]
            )
            times: list[float] = []
            for n in range(samples + 20):
                started = time.perf_counter()
                got = await store.claim(queue, worker_id="bench", group=view)
                if not got:
                    raise SystemExit(f"nothing to claim ({label}, {view}, {kind})")
                await store.succeed(got[0].id, worker_id="bench", group=view)
                if n >= 20:  # the first 20 warm the pool and caches
                    times.append(time.perf_counter() - started)
            times.sort()
            out.append(
                Sample(
                    view="queue mode" if view is None else f"group {view}",
                    kind=kind,
                    median_ms=ms(statistics.median(times)),
                    p90_ms=ms(times[int(len(times) * 0.9)]),
                )
            )
            # The other view's copies of these tasks: finish them before the next case.
            await drain(store, queue, GROUP if view is None else None)
    return out


async def finish_bulk(
    store: TaskStore, queue: str, grp: str, seqs: list[int], parts: set[str]
) -> None:
    """What succeed() writes, for a whole claimed batch at once."""

    async def work(conn: AsyncConnection) -> None:
        now = store._now()
        await conn.execute(
            update(d)
            .where(
                d.c.grp == grp,
                d.c.task_seq.in_(seqs),
                d.c.status == q.RUNNING,
                d.c.worker_id == "loader",
            )
            .values(status="succeeded", result="null", finished_at=now, lease_expires_at=None)
        )
        await store._refresh_streams(conn, [(queue, grp, p) for p in parts])

    await store._run(work)


async def load_history(store: TaskStore, queue: str, history: int, finish: str) -> None:
    started = time.perf_counter()
    for start in range(0, history, CHUNK):
        await store.submit_many(
            [
                {
                    "name": "old",
                    "queue": queue,
                    # every tenth task is partitioned
                    "partition": f"old-{n % PARTITIONS}" if n % 10 == 0 else None,
                }
                for n in range(start, min(start + CHUNK, history))
            ]
        )
    print(f"  submitted {history} tasks in {time.perf_counter() - started:.1f} s", flush=True)
    for view in (None, GROUP):
        started = time.perf_counter()
        grp = view or q.QUEUE_MODE
        done = 0
        while got := await store.claim(queue, worker_id="loader", group=view, limit=CLAIM_CHUNK):
            if finish == "api":
                for n in range(0, len(got), 50):
                    await asyncio.gather(
                        *(
                            store.succeed(t.id, worker_id="loader", group=view)
                            for t in got[n : n + 50]
                        )
                    )
            else:
                seqs = await task_seqs(store, [t.id for t in got])
                parts = {t.partition for t in got if t.partition}
                await finish_bulk(store, queue, grp, seqs, parts)
            done += len(got)
        where = "queue mode" if view is None else f"group {view}"
        print(
            f"  {where}: claimed and finished {done} in {time.perf_counter() - started:.1f} s",
            flush=True,
        )
        if done != history:
            raise SystemExit(f"expected to finish {history} tasks, finished {done}")


async def task_seqs(store: TaskStore, ids: list[str]) -> list[int]:
    from conveyor.schema import tasks as t

    async def work(conn: AsyncConnection) -> list[int]:
        rows = await conn.execute(select(t.c.seq).where(t.c.id.in_(ids)))
        return [int(seq) for seq in rows.scalars()]

    return await store._run(work, write=False)


async def vacuum(url: str, *, run: bool) -> None:
    """Postgres: what autovacuum does in the background (dead index entries of the
    finished rows are what a claim would otherwise step over), unless told not to."""
    import psycopg
    from sqlalchemy.engine import make_url

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        setting = await (await conn.execute("SHOW autovacuum")).fetchone()
        print(f"  autovacuum = {setting[0] if setting else '?'}", flush=True)
        if run:
            started = time.perf_counter()
            await conn.execute(
                "VACUUM ANALYZE conveyor_deliveries, conveyor_streams, conveyor_tasks"
            )
            print(f"  VACUUM ANALYZE in {time.perf_counter() - started:.1f} s", flush=True)


async def count_rows(store: TaskStore) -> int:
    async def work(conn: AsyncConnection) -> int:
        return int((await conn.execute(select(func.count()).select_from(d))).scalar_one())

    return await store._run(work, write=False)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="database URL (use an empty database)")
    parser.add_argument("--history", type=int, default=100_000, help="finished tasks to load")
    parser.add_argument("--samples", type=int, default=200, help="claims measured per case")
    parser.add_argument("--finish", choices=["api", "bulk"], default="bulk")
    parser.add_argument(
        "--no-vacuum",
        action="store_true",
        help="Postgres: measure without the VACUUM ANALYZE that autovacuum would have done",
    )
    args = parser.parse_args()

    async with conveyor.connect(args.url) as store:
        existing = await count_rows(store)
        if existing:
            print(f"warning: the database already holds {existing} delivery rows", flush=True)
        await store.subscribe(QUEUE, GROUP, start="all")
        print(f"{type(store).__name__}: empty history", flush=True)
        empty = await measure(store, QUEUE, args.samples, "empty")
        print(f"loading a history of {args.history} tasks (finish={args.finish})", flush=True)
        await load_history(store, QUEUE, args.history, args.finish)
        if store.url.startswith("postgresql"):
            await vacuum(store.url, run=not args.no_vacuum)
        print(f"{type(store).__name__}: {await count_rows(store)} delivery rows", flush=True)
        full = await measure(store, QUEUE, args.samples, "history")

    print()
    print(f"claim + succeed latency, median (p90) in ms; history = {args.history} tasks")
    print(f"{'view':<18}{'kind':<13}{'empty':>16}{'history':>16}{'ratio':>8}")
    worst = 0.0
    for a, b in zip(empty, full, strict=True):
        ratio = b.median_ms / a.median_ms
        worst = max(worst, ratio)
        print(
            f"{a.view:<18}{a.kind:<13}"
            f"{a.median_ms:>8.2f} ({a.p90_ms:>5.2f}){b.median_ms:>8.2f} ({b.p90_ms:>5.2f})"
            f"{ratio:>8.2f}"
        )
    print(f"worst median ratio (history / empty): {worst:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
