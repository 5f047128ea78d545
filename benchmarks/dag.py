"""Dependencies and batches end to end: a fan-out/fan-in DAG and a batch, run by
worker processes.

    python -m benchmarks.dag                  # 1,000 nodes, 3 repetitions, both backends
    python -m benchmarks.dag --quick          # 100 nodes, 1 repetition: checks it works
    python -m benchmarks.dag --no-pg          # SQLite only
    python -m benchmarks.dag worker URL LOG   # (one worker process; started by the run)

* **dag**: a root, ``N - 2`` children ``after=[root]`` (one ``submit_many``) and
  one fan-in child after all of them; timed from the root's submit to the fan-in
  finishing (the submits included: they run while the workers already work).
* **batch**: ``store.batch(on_complete=...)``, ``N - 1`` tasks submitted into it
  (one ``submit_many``), closed; timed from opening the batch to the callback
  finishing.

Two worker processes (concurrency 20 each) run the tasks, which do nothing but
append their id to a log. Every run checks that each of the N tasks ran exactly
once (the log) and that the last one ran after all the others (the fan-in's
parents all succeeded, the callback's summary counts N - 1); never a speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import conveyor
from benchmarks.harness import Databases

QUEUE = "dag"
WORKERS = 2
CONCURRENCY = 20

app = conveyor.App(os.environ.get("CONVEYOR_URL", "sqlite:///dag.db"))


def _log(ctx: conveyor.Context, extra: dict[str, Any] | None = None) -> None:
    line = json.dumps({"id": ctx.task.id, "name": ctx.task.name, **(extra or {})}) + "\n"
    fd = os.open(os.environ["DAG_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@app.task(name="node", queue=QUEUE)
async def node(ctx: conveyor.Context) -> int:
    """A node of the DAG or a task of the batch."""
    _log(ctx)
    return 1


@app.task(name="fanin", queue=QUEUE)
async def fanin(ctx: conveyor.Context) -> None:
    """The DAG's last node: counts what its parents returned."""
    results = await ctx.parent_results()
    _log(ctx, {"parents": len(results), "sum": sum(r or 0 for r in results.values())})


@app.task(name="callback", queue=QUEUE)
async def callback(ctx: conveyor.Context) -> None:
    """The batch's callback: records the summary."""
    summary = await ctx.batch_summary()
    assert summary is not None
    _log(ctx, {"succeeded": len(summary.succeeded), "total": summary.total})


def _workers(url: str, log: Path) -> list[subprocess.Popen[bytes]]:
    cmd = [sys.executable, "-m", "benchmarks.dag", "worker", url, str(log)]
    return [subprocess.Popen(cmd, stderr=subprocess.DEVNULL) for _ in range(WORKERS)]


async def _ready(store: conveyor.TaskStore) -> None:
    deadline = time.monotonic() + 60
    while len(await store.workers()) < WORKERS:
        assert time.monotonic() < deadline, "the workers did not start"
        await asyncio.sleep(0.1)


async def dag(url: str, n: int, log: Path) -> tuple[float, float]:
    """Seconds from the root's submit to the fan-in's end, and of the submits."""
    async with conveyor.connect(url) as store:
        await _ready(store)
        start = time.perf_counter()
        root = await store.submit("node", queue=QUEUE)
        kids = await store.submit_many(
            [{"name": "node", "queue": QUEUE, "after": [root]}] * (n - 2)
        )
        last = await store.submit("fanin", queue=QUEUE, after=kids)
        submitted = time.perf_counter() - start
        done = await store.wait(last.id, timeout=600)
        elapsed = time.perf_counter() - start
        assert done.status is conveyor.Status.SUCCEEDED, done
    _check(log, n, "fanin", {"parents": n - 2, "sum": n - 2})
    return elapsed, submitted


async def batch(url: str, n: int, log: Path) -> tuple[float, float]:
    """Seconds from opening the batch to its callback's end, and of the submits."""
    async with conveyor.connect(url) as store:
        await _ready(store)
        start = time.perf_counter()
        async with store.batch("callback", queue=QUEUE) as b:
            await b.submit_many([{"name": "node"}] * (n - 1))
        submitted = time.perf_counter() - start
        done = await store.wait(b.callback.id, timeout=600)
        elapsed = time.perf_counter() - start
        assert done.status is conveyor.Status.SUCCEEDED, done
    _check(log, n, "callback", {"succeeded": n - 1, "total": n - 1})
    return elapsed, submitted


def _check(log: Path, n: int, last: str, expect: dict[str, int]) -> None:
    """Each of the n tasks ran exactly once, the last one after all others, and it
    saw every other one succeed."""
    lines = [json.loads(x) for x in log.read_text().splitlines() if x]
    ids = [x["id"] for x in lines]
    assert len(ids) == n and len(set(ids)) == n, (
        f"{len(ids)} runs of {len(set(ids))} tasks, not {n}"
    )
    assert lines[-1]["name"] == last, lines[-1]
    for key, value in expect.items():
        assert lines[-1][key] == value, (key, lines[-1])


def _migrate(url: str) -> None:
    async def go() -> None:
        async with conveyor.connect(url):
            pass

    asyncio.run(go())


def measure(kind: str, url: str, n: int, scratch: Path) -> tuple[float, float]:
    log = scratch / f"{kind}-{time.monotonic_ns()}.jsonl"
    log.touch()
    workers = _workers(url, log)
    try:
        return asyncio.run((dag if kind == "dag" else batch)(url, n, log))
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(timeout=60)


def run(backend: str, dbs: Databases, n: int, reps: int) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {"dag": [], "batch": []}
    scratch = Path(dbs.scratch)
    for _ in range(reps):
        for kind in out:
            if backend == "pg":
                with dbs.postgres(dbs.template("conveyor-dag", _migrate)) as url:
                    out[kind].append(measure(kind, url, n, scratch))
            else:
                with dbs.sqlite() as path:
                    out[kind].append(measure(kind, f"sqlite:///{path}", n, scratch))
    return out


def table(backend: str, n: int, got: dict[str, list[tuple[float, float]]]) -> str:
    lines = [
        f"{backend}: {n} tasks, {WORKERS} worker processes x {CONCURRENCY}; medians",
        f"{'':8} {'total s':>9} {'submits s':>10} {'tasks/s':>9}",
    ]
    for kind, runs in got.items():
        total = statistics.median(r[0] for r in runs)
        sub = statistics.median(r[1] for r in runs)
        lines.append(f"{kind:8} {total:9.2f} {sub:10.2f} {n / total:9.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        os.environ["DAG_LOG"] = argv[2]
        app.run_worker(QUEUE, concurrency=CONCURRENCY, url=argv[1], maintain_interval=None)
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dag")
    parser.add_argument("--quick", action="store_true", help="100 nodes, one repetition")
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument(
        "--pg",
        default=os.environ.get(
            "CONVEYOR_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    parser.add_argument("--no-pg", action="store_true")
    parser.add_argument("--no-sqlite", action="store_true")
    args = parser.parse_args(argv)
    n = args.n or (100 if args.quick else 1_000)
    reps = args.reps or (1 if args.quick else 3)
    dbs = Databases(None if args.no_pg else args.pg)
    try:
        for backend in ("sqlite", "pg"):
            if (backend == "pg" and args.no_pg) or (backend == "sqlite" and args.no_sqlite):
                continue
            name = "PostgreSQL" if backend == "pg" else "SQLite"
            print(table(name, n, run(backend, dbs, n, reps)), flush=True)
            print()
    finally:
        dbs.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
