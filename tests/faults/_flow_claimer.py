"""A claimer process for the flow-control race tests: from START (epoch seconds,
read from stdin once it has printed ``ready``) until START + SECONDS it claims
queue QUEUE as hard as it can (LIMIT at a time), holds each task HOLD seconds,
then succeeds it; prints how many it claimed.
The test starts the clock once every process is up."""

from __future__ import annotations

import asyncio
import sys
import time

import conveyor


async def main(url: str, queue: str, seconds: float, limit: int, hold: float) -> None:
    claimed = 0
    async with conveyor.connect(url) as store:
        await store.stats(queue)  # connected and migrated
        print("ready", flush=True)
        start = float(sys.stdin.readline())
        await asyncio.sleep(max(0.0, start - time.time()))
        worker = f"w{id(store)}"
        while time.time() < start + seconds:
            tasks = await store.claim(queue, worker_id=worker, limit=limit, lease=60)
            if not tasks:
                await asyncio.sleep(0.002)
                continue
            if time.time() < start + seconds:
                claimed += len(tasks)
            if hold:
                await asyncio.sleep(hold)
            await store.succeed_many([{"task_id": t.id, "worker_id": worker} for t in tasks])
    print(claimed, flush=True)


if __name__ == "__main__":
    url, queue, seconds, limit, hold = sys.argv[1:6]
    asyncio.run(main(url, queue, float(seconds), int(limit), float(hold)))
