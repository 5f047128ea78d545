"""``sqlite:///:memory:``: one private database on one connection, so the store
serialises its transactions in-process; concurrent callers simply queue."""

from __future__ import annotations

import asyncio

import conveyor
from conveyor import Status

MEMORY_URLS = ("sqlite:///:memory:", "sqlite://", "sqlite+aiosqlite:///:memory:")


async def test_concurrent_calls_on_an_in_memory_store() -> None:
    for url in MEMORY_URLS:
        async with conveyor.connect(url) as store:
            tasks = await asyncio.gather(*(store.submit("t", {"i": i}) for i in range(20)))
            assert len({t.id for t in tasks}) == 20

            async def consume(worker: str) -> int:
                n = 0
                while batch := await store.claim("default", worker_id=worker, limit=3):
                    for task in batch:
                        await store.succeed(task.id, worker_id=worker)
                        n += 1
                return n

            done = await asyncio.gather(*(consume(f"w{i}") for i in range(4)), store.maintain())
            assert sum(done[:4]) == 20
            stats = await store.stats()
            assert stats[0].counts["succeeded"] == 20


def test_sync_in_memory_store() -> None:
    with conveyor.connect_sync("sqlite:///:memory:") as store:
        task = store.submit("t")
        (claimed,) = store.claim("default", worker_id="w")
        assert store.succeed(claimed.id, worker_id="w").status is Status.SUCCEEDED
        assert store.get(task.id) is not None
