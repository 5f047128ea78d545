"""The child processes of the seek race test (``test_seek_race.py``).

    python _seek_procs.py producer URL QUEUE NAME COUNT
    python _seek_procs.py claimer URL QUEUE GROUP LOG_PATH STOP_PATH

Each opens its store, prints ``ready`` and waits for a line on stdin (so all
start at once). A producer submits COUNT tasks one at a time, a quarter of them
unpartitioned and the rest spread over partitions p0..p2 (p2's due two seconds
later), pausing a little between them. The claimer claims for GROUP (1, 2 or 4
at a time), acknowledges each task (after a few milliseconds' work) fenced by
its attempt, and writes one JSON line per delivery to LOG_PATH, in claim order:
the task, its partition, the attempt and when it was claimed and finished
(database-clock microseconds); it exits once STOP_PATH exists and nothing is
left to claim.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from datetime import UTC, datetime, timedelta

import conveyor

LEASE = 60
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
PARTS = [None, "p0", "p1", "p2"]


def us(moment: datetime | None) -> int:
    assert moment is not None
    return (moment - EPOCH) // timedelta(microseconds=1)


def handshake() -> None:
    print("ready", flush=True)
    sys.stdin.readline()


async def produce(url: str, queue: str, name: str, count: int) -> int:
    rng = random.Random(name)
    async with conveyor.connect(url) as store:
        handshake()
        for i in range(count):
            part = PARTS[i % len(PARTS)]
            # p2 runs two seconds late: a backlog that a seek finds still queued.
            delay = 2.0 if part == "p2" else None
            await store.submit(
                "job", {"producer": name, "i": i}, queue=queue, partition=part, delay=delay
            )
            await asyncio.sleep(rng.choice([0.0, 0.005, 0.01]))
    return 0


async def claim(url: str, queue: str, group: str, log_path: str, stop_path: str) -> int:
    rng = random.Random(group)
    deadline = time.monotonic() + 150
    with open(log_path, "w") as log:
        async with conveyor.connect(url) as store:
            handshake()
            while time.monotonic() < deadline:
                limit = rng.choice([1, 2, 4])
                got = await store.claim(
                    queue, worker_id="claimer", group=group, limit=limit, lease=LEASE
                )
                if not got:
                    if os.path.exists(stop_path):
                        return 0
                    await asyncio.sleep(0.01)
                    continue
                for t in got:
                    # A little work: the claimer lags the producers, so a backlog
                    # waits when the seek comes, and deliveries are in flight.
                    await asyncio.sleep(0.004)
                    done = await store.succeed(
                        t.id, worker_id="claimer", group=group, attempt=t.attempt
                    )
                    record = {
                        "id": t.id,
                        "partition": t.partition,
                        "attempt": t.attempt,
                        "claimed_at": us(t.lease_expires_at) - LEASE * 1_000_000,
                        "finished_at": us(done.finished_at),
                    }
                    log.write(json.dumps(record) + "\n")
                    log.flush()
    print("deadline passed with work left", file=sys.stderr)
    return 2


if __name__ == "__main__":
    role, *args = sys.argv[1:]
    if role == "producer":
        url, queue, name, count = args
        sys.exit(asyncio.run(produce(url, queue, name, int(count))))
    url, queue, group, log_path, stop_path = args
    sys.exit(asyncio.run(claim(url, queue, group, log_path, stop_path)))
