"""Partitions: strict FIFO streams per (queue, partition), for queue mode and each group.

Every test runs on SQLite and PostgreSQL (the ``store`` / ``store_url`` fixtures).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import conveyor
from _support import finished, released
from conveyor import Status, TaskCancelled
from conveyor.models import Task
from conveyor.store.base import TaskStore

Q = "orders"
WORKER_SCRIPT = str(Path(__file__).with_name("_fifo_worker.py"))


def ids(tasks: list[Task]) -> list[str]:
    return [t.id for t in tasks]


async def submit_stream(store: TaskStore, partition: str, n: int, **kw: Any) -> list[Task]:
    return [
        await store.submit("step", {"p": partition, "i": i}, queue=Q, partition=partition, **kw)
        for i in range(n)
    ]


# ------------------------------------------------------------ semantics


async def test_a_claim_returns_one_stream_in_submit_order(store: TaskStore) -> None:
    order = ["a", "b", "a", "b", None, "a", "b", None]
    submitted = [
        await store.submit("step", {"n": n}, queue=Q, partition=p) for n, p in enumerate(order)
    ]
    seen: list[str] = []
    while got := await store.claim(Q, worker_id="w", limit=10):
        parts = {t.partition for t in got}
        assert len(parts) == 1, f"one claim mixed streams: {parts}"
        (part,) = parts
        expected = [t.id for t in submitted if t.partition == part]
        if part is None:
            assert sorted(ids(got)) == sorted(expected)
        else:
            assert ids(got) == expected  # the whole ready stream, in order
        seen += ids(got)
    assert sorted(seen) == sorted(ids(submitted))


async def test_limit_leases_consecutive_ready_tasks_and_stops_at_a_delayed_one(
    store: TaskStore,
) -> None:
    t1, t2 = await submit_stream(store, "p", 2)
    t3 = await store.submit("step", queue=Q, partition="p", delay=60)
    t4 = await store.submit("step", queue=Q, partition="p")
    got = await store.claim(Q, worker_id="w", limit=10)
    assert ids(got) == [t1.id, t2.id] and all(t.worker_id == "w" for t in got)
    assert await store.claim(Q, worker_id="x", partition="p", limit=10) == []
    for t in got:
        await store.succeed(t.id, worker_id="w")
    # The head is waiting for its run_at: the task behind it waits too.
    assert await store.claim(Q, worker_id="x", limit=10) == []
    assert await store.claim(Q, worker_id="x", partition="p") == []
    store.clock_offset = 61
    assert ids(await store.claim(Q, worker_id="x", limit=10)) == [t3.id, t4.id]


async def test_a_leased_head_holds_its_stream(store: TaskStore) -> None:
    t1, t2, _ = await submit_stream(store, "p", 3)
    assert ids(await store.claim(Q, worker_id="w1")) == [t1.id]
    for worker in ("w1", "w2", "w3"):
        assert await store.claim(Q, worker_id=worker, limit=5) == []
        assert await store.claim(Q, worker_id=worker, partition="p", limit=5) == []
    # Other work is still served meanwhile.
    plain = await store.submit("plain", queue=Q)
    other = await store.submit("step", queue=Q, partition="other")
    got = ids(await store.claim(Q, worker_id="w2")) + ids(await store.claim(Q, worker_id="w3"))
    assert sorted(got) == sorted([plain.id, other.id])
    assert await store.claim(Q, worker_id="w4") == []
    await store.succeed(t1.id, worker_id="w1")
    assert ids(await store.claim(Q, worker_id="w4")) == [t2.id]


async def test_a_head_waiting_for_its_retry_holds_its_stream(store: TaskStore) -> None:
    t1, t2 = await submit_stream(store, "p", 2)
    [c] = await store.claim(Q, worker_id="w")
    await store.fail(c.id, worker_id="w", error="later", delay=30)
    assert await store.claim(Q, worker_id="w", limit=5) == []
    assert await store.claim(Q, worker_id="w", partition="p", limit=5) == []
    store.clock_offset = 31
    [again] = await store.claim(Q, worker_id="w")
    assert again.id == t1.id and again.attempt == 2
    await store.succeed(t1.id, worker_id="w")
    assert ids(await store.claim(Q, worker_id="w")) == [t2.id]


async def test_retry_with_backoff_holds_the_stream_too(store: TaskStore) -> None:
    t1, t2 = await submit_stream(store, "p", 2, backoff=5)
    [c] = await store.claim(Q, worker_id="w")
    waiting = await store.fail(c.id, worker_id="w", error="later")  # backoff: 5 s
    assert waiting.status is Status.QUEUED
    assert await store.claim(Q, worker_id="w") == []
    store.clock_offset = 6
    assert ids(await store.claim(Q, worker_id="w", limit=5)) == [t1.id, t2.id]


async def test_a_batch_failing_midway_is_redelivered_in_order(store: TaskStore) -> None:
    t1, t2, t3 = await submit_stream(store, "p", 3)
    got = await store.claim(Q, worker_id="w", limit=3)
    assert ids(got) == [t1.id, t2.id, t3.id]
    await store.succeed(t1.id, worker_id="w")
    await store.fail(t2.id, worker_id="w", error="x", delay=0)
    # t3 is still leased: the stream stays held, even though its head (t2) is ready.
    assert await store.claim(Q, worker_id="v", limit=5) == []
    await store.fail(t3.id, worker_id="w", error="released", delay=0)
    again = await store.claim(Q, worker_id="v", limit=5)
    assert ids(again) == [t2.id, t3.id] and [t.attempt for t in again] == [2, 2]


@pytest.mark.parametrize("how", ["not_retryable", "no_attempts_left"])
async def test_a_head_failed_for_good_lets_the_stream_move_on(store: TaskStore, how: str) -> None:
    t1, t2 = await submit_stream(store, "p", 2, max_attempts=1)
    [c] = await store.claim(Q, worker_id="w")
    done = await store.fail(c.id, worker_id="w", error="boom", retryable=how == "no_attempts_left")
    assert done.status is Status.FAILED
    assert ids(await store.claim(Q, worker_id="w")) == [t2.id]
    # Retrying the failed task puts it back; it waits for the current holder.
    await store.retry(t1.id)
    assert await store.claim(Q, worker_id="v") == []
    await store.succeed(t2.id, worker_id="w")
    assert ids(await store.claim(Q, worker_id="v")) == [t1.id]


async def test_a_cancelled_head_lets_the_stream_move_on(store: TaskStore) -> None:
    t1, t2, t3 = await submit_stream(store, "p", 3)
    await store.cancel(t1.id)  # queued head
    [c] = await store.claim(Q, worker_id="w")
    assert c.id == t2.id
    await store.cancel(t2.id)  # running head
    assert ids(await store.claim(Q, worker_id="v")) == [t3.id]
    with pytest.raises(TaskCancelled):
        await store.succeed(t2.id, worker_id="w")


async def test_an_expired_head_is_redelivered_before_later_tasks(store: TaskStore) -> None:
    t1, _ = await submit_stream(store, "p", 2)
    await store.claim(Q, worker_id="w", lease=5)
    store.clock_offset = 10
    [again] = await store.claim(Q, worker_id="v", lease=5)
    assert again.id == t1.id and again.attempt == 2


async def test_claim_with_partition_takes_that_stream_only(store: TaskStore) -> None:
    a = await submit_stream(store, "a", 2)
    b = await submit_stream(store, "b", 2)
    await store.submit("plain", queue=Q)
    assert await store.claim(Q, worker_id="w", partition="zzz") == []
    assert ids(await store.claim(Q, worker_id="w", partition="b", limit=10)) == ids(b)
    assert await store.claim(Q, worker_id="w", partition="b") == []
    # Without partition=, the others are still there.
    assert ids(await store.claim(Q, worker_id="w", limit=10)) == ids(a)


async def test_unpartitioned_tasks_are_claimed_in_parallel(store: TaskStore) -> None:
    plain = [await store.submit("plain", {"n": n}, queue=Q) for n in range(3)]
    got = [await store.claim(Q, worker_id=f"w{n}") for n in range(3)]
    assert [ids(g) for g in got] == [[t.id] for t in plain]
    assert all(t.status is Status.RUNNING for g in got for t in g)


async def test_submit_order_beats_priority_inside_a_stream(store: TaskStore) -> None:
    low = await store.submit("step", queue=Q, partition="p", priority=0)
    high = await store.submit("step", queue=Q, partition="p", priority=10)
    assert ids(await store.claim(Q, worker_id="w")) == [low.id]
    await store.succeed(low.id, worker_id="w")
    assert ids(await store.claim(Q, worker_id="w")) == [high.id]


async def test_same_partition_name_in_two_queues_is_two_streams(store: TaskStore) -> None:
    t1 = await store.submit("step", queue="q1", partition="p")
    t2 = await store.submit("step", queue="q2", partition="p")
    assert ids(await store.claim("q1", worker_id="w")) == [t1.id]
    assert ids(await store.claim("q2", worker_id="w")) == [t2.id]


async def test_streams_are_separate_for_queue_mode_and_each_group(store: TaskStore) -> None:
    await store.subscribe(Q, "g")
    await store.subscribe(Q, "h")
    t1, t2 = await submit_stream(store, "p", 2)
    assert ids(await store.claim(Q, worker_id="q")) == [t1.id]  # queue mode holds p
    assert ids(await store.claim(Q, worker_id="g", group="g")) == [t1.id]
    await store.succeed(t1.id, worker_id="g", group="g")
    assert ids(await store.claim(Q, worker_id="g", group="g", partition="p")) == [t2.id]
    # queue mode and h are where they were.
    assert await store.claim(Q, worker_id="q2") == []
    assert ids(await store.claim(Q, worker_id="h", group="h", limit=5)) == [t1.id, t2.id]
    # A late group replays the stream from its head, in order, too.
    late = await store.claim(Q, worker_id="late", group="late", limit=5, subscribe="all")
    assert ids(late) == [t1.id, t2.id]


async def test_group_subscribed_with_new_starts_the_stream_later(store: TaskStore) -> None:
    await submit_stream(store, "p", 2)
    await store.subscribe(Q, "n", start="new")
    [t3] = await submit_stream(store, "p", 1)
    assert ids(await store.claim(Q, worker_id="w", group="n", limit=5)) == [t3.id]


# ------------------------------------------------------------- fairness


@pytest.mark.parametrize("limit", [1, 50])
async def test_a_busy_partition_does_not_starve_a_small_one(store: TaskStore, limit: int) -> None:
    await store.submit_many(
        [{"name": "bulk", "payload": i, "queue": Q, "partition": "big"} for i in range(1000)]
    )
    small = await store.submit("one", queue=Q, partition="small")
    plain = await store.submit("plain", queue=Q)
    served: list[set[str | None]] = []
    for _ in range(3):
        got = await store.claim(Q, worker_id="w", limit=limit)
        served.append({t.partition for t in got})
        for t in got:
            await store.succeed(t.id, worker_id="w")
    assert {"small"} in served, served
    assert {None} in served, served
    assert (await store.get(small.id)).status is Status.SUCCEEDED  # type: ignore[union-attr]
    assert (await store.get(plain.id)).status is Status.SUCCEEDED  # type: ignore[union-attr]


async def test_a_late_small_partition_is_served_promptly(store: TaskStore) -> None:
    await store.submit_many(
        [{"name": "bulk", "payload": i, "queue": Q, "partition": "big"} for i in range(1000)]
    )
    for _ in range(20):  # the big stream is being worked on
        [t] = await store.claim(Q, worker_id="w")
        await store.succeed(t.id, worker_id="w")
    small = await store.submit("one", queue=Q, partition="small")
    for _ in range(3):
        [t] = await store.claim(Q, worker_id="w")
        await store.succeed(t.id, worker_id="w")
        if t.id == small.id:
            break
    else:
        pytest.fail("the small partition was not served within 3 claims")


async def test_busy_partitions_take_turns(store: TaskStore) -> None:
    await store.submit_many(
        [
            {"name": "bulk", "payload": i, "queue": Q, "partition": p}
            for i in range(100)
            for p in ("x", "y", "z")
        ]
    )
    turns = []
    for _ in range(30):
        [t] = await store.claim(Q, worker_id="w")
        turns.append(t.partition)
        await store.succeed(t.id, worker_id="w")
    for start in range(0, 30, 3):
        assert set(turns[start : start + 3]) == {"x", "y", "z"}, turns


# ----------------------------------------------- strict FIFO under load


class FifoRecorder:
    """What concurrent consumers saw: completions with their times, and any violation."""

    def __init__(self) -> None:
        self.done: dict[tuple[str | None, str], list[tuple[int, int]]] = defaultdict(list)
        self.violations: list[str] = []
        self.holding: set[tuple[str | None, str]] = set()
        self.claims = 0
        self.failures = 0


async def fifo_consumer(
    store: TaskStore,
    rec: FifoRecorder,
    worker: str,
    group: str | None,
    total: int,
    rng: random.Random,
    deadline: float,
) -> None:
    """Claim, check the stream is ours alone, randomly fail (retryable), else succeed."""
    while sum(len(v) for k, v in rec.done.items() if k[0] == group) < total:
        if time.monotonic() > deadline:
            rec.violations.append(f"{worker}: deadline passed with work left")
            return
        got = await store.claim(Q, worker_id=worker, group=group, limit=rng.choice([1, 3]))
        if not got:
            await asyncio.sleep(0.02)  # every stream is held or waiting: let holders run
            continue
        rec.claims += 1
        parts = {t.partition for t in got}
        if len(parts) != 1 or None in parts:
            rec.violations.append(f"{worker}: claim mixed streams {parts}")
        part = str(got[0].partition)
        key = (group, part)
        if key in rec.holding:
            rec.violations.append(f"{worker}: {key} leased twice at once")
        rec.holding.add(key)
        running = await store.list(status="running", queue=Q, partition=part, group=group)
        if {t.id for t in running.items} != {t.id for t in got}:
            rec.violations.append(f"{worker}: other running tasks in {key}")
        failed_at: int | None = None
        for n, t in enumerate(got):
            if n == len(got) - 1:
                rec.holding.discard(key)  # before the last ack commits
            if failed_at is None and rng.random() < 0.25:
                failed_at = n
            if failed_at is not None:  # fail the rest too, so they come back in order
                rec.failures += 1
                delay = rng.choice([0, 0.005, 0.02]) if n == failed_at else 0
                await store.fail(
                    t.id, worker_id=worker, group=group, error="random", delay=delay,
                    attempt=t.attempt,
                )  # fmt: skip
                continue
            done = await store.succeed(t.id, worker_id=worker, group=group, attempt=t.attempt)
            assert done.finished_at is not None
            rec.done[key].append((int(done.finished_at.timestamp() * 1_000_000), t.payload["i"]))


def interleaved_streams(parts: int, per: int) -> list[dict[str, Any]]:
    """Requests for ``parts`` streams of ``per`` steps each, interleaved (step i of
    every stream before step i + 1 of any), with attempts to spare for failures."""
    return [
        {
            "name": "step",
            "payload": {"p": p, "i": i},
            "queue": Q,
            "partition": f"p{p}",
            "max_attempts": 1000,
        }
        for i in range(per)
        for p in range(parts)
    ]


def assert_fifo(rec: FifoRecorder, groups: list[str | None], parts: int, per: int) -> None:
    assert rec.violations == []
    for group in groups:
        for p in range(parts):
            log = rec.done[(group, f"p{p}")]
            in_time_order = [i for _, i in sorted(log)]
            assert in_time_order == list(range(per)), (group, p, in_time_order)
            assert [i for _, i in log] == list(range(per))


async def test_strict_fifo_with_concurrent_consumers_and_random_failures(
    store: TaskStore,
) -> None:
    parts, per, consumers = 10, 15, 8
    rng = random.Random(20240601)
    await store.subscribe(Q, "g")
    await store.submit_many(interleaved_streams(parts, per))
    rec = FifoRecorder()
    deadline = time.monotonic() + 90
    total = parts * per
    await asyncio.gather(
        *(
            fifo_consumer(store, rec, f"{g}-{n}", g, total, random.Random(rng.random()), deadline)
            for g in (None, "g")
            for n in range(consumers)
        )
    )
    assert rec.failures > 10  # the retries really happened
    assert_fifo(rec, [None, "g"], parts, per)
    stats = (await store.stats(Q))[0]
    assert stats.counts["succeeded"] == total and stats.groups["g"].lag == 0


async def test_strict_fifo_while_producers_keep_submitting(store: TaskStore) -> None:
    """Submits, claims and acks of one stream race each other; nothing gets stuck."""
    parts, per, consumers, producers = 6, 8, 8, 3
    rng = random.Random(7)
    await store.subscribe(Q, "g")
    rec = FifoRecorder()
    deadline = time.monotonic() + 60
    total = parts * per

    async def produce(k: int) -> None:
        mine = [p for p in range(parts) if p % producers == k]
        for i in range(per):
            for p in mine:
                await store.submit(
                    "step", {"p": p, "i": i}, queue=Q, partition=f"p{p}", max_attempts=1000
                )
            await asyncio.sleep(rng.random() * 0.003)

    await asyncio.gather(
        *(produce(k) for k in range(producers)),
        *(
            fifo_consumer(store, rec, f"{g}-{n}", g, total, random.Random(rng.random()), deadline)
            for g in (None, "g")
            for n in range(consumers // 2)
        ),
    )
    assert_fifo(rec, [None, "g"], parts, per)


def test_strict_fifo_across_two_processes(store_url: str, tmp_path: Path) -> None:
    """Two OS processes consume one queue's streams; completion order is submit order."""
    parts, per = 6, 12
    with conveyor.connect_sync(store_url) as store:
        store.submit_many(interleaved_streams(parts, per))
    logs = [tmp_path / f"worker{n}.jsonl" for n in range(2)]
    argvs = [
        [WORKER_SCRIPT, store_url, Q, str(parts * per), str(log), str(n)]
        for n, log in enumerate(logs)
    ]
    # Both have opened their store, and start at the same moment.
    with released(argvs, timeout=100) as procs:
        finished(procs, timeout=100)
    records = [json.loads(line) for log in logs for line in log.read_text().splitlines()]
    violations = [r for r in records if r["kind"] == "violation"]
    assert violations == []
    done = [r for r in records if r["kind"] == "done"]
    by_worker = {r["worker"] for r in done}
    assert by_worker == {"0", "1"}, "both processes must have done work"
    assert sum(r["kind"] == "failed" for r in records) > 5
    per_part: dict[str, list[tuple[int, int, int, str]]] = defaultdict(list)
    for r in done:
        per_part[r["partition"]].append((r["finished_at"], r["claimed_at"], r["seq"], r["batch"]))
    assert sorted(per_part) == [f"p{p}" for p in range(parts)]
    for part, log in per_part.items():
        log.sort()
        assert [seq for _, _, seq, _ in log] == list(range(per)), part
        # A stream's next batch is leased only after the previous one finished.
        for prev, nxt in itertools.pairwise(log):
            if prev[3] != nxt[3]:
                assert nxt[1] > prev[0], (part, prev, nxt)


async def test_priority_orders_streams_and_unpartitioned_work(store: TaskStore) -> None:
    old_plain = await store.submit("plain", queue=Q, priority=0)
    old_stream = await store.submit("step", queue=Q, partition="low", priority=0)
    urgent = await store.submit("step", queue=Q, partition="high", priority=5)
    urgent_plain = await store.submit("plain", queue=Q, priority=9)
    order = []
    while got := await store.claim(Q, worker_id="w"):
        order += ids(got)
        await store.succeed(got[0].id, worker_id="w")
    assert order[:2] == [urgent_plain.id, urgent.id]
    assert sorted(order[2:]) == sorted([old_plain.id, old_stream.id])
