"""A child process that keeps tasks moving while a test reads ``stats()``.

    python tests/conformance/_stats_churn.py URL QUEUE ROLE SECONDS

``claim``: claims up to ten tasks at a time and hands most of them back (release),
finishing some (batch acknowledgement) and failing a few for a retry, so tasks keep
going queued -> running -> queued and now and then succeeded. ``maintain``: runs
``maintain()`` over and over, so finished rows are folded into the roll-up while
the reads go on. Prints ``ready``, waits for a line on stdin, works for SECONDS,
then prints one JSON line with how many calls it made.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time

import conveyor


async def churn(url: str, queue: str, role: str, seconds: float) -> None:
    rng = random.Random(os.getpid())
    calls = 0
    worker = f"churn-{os.getpid()}"
    async with conveyor.connect(url) as store:
        print("ready", flush=True)
        sys.stdin.readline()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            calls += 1
            if role == "maintain":
                await store.maintain()
                continue
            got = await store.claim(queue, worker_id=worker, limit=rng.randrange(1, 11))
            done = []
            for task in got:
                roll = rng.random()
                if roll < 0.15:
                    done.append({"task_id": task.id, "worker_id": worker, "attempt": task.attempt})
                elif roll < 0.25:
                    await store.fail(
                        task.id, worker_id=worker, error="again", delay=0, attempt=task.attempt
                    )
                else:
                    await store.release(task.id, worker_id=worker, attempt=task.attempt)
            if done:
                await store.ack_many(done)
    print(json.dumps({"calls": calls}), flush=True)


if __name__ == "__main__":
    url, queue, role, seconds = sys.argv[1:]
    asyncio.run(churn(url, queue, role, float(seconds)))
