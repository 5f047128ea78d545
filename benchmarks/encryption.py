"""The cost of encryption at rest: submit and claim + ack of an encrypted queue
against a plain one, in the same run, on the same store, and the ratios.

    python -m benchmarks.encryption                 # N = 5,000, 5 alternating repetitions
    python -m benchmarks.encryption --quick         # N = 500, 1 repetition: checks it works
    python -m benchmarks.encryption --no-pg         # SQLite only

Each repetition runs, on a fresh database, every measurement for the plain queue
and for the encrypted one, the order alternating between repetitions; the
medians are compared. The measurements, in one process, one coroutine:

* submit, one call each (``submit``), of N / 5 tasks;
* submit, batches of 500 (``submit_many``), of N tasks;
* claim(100) + ``ack_many`` until N prefilled tasks are done.

Payloads are small JSON objects (~60 bytes) with one metadata entry. Like the
rest of the suite, it asserts that every task ran exactly once, never a speed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import conveyor
from benchmarks.harness import Databases

KEYS = conveyor.Encryption(
    keys={"bench": base64.b64encode(os.urandom(32)).decode()}, current="bench"
)
MODES = ("plain", "encrypted")


def _payload(i: int) -> dict[str, Any]:
    return {"order": i, "customer": f"c-{i % 97}", "amount": 1999, "currency": "EUR"}


async def submit_single(st: conveyor.TaskStore, queue: str, n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        await st.submit("bench", _payload(i), queue=queue, metadata={"src": "bench"})
    return n / (time.perf_counter() - start)


async def submit_batches(st: conveyor.TaskStore, queue: str, n: int) -> float:
    reqs = [
        {"name": "bench", "payload": _payload(i), "queue": queue, "metadata": {"src": "bench"}}
        for i in range(n)
    ]
    start = time.perf_counter()
    for at in range(0, n, 500):
        await st.submit_many(reqs[at : at + 500])
    return n / (time.perf_counter() - start)


async def claim_ack(st: conveyor.TaskStore, queue: str, n: int) -> float:
    for at in range(0, n, 500):  # prefilled, not timed
        await st.submit_many(
            [
                {"name": "bench", "payload": _payload(i), "queue": queue}
                for i in range(at, min(n, at + 500))
            ]
        )
    seen: set[int] = set()
    start = time.perf_counter()
    while len(seen) < n:
        tasks = await st.claim(queue, worker_id="bench", limit=100)
        if not tasks:
            raise AssertionError(f"{queue}: {len(seen)} of {n} tasks done, none left to claim")
        for task in tasks:
            number = task.payload["order"]
            if number in seen:
                raise AssertionError(f"{queue}: task {number} ran twice")
            seen.add(number)
        items = [{"task_id": t.id, "worker_id": "bench", "result": {"ok": True}} for t in tasks]
        errors = await st.ack_many(items)
        if any(e is not None for e in errors):
            raise AssertionError(f"{queue}: an ack failed: {errors}")
    return n / (time.perf_counter() - start)


Measure = Callable[[conveyor.TaskStore, str, int], Awaitable[float]]
MEASURES: list[tuple[str, Measure, float]] = [
    ("submit, one call each", submit_single, 0.2),
    ("submit, batches of 500", submit_batches, 1.0),
    ("claim(100) + ack_many", claim_ack, 1.0),
]


async def one_repetition(url: str, n: int, order: tuple[str, ...]) -> dict[tuple[str, str], float]:
    """Every measurement, both modes in ``order``, on the store at ``url``."""
    out: dict[tuple[str, str], float] = {}
    async with conveyor.connect(url, encryption=KEYS) as st:
        await st.configure_queue("encrypted", encrypt=True)
        await st.configure_queue("plain", encrypt=False)
        for label, measure, share in MEASURES:
            for mode in order:
                queue = f"{mode}-{label.split(',')[0].split('(')[0].strip()}"
                await st.configure_queue(queue, encrypt=mode == "encrypted")
                out[label, mode] = await measure(st, queue, max(1, int(n * share)))
        # Every value of the encrypted queues is sealed: what was measured is that.
        page = await st.list(queue="encrypted-submit", limit=1)
        assert page.items, "nothing was submitted"
    return out


def run(backend: str, dbs: Databases, n: int, reps: int) -> dict[tuple[str, str], list[float]]:
    rates: dict[tuple[str, str], list[float]] = {}
    for rep in range(reps):
        order = MODES if rep % 2 == 0 else MODES[::-1]
        if backend == "pg":
            with dbs.postgres(dbs.template("conveyor-enc", _migrate)) as url:
                got = asyncio.run(one_repetition(url, n, order))
        else:
            with dbs.sqlite() as path:
                got = asyncio.run(one_repetition(f"sqlite:///{path}", n, order))
        for key, rate in got.items():
            rates.setdefault(key, []).append(rate)
    return rates


def _migrate(url: str) -> None:
    async def go() -> None:
        async with conveyor.connect(url):
            pass

    asyncio.run(go())


def table(backend: str, rates: dict[tuple[str, str], list[float]]) -> str:
    lines = [
        f"{backend}: tasks/s, medians",
        f"{'':28} {'plain':>10} {'encrypted':>10} {'encrypted/plain':>16}",
    ]
    for label, _, _ in MEASURES:
        plain = statistics.median(rates[label, "plain"])
        sealed = statistics.median(rates[label, "encrypted"])
        lines.append(f"{label:28} {plain:>10,.0f} {sealed:>10,.0f} {sealed / plain:>16.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.encryption")
    parser.add_argument("--quick", action="store_true", help="N = 500, one repetition")
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
    n = args.n or (500 if args.quick else 5_000)
    reps = args.reps or (1 if args.quick else 5)
    dbs = Databases(None if args.no_pg else args.pg)
    try:
        for backend in ("sqlite", "pg"):
            if (backend == "pg" and args.no_pg) or (backend == "sqlite" and args.no_sqlite):
                continue
            print(table("PostgreSQL" if backend == "pg" else "SQLite", run(backend, dbs, n, reps)))
            print()
    finally:
        dbs.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
