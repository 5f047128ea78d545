"""Postgres: a transaction that touches many streams recomputes them as a set.

A stream's head and availability are recomputed after every change to its rows
(:func:`conveyor.store.streams.refresh`). Step by step that is three or four
statements per stream; on Postgres it is two statements however many streams: one
locks their rows in the lock order (creating the missing ones), the next, whose
snapshot then has every change committed to them meanwhile, recomputes them all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event
from tests._support import scratch_pg_database

import conveyor


@pytest.fixture
def db(pg_url: str) -> Iterator[str]:
    with scratch_pg_database("conveyor_streams") as url:
        yield url


async def _statements_of_batch(url: str, partitions: int) -> int:
    """Statements a submit_many of 200 tasks over ``partitions`` streams runs."""
    async with conveyor.connect(url, listen=False) as st:
        await st.subscribe("q", "g")  # every stream twice: queue mode and the group
        await st.submit_many([{"name": "t", "queue": "q", "partition": "warm"}])
        seen: list[str] = []
        assert st._engine is not None

        def count(*args: Any) -> None:
            seen.append(args[2])

        event.listen(st._engine.sync_engine, "before_cursor_execute", count)
        await st.submit_many(
            [{"name": "t", "queue": "q", "partition": f"p{i % partitions}"} for i in range(200)]
        )
        event.remove(st._engine.sync_engine, "before_cursor_execute", count)
        return len(seen)


async def test_a_partitioned_batch_runs_as_many_statements_for_2_or_200_streams(
    db: str,
) -> None:
    """200 tasks over 1 partition or over 100 (200 streams with the group's): the
    same statements (before: three or four more per stream)."""
    assert await _statements_of_batch(db, 1) == await _statements_of_batch(db, 100)


async def test_streams_recomputed_as_a_set_keep_each_partition_in_order(db: str) -> None:
    """After one batch over 50 partitions, each partition's tasks are claimed in
    submit order, one stream at a time, for queue mode and for a group alike; a
    stream whose head is leased is held until it is acknowledged."""
    async with conveyor.connect(db, listen=False) as st:
        await st.subscribe("q", "g")
        tasks = await st.submit_many(
            [
                {"name": "t", "queue": "q", "partition": f"p{i % 50}", "payload": i}
                for i in range(150)
            ]
        )
        by_partition = {f"p{n}": [t.id for t in tasks if t.payload % 50 == n] for n in range(50)}
        for group in (None, "g"):
            seen: dict[str, list[str]] = {p: [] for p in by_partition}
            while True:
                got = await st.claim("q", worker_id="w", group=group, limit=100, per_stream=1)
                if not got:
                    break
                # One task per stream per claim: the others wait for their head.
                assert len({t.partition for t in got}) == len(got)
                for t in got:
                    seen[str(t.partition)].append(t.id)
                await st.ack_many(
                    [{"task_id": t.id, "worker_id": "w", "group": group} for t in got]
                )
            assert seen == by_partition
