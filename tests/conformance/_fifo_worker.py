"""A consumer process for the cross-process FIFO test (run by ``test_partitions.py``).

    python _fifo_worker.py URL QUEUE TOTAL LOG_PATH WORKER_NAME

Opens its store, prints ``ready`` and waits for a line on stdin (so both
processes start at once), then claims from QUEUE (queue mode) until TOTAL tasks
of the queue have succeeded. It fails about a quarter of its attempts (retryable,
short delay, and releases the rest of the batch so it comes back in order) and
writes one JSON line per event to LOG_PATH: ``done`` with (partition, seq,
claimed_at, finished_at, batch) in database-clock microseconds, ``failed``, or
``violation`` when a claim finds another running task in its stream.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import conveyor

LEASE = 30
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def us(moment: datetime | None) -> int:
    assert moment is not None
    return (moment - EPOCH) // timedelta(microseconds=1)


async def main(url: str, queue: str, total: int, log_path: str, name: str) -> int:
    rng = random.Random(name)
    batch_no = 0
    with open(log_path, "w") as log:

        def write(**record: Any) -> None:
            log.write(json.dumps({"worker": name, **record}) + "\n")
            log.flush()

        async with conveyor.connect(url) as store:
            # Start together: say we are ready, wait for the word.
            print("ready", flush=True)
            await asyncio.to_thread(sys.stdin.readline)
            deadline = time.monotonic() + 80
            while time.monotonic() < deadline:
                got = await store.claim(
                    queue, worker_id=name, limit=rng.choice([1, 2, 4]), lease=LEASE
                )
                if not got:
                    [stats] = await store.stats(queue)
                    if stats.counts["succeeded"] >= total:
                        return 0
                    await asyncio.sleep(0.02)
                    continue
                batch_no += 1
                batch = f"{name}-{batch_no}"
                part = got[0].partition
                if part is None or any(t.partition != part for t in got):
                    write(kind="violation", what="mixed", batch=batch)
                running = await store.list(status="running", queue=queue, partition=part)
                if {t.id for t in running.items} != {t.id for t in got}:
                    write(kind="violation", what="concurrent lease", batch=batch)
                failing = False
                for t in got:
                    claimed_at = us(t.lease_expires_at) - LEASE * 1_000_000
                    if failing or rng.random() < 0.25:
                        delay = 0 if failing else rng.choice([0, 0.01])
                        failing = True
                        await store.fail(
                            t.id, worker_id=name, error="random", delay=delay, attempt=t.attempt
                        )
                        write(kind="failed", partition=part, seq=t.payload["i"], batch=batch)
                        continue
                    done = await store.succeed(t.id, worker_id=name, attempt=t.attempt)
                    write(
                        kind="done",
                        partition=part,
                        seq=t.payload["i"],
                        claimed_at=claimed_at,
                        finished_at=us(done.finished_at),
                        batch=batch,
                    )
    print("deadline passed with work left", file=sys.stderr)
    return 2


if __name__ == "__main__":
    url, queue, total, log_path, name = sys.argv[1:6]
    sys.exit(asyncio.run(main(url, queue, int(total), log_path, name)))
