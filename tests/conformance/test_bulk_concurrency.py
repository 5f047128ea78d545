"""Bulk actions while workers claim: nothing lost, nothing run to success twice.

An operator's store cancels and retries by filter while two claimers on another
store take the same queue's tasks and acknowledge them, fenced by attempt."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

import conveyor
from conveyor import LostLease, Status
from conveyor.store.base import TaskStore
from conveyor.store.protocol import bulk

TASKS = 240


async def test_bulk_actions_beside_claiming_workers(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "BATCH", 16)  # many batches, interleaved with claims
    async with conveyor.connect(store_url) as workers, conveyor.connect(store_url) as operator:
        submitted = await workers.submit_many(
            [
                {
                    "name": "job",
                    "payload": i,
                    "queue": "q",
                    "partition": f"p{i % 4}" if i % 2 else None,
                }
                for i in range(TASKS)
            ]
        )
        ids = {t.id for t in submitted}
        succeeded: Counter[str] = Counter()
        lost = 0
        operator_done = asyncio.Event()

        async def claimer(name: str) -> None:
            nonlocal lost
            while True:
                held = await workers.claim("q", worker_id=name, limit=8, lease=60)
                if not held:
                    if operator_done.is_set() and not await _anything_left(workers):
                        return
                    await asyncio.sleep(0.01)
                    continue
                for task in held:
                    await asyncio.sleep(0)  # the operator may cancel it meanwhile
                    try:
                        await workers.succeed(
                            task.id, worker_id=name, result=task.attempt, attempt=task.attempt
                        )
                    except LostLease:
                        lost += 1
                    else:
                        succeeded[task.id] += 1

        async def operate() -> int:
            cancelled = 0
            try:
                for _ in range(4):
                    cancelled += await operator.cancel_where(queue="q", limit=40)
                    await asyncio.sleep(0.02)
                    await operator.retry_where(queue="q", status="cancelled")
                # Whatever is still cancelled goes back once more.
                await operator.retry_where(queue="q", status="cancelled")
            finally:
                operator_done.set()
            return cancelled

        results = await asyncio.wait_for(
            asyncio.gather(claimer("w1"), claimer("w2"), operate()), timeout=120
        )
        cancelled = results[2]

        assert set(succeeded) == ids  # nothing lost
        assert all(n == 1 for n in succeeded.values())  # nothing succeeded twice
        assert cancelled > 0  # the operator did act while the workers ran
        assert lost <= cancelled
        for task in submitted:
            final = await operator.get(task.id)
            assert final is not None and final.status is Status.SUCCEEDED
        [report] = await operator.stats("q")
        assert report.counts.get("succeeded") == TASKS
        assert sum(report.counts.values()) == TASKS


async def _anything_left(store: TaskStore) -> bool:
    """Whether some task of queue ``q`` is not finished (or finished cancelled,
    which the operator's last retry brings back)."""
    [report] = await store.stats("q")
    return any(report.counts.get(s, 0) for s in ("queued", "running", "cancelled"))
