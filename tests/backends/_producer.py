"""A producer process for the cross-process partition test (``test_pg_streams.py``).

    python _producer.py URL QUEUE PARTITIONS COUNT NAME

Opens its store, prints ``ready``, waits for a line on stdin (so the producers
start at once), then submits COUNT tasks one call each, round-robin over
PARTITIONS partitions, some of them in batches of three, and exits.
"""

from __future__ import annotations

import asyncio
import sys

import conveyor


async def main(url: str, queue: str, partitions: int, count: int, name: str) -> None:
    # Two kept connections at most: the suite runs beside other tests on one server.
    async with conveyor.connect(url, listen=False, direct_connections=2) as store:
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        i = 0
        while i < count:
            if i % 4 == 3 and i + 3 <= count:
                await store.submit_many(
                    [
                        {
                            "name": "t",
                            "queue": queue,
                            "partition": f"p{n % partitions}",
                            "payload": {"w": name, "i": n},
                        }
                        for n in range(i, i + 3)
                    ]
                )
                i += 3
            else:
                await store.submit(
                    "t", {"w": name, "i": i}, queue=queue, partition=f"p{i % partitions}"
                )
                i += 1


if __name__ == "__main__":
    url, queue, partitions, count, name = sys.argv[1:6]
    asyncio.run(main(url, queue, int(partitions), int(count), name))
