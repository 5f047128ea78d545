"""Concurrent claimers: every task delivered once, no two live leases on one task
(SPEC §3.1, §3.2), with asyncio claimers in one process and with several processes."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from typing import Any

from _support import abandons, run_together
from conveyor import LostLease, Status
from conveyor.store.base import TaskStore

TASKS = 300
CLAIMERS = 8


async def test_asyncio_claimers_take_each_task_exactly_once(store: TaskStore) -> None:
    submitted = await store.submit_many(
        [{"name": "job", "queue": "q", "payload": i} for i in range(TASKS)]
    )
    claims: list[tuple[str, int]] = []
    per_worker: Counter[str] = Counter()

    async def claimer(n: int) -> None:
        worker = f"w{n}"
        limit = 1 + n % 3
        # The tasks are never finished: a long lease keeps each one leased to its first
        # claimer, so any second delivery would show up as a duplicate claim.
        while batch := await store.claim("q", worker_id=worker, limit=limit, lease=60):
            for task in batch:
                assert task.worker_id == worker and task.status is Status.RUNNING
                claims.append((task.id, task.attempt))
                per_worker[worker] += 1

    await asyncio.gather(*(claimer(n) for n in range(CLAIMERS)))

    assert len(claims) == len(set(claims)) == TASKS
    assert Counter(task_id for task_id, _ in claims) == Counter(t.id for t in submitted)
    assert all(attempt == 1 for _, attempt in claims)
    assert len(per_worker) >= 2, "the claimers did not actually run side by side"
    stats = {s.queue: s.counts for s in await store.stats()}
    assert stats["q"]["running"] == TASKS
    assert stats["q"]["queued"] == 0


async def test_asyncio_claimers_with_crashes_recover_every_task(store: TaskStore) -> None:
    """Claimers that walk away from some first attempts: the leases expire, the tasks
    are delivered again, never while a live lease is held."""
    count = 60
    # A short lease keeps the test quick; on a loaded machine a claimer may also
    # overrun it between claim and succeed, which only adds deliveries (that is
    # what is under test). A large attempt budget keeps such extra expiries from
    # failing a task outright, which would be a different story.
    await store.submit_many(
        [{"name": "job", "queue": "q", "max_attempts": 100} for _ in range(count)]
    )
    lease = 0.3
    claims: list[dict[str, Any]] = []

    async def claimer(n: int) -> None:
        worker = f"w{n}"
        while True:
            batch = await store.claim("q", worker_id=worker, lease=lease, limit=2)
            if not batch:
                stats = await store.stats("q")
                if stats[0].counts["queued"] + stats[0].counts["running"] == 0:
                    return
                await asyncio.sleep(0.02)
                continue
            for task in batch:
                assert task.lease_expires_at is not None
                claims.append(
                    {"id": task.id, "attempt": task.attempt, "until": task.lease_expires_at}
                )
                if task.attempt == 1 and abandons(task.id, 5):
                    continue
                try:
                    await store.succeed(task.id, worker_id=worker, attempt=task.attempt)
                except LostLease:
                    pass

    await asyncio.wait_for(asyncio.gather(*(claimer(n) for n in range(CLAIMERS))), 60)
    _assert_leases_never_overlap(claims, lease)
    page = await store.list(queue="q", limit=count)
    assert {t.status for t in page.items} == {Status.SUCCEEDED}
    by_task = Counter(c["id"] for c in claims)
    assert set(by_task) == {t.id for t in page.items}
    assert any(n > 1 for n in by_task.values()), "no task was abandoned and recovered"


def _assert_leases_never_overlap(claims: list[dict[str, Any]], lease: float) -> None:
    """Per task: distinct attempts, and each claim starts after the previous lease ended."""
    by_task: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    for claim in claims:
        by_task[claim["id"]].append(claim)
    for task_id, seen in by_task.items():
        attempts = [c["attempt"] for c in seen]
        assert len(attempts) == len(set(attempts)), f"{task_id} delivered twice: {attempts}"
        ordered = sorted(seen, key=lambda c: c["attempt"])
        assert [c["attempt"] for c in ordered] == list(range(1, len(ordered) + 1))
        for earlier, later in itertools.pairwise(ordered):
            later_start: datetime = later["until"] - timedelta(seconds=lease)
            assert later_start >= earlier["until"] - timedelta(milliseconds=1), (
                f"{task_id}: attempt {later['attempt']} leased before attempt "
                f"{earlier['attempt']}'s lease ran out"
            )


async def test_processes_never_hold_one_task_at_once(store: TaskStore, store_url: str) -> None:
    count = 100
    lease = 0.5
    submitted = await store.submit_many([{"name": "job", "queue": "mp"} for _ in range(count)])
    argvs = [["claim", store_url, "mp", f"proc{n}", str(lease), "10"] for n in range(2)]
    outputs = await asyncio.to_thread(run_together, argvs)
    claims: list[dict[str, Any]] = []
    for line in outputs:
        for claim in json.loads(line):
            claim["until"] = datetime.fromisoformat(claim["lease_expires_at"])
            claims.append(claim)

    _assert_leases_never_overlap(claims, lease)
    workers = Counter(c["worker"] for c in claims)
    assert len(workers) >= 2, f"only one process got work: {workers}"
    claimed_ids = {c["id"] for c in claims}
    assert claimed_ids == {t.id for t in submitted}
    # every task that nobody walked away from (and no lease was lost) ran exactly once
    redelivered = {c["id"] for c in claims if c["attempt"] > 1}
    expected = {c["id"] for c in claims if c["attempt"] == 1 and abandons(c["id"], 10)}
    lost = {c["id"] for c in claims if c["lost"]}
    assert expected <= redelivered <= expected | lost
    page = await store.list(queue="mp", limit=count)
    assert len(page.items) == count
    assert {t.status for t in page.items} == {Status.SUCCEEDED}
