"""A producer process for the max_depth race test: submits TASKS tasks to queue
``capped`` one by one (every other one with a key, every third in a partition) and
prints how many were accepted and how many refused with QueueFull."""

from __future__ import annotations

import asyncio
import sys

import conveyor

TASKS = 30


async def main(url: str, name: str) -> None:
    accepted = refused = 0
    async with conveyor.connect(url) as store:
        for i in range(TASKS):
            try:
                await store.submit(
                    "t",
                    i,
                    queue="capped",
                    key=f"{name}-{i}" if i % 2 else None,
                    partition=f"p{i % 3}" if i % 3 == 0 else None,
                )
            except conveyor.QueueFull:
                refused += 1
            else:
                accepted += 1
    print(accepted, refused)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
