"""Postgres: a transaction that touches many streams recomputes them as a set, and
a partitioned submit is one pipelined transaction.

A stream's head and availability are recomputed after every change to its rows
(:func:`conveyor.store.protocol.streams.refresh`). Step by step that is three or four
statements per stream; on Postgres it is two statements however many streams: one
locks their rows in the lock order (creating the missing ones), the next, whose
snapshot then has every change committed to them meanwhile, recomputes them all.
A submit of partitioned tasks without keys or parents sends its five statements
together (:func:`conveyor.store.protocol.producer.submit`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from tests._support import finished, pg_round_trips, released, scratch_pg_database

import conveyor


@pytest.fixture
def db(pg_url: str) -> Iterator[str]:
    with scratch_pg_database("conveyor_streams") as url:
        yield url


async def _statements_of_batch(url: str, partitions: int) -> int:
    """Statements a submit_many of 200 keyed children over ``partitions`` streams
    runs (children with keys and partitions: the step-by-step submit, through
    SQLAlchemy)."""
    async with conveyor.connect(url, listen=False) as st:
        await st.subscribe("q", "g")  # every stream twice: queue mode and the group
        await st.submit_many([{"name": "t", "queue": "q", "partition": "warm"}])
        root = await st.submit("root", queue="q")
        seen: list[str] = []
        assert st._engine is not None

        def count(*args: Any) -> None:
            seen.append(args[2])

        event.listen(st._engine.sync_engine, "before_cursor_execute", count)
        await st.submit_many(
            [
                {
                    "name": "t",
                    "queue": "q",
                    "partition": f"p{i % partitions}",
                    "parent": root.id,
                    "key": f"k{partitions}-{i}",
                }
                for i in range(200)
            ]
        )
        event.remove(st._engine.sync_engine, "before_cursor_execute", count)
        return len(seen)


async def test_a_partitioned_batch_runs_as_many_statements_for_2_or_200_streams(
    db: str,
) -> None:
    """200 tasks over 1 partition or over 100 (200 streams with the group's): the
    same statements (before: three or four more per stream)."""
    one, hundred = await _statements_of_batch(db, 1), await _statements_of_batch(db, 100)
    assert one == hundred and one > 0


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


async def test_a_partitioned_submit_is_one_pipelined_transaction(db: str) -> None:
    """A single partitioned submit and a batch over 40 partitions (no keys or
    parents) each go as one transaction of five statements sent together, nothing
    through SQLAlchemy; the answering tasks are what the store then reads back."""
    async with conveyor.connect(db, listen=False) as st:
        await st.subscribe("q", "g")
        await st.submit("t", queue="q", partition="warm")
        with pg_round_trips(st) as (runs, seen):
            one = await st.submit("t", {"n": 0}, queue="q", partition="p0", priority=3)
            batch = await st.submit_many(
                [
                    {"name": "t", "queue": "q", "partition": f"p{i % 40}", "payload": {"n": i}}
                    for i in range(1, 201)
                ]
                + [{"name": "t", "queue": "q", "payload": {"n": "plain"}}]
            )
        assert runs == [5, 5] and seen == []
        for task in [one, *batch]:
            assert task == await st.get(task.id)
        assert [t.partition for t in batch[:3]] == ["p1", "p2", "p3"]
        assert batch[-1].partition is None and one.priority == 3


PRODUCER = str(Path(__file__).with_name("_producer.py"))


async def test_producers_in_two_processes_never_let_a_stream_skip_ahead(db: str) -> None:
    """Two producer processes submit into the same four partitions at once while
    this process claims: every stream is claimed in the order of its tasks as the
    store lists them (submit order), with none missing. A producer's task becomes
    claimable only after every task of its stream submitted before it, though
    their commits race: the queue-mode stream is locked before the rows are
    written, so producers of a stream commit one after another."""
    async with conveyor.connect(db, listen=False) as st:
        await st.submit("t", queue="q", partition="warm")  # the schema, before the race
        claimed: dict[str, list[str]] = {f"p{n}": [] for n in range(4)}
        argvs = [[PRODUCER, db, "q", "4", "120", name] for name in ("a", "b")]
        with released(argvs) as procs:
            deadline = time.monotonic() + 60
            while sum(map(len, claimed.values())) < 240 and time.monotonic() < deadline:
                got = await st.claim("q", worker_id="w", limit=8, per_stream=2)
                for task in got:
                    if task.partition != "warm":
                        claimed[str(task.partition)].append(task.id)
                await st.ack_many([{"task_id": t.id, "worker_id": "w"} for t in got])
                if not got:
                    await asyncio.sleep(0.002)
            finished(procs, timeout=30)
        for partition, ids in claimed.items():
            listed = [t.id for t in (await st.list(partition=partition, limit=500)).items]
            assert len(listed) == 60 and ids == listed, partition
