"""The blocking facade: the same calls, the same results, the same errors (SPEC §2)."""

from __future__ import annotations

import threading

import pytest

import conveyor
from conveyor import (
    AlreadyExists,
    InvalidArgument,
    LostLease,
    NotFound,
    Page,
    Status,
    Task,
    TaskCancelled,
)


def test_round_trip(sync_store: conveyor.SyncStore) -> None:
    task = sync_store.submit("job", {"n": 1}, queue="q", key="k")
    assert isinstance(task, Task) and task.status is Status.QUEUED
    assert sync_store.get(task.id) == task
    assert sync_store.get_by_key("k") == task
    [claimed] = sync_store.claim("q", worker_id="w", lease=10)
    assert claimed.id == task.id and claimed.attempt == 1
    beat = sync_store.heartbeat(task.id, worker_id="w")
    assert beat.status is Status.RUNNING
    p = sync_store.progress(task.id, worker_id="w", progress=0.5, message="half")
    assert (p.progress, p.progress_message) == (0.5, "half")
    done = sync_store.succeed(task.id, worker_id="w", result={"ok": True}, attempt=1)
    assert done.status is Status.SUCCEEDED and done.result == {"ok": True}
    assert sync_store.wait(task.id, timeout=1) == done


def test_submit_many_and_list(sync_store: conveyor.SyncStore) -> None:
    tasks = sync_store.submit_many([{"name": "t", "payload": i} for i in range(5)])
    page = sync_store.list(limit=3)
    assert isinstance(page, Page)
    assert [t.id for t in page.items] == [t.id for t in tasks[:3]]
    assert page.next_cursor is not None
    rest = sync_store.list(limit=3, cursor=page.next_cursor)
    assert [t.id for t in rest.items] == [t.id for t in tasks[3:]]
    assert rest.next_cursor is None


def test_fail_cancel_retry(sync_store: conveyor.SyncStore) -> None:
    task = sync_store.submit("t", queue="q", max_attempts=1)
    [held] = sync_store.claim("q", worker_id="w")
    failed = sync_store.fail(held.id, worker_id="w", error=RuntimeError("nope"))
    assert failed.status is Status.FAILED
    assert failed.error is not None and failed.error["type"] == "RuntimeError"
    retried = sync_store.retry(task.id, reset_attempts=True)
    assert retried is not None and retried.status is Status.QUEUED
    assert (retried.attempt, retried.max_attempts) == (1, 2)
    cancelled = sync_store.cancel(task.id)
    assert cancelled is not None and cancelled.status is Status.CANCELLED
    assert sync_store.cancel_by_key("missing") is None
    assert sync_store.retry_by_key("missing") is None


def test_wait_is_released_by_another_thread(sync_store: conveyor.SyncStore) -> None:
    task = sync_store.submit("t", queue="q")
    [held] = sync_store.claim("q", worker_id="w")
    timer = threading.Timer(
        0.2, lambda: sync_store.succeed(held.id, worker_id="w", result="from thread")
    )
    timer.start()
    try:
        done = sync_store.wait(task.id, timeout=5)
    finally:
        timer.join()
    assert done.result == "from thread"


def test_errors_propagate_with_their_types(sync_store: conveyor.SyncStore) -> None:
    task = sync_store.submit("t", queue="q", key="k")
    with pytest.raises(InvalidArgument) as bad:
        sync_store.submit("", {"x": 1})
    assert bad.value.field == "name"
    with pytest.raises(InvalidArgument):
        sync_store.submit("t", object())
    with pytest.raises(AlreadyExists) as taken:
        sync_store.submit("t", key="k", conflict="reject")
    assert taken.value.task_id == task.id
    with pytest.raises(LostLease):
        sync_store.succeed(task.id, worker_id="nobody")
    with pytest.raises(NotFound):
        sync_store.wait("01ARZ3NDEKTSV4RRFFQ69G5FAV", timeout=1)
    with pytest.raises(TimeoutError):
        sync_store.wait(task.id, timeout=0.1)
    [held] = sync_store.claim("q", worker_id="w")
    sync_store.cancel(held.id)
    with pytest.raises(TaskCancelled):
        sync_store.heartbeat(held.id, worker_id="w")
    assert len(sync_store.list().items) == 1


def test_sync_store_as_context_manager(store_url: str) -> None:
    with conveyor.connect_sync(store_url) as first:
        task = first.submit("t")
    # closed and reopened: the data is still there
    second = conveyor.connect_sync(store_url)
    try:
        assert second.get(task.id) == task
    finally:
        second.close()
    second.close()  # closing twice is harmless
