"""The shortest round trip through the store, on both backends."""

from __future__ import annotations

from conveyor import Status
from conveyor.store.base import TaskStore


async def test_submit_claim_succeed(store: TaskStore) -> None:
    task = await store.submit("hello", {"n": 1}, queue="q")
    assert task.status is Status.QUEUED
    [claimed] = await store.claim("q", worker_id="w1")
    assert claimed.id == task.id and claimed.attempt == 1 and claimed.status is Status.RUNNING
    done = await store.succeed(task.id, worker_id="w1", result={"ok": True})
    assert done.status is Status.SUCCEEDED and done.result == {"ok": True}
    assert (await store.wait(task.id, timeout=1)).status is Status.SUCCEEDED
