"""Profile App+Worker draining N queued no-op tasks, with pyinstrument.

    python -m benchmarks.profile_worker --url postgresql://postgres@127.0.0.1/scratch
    python -m benchmarks.profile_worker --url /tmp/scratch.sqlite --concurrency 1

The database must be a scratch one: the tasks are queued in queue ``bench``
first (not profiled), then one worker runs them in this process under the
profiler. Prints the call tree (``--html FILE`` writes the interactive one) and
the client CPU per task. ``--no-profile`` runs without pyinstrument, to be
sampled from outside instead (CPU only, native frames too)::

    py-spy record --format raw -o worker.txt -- python -m benchmarks.profile_worker \
        --url /tmp/scratch.sqlite --no-profile
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import conveyor
from benchmarks import conveyor_side as cv
from benchmarks.harness import cpu_seconds


async def drain(
    db: str,
    n: int,
    concurrency: int,
    partitions: int | None,
    profiler: Any,
    groups: int = 0,
    group: str | None = None,
) -> tuple[float, float]:
    if not group or group == "g0":
        await cv.prefill(db, n, partitions=partitions, groups=groups)
    done = asyncio.Event()
    count = 0

    app = conveyor.App(cv.url_for(db))

    @app.task(name=cv.NAME, queue=cv.QUEUE)
    async def noop(ctx: object, i: int, t: float | None = None) -> None:
        nonlocal count
        count += 1
        if count == n:
            done.set()

    async with app:
        worker = app.worker(cv.QUEUE, concurrency=concurrency, group=group)
        await app.store.open()
        profiler.start()
        started, cpu0 = time.perf_counter(), cpu_seconds()
        job = asyncio.create_task(worker.run())
        await done.wait()
        took, cpu = time.perf_counter() - started, cpu_seconds() - cpu0
        profiler.stop()
        worker.stop()
        await job
    return took, cpu


class _NoProfile:
    def start(self) -> None: ...

    def stop(self) -> None: ...


def main() -> None:
    from pyinstrument import Profiler

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="scratch Postgres URL or SQLite path")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--partitions", type=int)
    parser.add_argument(
        "--groups", type=int, default=0, help="subscribe g0..g<N-1> and queue for them only"
    )
    parser.add_argument(
        "--group", help="consume as this group (g0 prefills; others expect it done)"
    )
    parser.add_argument("--html", help="also write pyinstrument's HTML report here")
    parser.add_argument("--no-profile", action="store_true", help="run without pyinstrument")
    args = parser.parse_args()
    if not args.url.startswith("postgresql") and args.group in (None, "g0"):
        cv.setup(args.url)
    profiler: Any = _NoProfile() if args.no_profile else Profiler(async_mode="enabled")
    took, cpu = asyncio.run(
        drain(
            args.url, args.n, args.concurrency, args.partitions, profiler, args.groups, args.group
        )
    )
    if not args.no_profile:
        print(profiler.output_text(unicode=True, color=False, show_all=False))
    rate, per_task = args.n / took, cpu / args.n * 1e6
    print(f"{args.n} tasks in {took:.2f} s: {rate:,.0f}/s, {per_task:,.0f} µs CPU/task")
    if args.html and not args.no_profile:
        with open(args.html, "w") as f:
            f.write(profiler.output_html())


if __name__ == "__main__":
    main()
