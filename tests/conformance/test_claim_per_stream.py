"""claim(per_stream=): one claim takes at most that many tasks from each of several
streams, each stream's tasks together and in order, until the limit is used up."""

from __future__ import annotations

import asyncio
import itertools

import pytest

import conveyor
from conveyor import InvalidArgument, Status
from conveyor.store.base import TaskStore


async def _streams(store: TaskStore, streams: int, each: int) -> None:
    for i in range(each):
        for s in range(streams):
            await store.submit("t", {"s": s, "i": i}, queue="q", partition=f"p{s}")


async def test_one_claim_takes_several_streams_capped_each(store: TaskStore) -> None:
    await _streams(store, streams=4, each=3)
    got = await store.claim("q", worker_id="w", limit=6, per_stream=2)
    assert len(got) == 6
    runs = [
        (p, [t.payload["i"] for t in run])
        for p, run in itertools.groupby(got, key=lambda t: t.partition)
    ]
    # Three streams, two tasks each, in submit order; no stream split across the claim.
    assert [len(r) for _, r in runs] == [2, 2, 2]
    assert all(order == [0, 1] for _, order in runs)
    assert len({p for p, _ in runs}) == 3
    # A stream with tasks leased gives nothing more; the fourth stream is still free.
    more = await store.claim("q", worker_id="w", limit=10, per_stream=2)
    assert {t.partition for t in more} == {p for p in ("p0", "p1", "p2", "p3")} - {
        p for p, _ in runs
    }
    assert [t.payload["i"] for t in more] == [0, 1]


async def test_without_per_stream_a_claim_takes_one_stream(store: TaskStore) -> None:
    await _streams(store, streams=3, each=3)
    got = await store.claim("q", worker_id="w", limit=6)
    assert len({t.partition for t in got}) == 1 and len(got) == 3


async def test_streams_and_unpartitioned_work_share_the_limit(store: TaskStore) -> None:
    await _streams(store, streams=2, each=2)
    for i in range(3):
        await store.submit("plain", {"i": i}, queue="q")
    got = await store.claim("q", worker_id="w", limit=10, per_stream=1)
    # Everything claimable: one head per stream (their next tasks wait behind a
    # leased head) and all unpartitioned work.
    assert sorted(t.partition or "-" for t in got) == ["-", "-", "-", "p0", "p1"]
    assert all(t.status is Status.RUNNING for t in got)
    assert await store.claim("q", worker_id="w", limit=10, per_stream=1) == []


async def test_a_named_partition_is_capped_too(store: TaskStore) -> None:
    await _streams(store, streams=2, each=4)
    got = await store.claim("q", worker_id="w", limit=10, partition="p1", per_stream=3)
    assert [(t.partition, t.payload["i"]) for t in got] == [("p1", 0), ("p1", 1), ("p1", 2)]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
async def test_per_stream_must_be_a_positive_integer(store: TaskStore, bad: object) -> None:
    await store.submit("t", queue="q", partition="p")
    with pytest.raises(InvalidArgument, match="per_stream"):
        await store.claim("q", worker_id="w", per_stream=bad)  # type: ignore[arg-type]
    [task] = await store.claim("q", worker_id="w")  # nothing was claimed by the bad call
    assert task.attempt == 1


async def test_claim_order_holds_across_streams_and_unpartitioned_work(store: TaskStore) -> None:
    # Older low-priority plain work, a stream whose head has a middle priority, and
    # newer high-priority plain work: a claim of two takes by priority, whatever
    # the kind, rather than filling up with plain work once plain work leads.
    low = await store.submit("plain", {"i": "low"}, queue="q", priority=0)
    head = await store.submit("s", {"i": 0}, queue="q", priority=3, partition="p")
    high = await store.submit("plain", {"i": "high"}, queue="q", priority=5)
    got = await store.claim("q", worker_id="w", limit=2, per_stream=1)
    assert [t.id for t in got] == [high.id, head.id]
    rest = await store.claim("q", worker_id="w", limit=2, per_stream=1)
    assert [t.id for t in rest] == [low.id]


async def test_concurrent_stores_claiming_many_streams_keep_each_in_order(
    store: TaskStore, store_url: str
) -> None:
    """Four stores (their own connections) claim heads of many streams at once and
    acknowledge in batches: no stream ever has two holders, each runs in order."""
    streams, each = 12, 6
    await store.submit_many(
        [
            {"name": "t", "payload": {"i": i}, "queue": "q", "partition": f"p{s}"}
            for i in range(each)
            for s in range(streams)
        ]
        + [{"name": "plain", "payload": {"i": i}, "queue": "q"} for i in range(20)]
    )
    holders: dict[str, str] = {}
    finished: dict[str, list[int]] = {}
    violations: list[str] = []

    async def consume(name: str) -> None:
        async with conveyor.connect(store_url) as mine:
            idle = 0
            while idle < 5:
                got = await mine.claim("q", worker_id=name, limit=5, per_stream=2)
                if not got:
                    idle += 1
                    await asyncio.sleep(0.02)
                    continue
                idle = 0
                for part in {t.partition for t in got if t.partition}:
                    if part in holders:
                        violations.append(f"{part} held by {holders[part]} and {name}")
                    holders[part] = name
                await asyncio.sleep(0)  # let the others claim meanwhile
                for part in {t.partition for t in got if t.partition}:
                    del holders[part]
                    finished.setdefault(part, []).extend(
                        t.payload["i"] for t in got if t.partition == part
                    )
                outcomes = await mine.ack_many(
                    [{"task_id": t.id, "worker_id": name, "attempt": t.attempt} for t in got]
                )
                assert outcomes == [None] * len(got)

    await asyncio.gather(*(consume(f"w{n}") for n in range(4)))
    assert violations == []
    assert finished == {f"p{s}": list(range(each)) for s in range(streams)}
    [stats] = await store.stats("q")
    assert stats.counts.get("succeeded") == streams * each + 20
