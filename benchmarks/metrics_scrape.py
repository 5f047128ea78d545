"""Does scraping a worker's metrics slow it down?

    python benchmarks/metrics_scrape.py --url sqlite:///scrape.db
    python benchmarks/metrics_scrape.py --url postgresql://postgres@127.0.0.1/bench

A worker (concurrency 20) drains N no-op tasks, alternately without and with a
Prometheus scraper polling its ``--metrics-port`` endpoint every ``--interval``
seconds (worker counters plus the store's queue numbers, read on the endpoint's
own connection). Rounds alternate so load drift on the machine hits both modes
alike. It prints tasks per second per round, the medians, and how long each
scrape took. A second, aggressive interval (default 0.5 s) shows the effect
when there is one to see.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import threading
import time
import urllib.request

import conveyor
from conveyor import metrics
from conveyor.worker import Worker


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Scraper:
    """Scrapes ``url`` every ``interval`` seconds in a thread, timing each scrape."""

    def __init__(self, url: str, interval: float) -> None:
        self.url = url
        self.interval = interval
        self.took: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.perf_counter()
            with urllib.request.urlopen(self.url, timeout=30) as response:
                response.read()
            self.took.append(time.perf_counter() - started)
            self.stop.wait(self.interval)


async def drain(url: str, n: int, scrape_every: float | None) -> tuple[float, list[float]]:
    app = conveyor.App(url)
    queue = f"scrape-{time.time_ns()}"
    done = 0
    finished = asyncio.Event()

    @app.task(name="bench.noop", queue=queue)
    async def noop(ctx: object) -> None:
        nonlocal done
        done += 1
        if done == n:
            finished.set()

    for i in range(0, n, 1000):
        await app.store.submit_many([{"name": "bench.noop", "queue": queue}] * min(1000, n - i))
    server = scraper = None
    if scrape_every is not None:
        port = _free_port()
        server = metrics.serve_worker_metrics(f"127.0.0.1:{port}", url)
        scraper = Scraper(f"http://127.0.0.1:{port}/metrics", scrape_every)
    worker = Worker(app, queue, concurrency=20, poll_interval=0.05)
    started = time.perf_counter()
    if scraper is not None:
        scraper.thread.start()
    job = asyncio.create_task(worker.run())
    await finished.wait()
    while worker.held:
        await asyncio.sleep(0.005)
    elapsed = time.perf_counter() - started
    worker.stop()
    await job
    took: list[float] = []
    if scraper is not None and server is not None:
        scraper.stop.set()
        scraper.thread.join()
        server.close()
        took = scraper.took
    await app.close()
    return n / elapsed, took


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="sqlite:///scrape-bench.db")
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--aggressive", type=float, default=0.5)
    args = parser.parse_args()
    steady = f"every {args.interval:g}s"
    aggressive = f"every {args.aggressive:g}s"
    results: dict[str, list[float]] = {"off": [], steady: []}
    results[aggressive] = []
    scrapes: list[float] = []
    modes: list[tuple[str, float | None]] = [
        ("off", None),
        (steady, args.interval),
        (aggressive, args.aggressive),
    ]
    for round_ in range(args.rounds):
        # Each round starts with another mode, so a drift in the machine's load
        # does not always land on the same one.
        shift = round_ % len(modes)
        for label, every in modes[shift:] + modes[:shift]:
            rate, took = await drain(args.url, args.tasks, every)
            results[label].append(rate)
            scrapes += took
            print(f"{label:>12}: {rate:8.0f} tasks/s  ({len(took)} scrapes)", flush=True)
    summary = {label: round(statistics.median(rates)) for label, rates in results.items()}
    print(json.dumps({"median_tasks_per_s": summary}, indent=2))
    if scrapes:
        print(
            f"scrape time: median {statistics.median(scrapes) * 1000:.1f} ms, "
            f"max {max(scrapes) * 1000:.1f} ms over {len(scrapes)} scrapes"
        )


if __name__ == "__main__":
    asyncio.run(main())
