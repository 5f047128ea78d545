"""progress, succeed, fail: results, retries with backoff, error envelopes (SPEC §2.2)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from _support import ENVELOPE_KEYS, seconds, utcnow
from conveyor import InvalidArgument, LostLease, Status, Task
from conveyor.store.base import TaskStore

SLACK = 0.25  # seconds: the store's clock against the test's, plus call latency


async def _running(store: TaskStore, **submit: Any) -> Task:
    await store.submit("t", queue="q", **submit)
    [claimed] = await store.claim("q", worker_id="w")
    return claimed


def _delay_bounds(run_at: datetime, before: datetime, after: datetime) -> tuple[float, float]:
    """The smallest and largest delay consistent with a call made between before and after."""
    return seconds(run_at - after), seconds(run_at - before)


# ------------------------------------------------------------------ progress
async def test_progress_value_and_message(store: TaskStore) -> None:
    claimed = await _running(store)
    p = await store.progress(claimed.id, worker_id="w", progress=0.5, message="half way")
    assert (p.progress, p.progress_message) == (0.5, "half way")
    assert p.status is Status.RUNNING and p.attempt == 1
    only_message = await store.progress(claimed.id, worker_id="w", message="still going")
    assert (only_message.progress, only_message.progress_message) == (0.5, "still going")
    only_value = await store.progress(claimed.id, worker_id="w", progress=0.75)
    assert (only_value.progress, only_value.progress_message) == (0.75, "still going")
    assert await store.get(claimed.id) == only_value


@pytest.mark.parametrize("value", [0, 0.0, 1, 1.0, 0.333])
async def test_progress_bounds_are_inclusive(store: TaskStore, value: float) -> None:
    claimed = await _running(store)
    p = await store.progress(claimed.id, worker_id="w", progress=value)
    assert p.progress == pytest.approx(value)


# ------------------------------------------------------------------- succeed
@pytest.mark.parametrize("result", [None, {"sent": True, "ids": [1, 2]}, "done", 42, [1, None]])
async def test_succeed_stores_the_result(store: TaskStore, result: Any) -> None:
    claimed = await _running(store)
    done = await store.succeed(claimed.id, worker_id="w", result=result)
    assert done.status is Status.SUCCEEDED and done.terminal
    assert done.result == result
    assert done.error is None
    assert done.lease_expires_at is None
    assert done.finished_at is not None and claimed.started_at is not None
    assert done.finished_at >= claimed.started_at
    assert done.attempt == 1
    assert await store.get(claimed.id) == done


async def test_succeed_twice_raises_lost_lease(store: TaskStore) -> None:
    claimed = await _running(store)
    done = await store.succeed(claimed.id, worker_id="w", result=1)
    with pytest.raises(LostLease):
        await store.succeed(claimed.id, worker_id="w", result=2)
    assert await store.get(claimed.id) == done


async def test_succeeded_task_is_not_claimable(store: TaskStore) -> None:
    claimed = await _running(store)
    await store.succeed(claimed.id, worker_id="w")
    store.clock_offset = 3600
    assert await store.claim("q", worker_id="w") == []


# ---------------------------------------------------------------------- fail
async def test_fail_with_attempts_left_requeues_after_default_backoff(store: TaskStore) -> None:
    claimed = await _running(store)
    before = utcnow()
    failed = await store.fail(claimed.id, worker_id="w", error="flaky")
    after = utcnow()
    assert failed.status is Status.QUEUED and not failed.terminal
    assert failed.attempt == 1
    assert failed.worker_id is None and failed.lease_expires_at is None
    assert failed.finished_at is None
    assert failed.error is not None and failed.error["message"] == "flaky"
    assert failed.error["retryable"] is True
    # attempt 1: 1 s x 2^0, jitter only shortens it
    low, high = _delay_bounds(failed.run_at, before, after)
    assert low <= 1.0 + SLACK and high >= 0.5 - SLACK
    assert 0 < high


async def test_backoff_doubles_and_retry_waits_for_it(store: TaskStore) -> None:
    claimed = await _running(store, max_attempts=4)
    await store.fail(claimed.id, worker_id="w", error="1")
    assert await store.claim("q", worker_id="w") == []  # not before its backoff
    store.clock_offset = 1.05
    [second] = await store.claim("q", worker_id="w")
    assert second.attempt == 2
    offset = timedelta(seconds=store.clock_offset)
    before = utcnow() + offset
    failed = await store.fail(second.id, worker_id="w", error="2")
    after = utcnow() + offset
    low, high = _delay_bounds(failed.run_at, before, after)
    # attempt 2: 1 s x 2^1 = 2 s at most
    assert low <= 2.0 + SLACK and high >= 1.0 - SLACK
    store.clock_offset += 0.9
    assert await store.claim("q", worker_id="w") == []
    store.clock_offset += 1.2
    [third] = await store.claim("q", worker_id="w")
    assert third.attempt == 3


async def test_fail_with_explicit_delay(store: TaskStore) -> None:
    claimed = await _running(store)
    before = utcnow()
    failed = await store.fail(claimed.id, worker_id="w", error="later", delay=10)
    after = utcnow()
    low, high = _delay_bounds(failed.run_at, before, after)
    assert low <= 10 + SLACK and high >= 10 - SLACK
    store.clock_offset = 9
    assert await store.claim("q", worker_id="w") == []
    store.clock_offset = 10.5
    [again] = await store.claim("q", worker_id="w")
    assert again.attempt == 2


async def test_fail_with_timedelta_delay(store: TaskStore) -> None:
    claimed = await _running(store)
    before = utcnow()
    failed = await store.fail(claimed.id, worker_id="w", error="x", delay=timedelta(minutes=1))
    after = utcnow()
    low, high = _delay_bounds(failed.run_at, before, after)
    assert low <= 60 + SLACK and high >= 60 - SLACK


async def test_fail_with_zero_delay_is_claimable_at_once(store: TaskStore) -> None:
    claimed = await _running(store)
    await store.fail(claimed.id, worker_id="w", error="again", delay=0)
    [again] = await store.claim("q", worker_id="w2")
    assert again.id == claimed.id and again.attempt == 2 and again.worker_id == "w2"


async def test_fail_not_retryable_is_terminal(store: TaskStore) -> None:
    claimed = await _running(store, max_attempts=5)
    failed = await store.fail(claimed.id, worker_id="w", error="fatal", retryable=False)
    assert failed.status is Status.FAILED and failed.terminal
    assert failed.attempt == 1
    assert failed.finished_at is not None and failed.lease_expires_at is None
    assert failed.error is not None and failed.error["retryable"] is False
    store.clock_offset = 3600
    assert await store.claim("q", worker_id="w") == []
    assert await store.get(claimed.id) == failed


async def test_fail_on_the_last_attempt_is_terminal(store: TaskStore) -> None:
    claimed = await _running(store, max_attempts=2)
    await store.fail(claimed.id, worker_id="w", error="one", delay=0)
    [second] = await store.claim("q", worker_id="w")
    failed = await store.fail(second.id, worker_id="w", error="two")
    assert failed.status is Status.FAILED
    assert failed.attempt == 2
    assert failed.error is not None and failed.error["message"] == "two"
    store.clock_offset = 3600
    assert await store.claim("q", worker_id="w") == []


async def test_max_attempts_one_fails_at_once(store: TaskStore) -> None:
    claimed = await _running(store, max_attempts=1)
    failed = await store.fail(claimed.id, worker_id="w", error="only")
    assert failed.status is Status.FAILED


# ----------------------------------------------------------- error envelopes
async def test_error_from_an_exception(store: TaskStore) -> None:
    claimed = await _running(store)
    try:
        raise ValueError("bad value 42")
    except ValueError as exc:
        error = exc
    failed = await store.fail(claimed.id, worker_id="w", error=error, retryable=False)
    env = failed.error
    assert env is not None
    assert set(env) == ENVELOPE_KEYS
    assert env["type"] == "ValueError"
    assert env["message"] == "bad value 42"
    assert isinstance(env["code"], str) and env["code"]
    assert env["retryable"] is False
    assert isinstance(env["traceback"], str)
    assert "ValueError: bad value 42" in env["traceback"]
    assert "test_error_from_an_exception" in env["traceback"]


async def test_error_from_a_string(store: TaskStore) -> None:
    claimed = await _running(store)
    failed = await store.fail(claimed.id, worker_id="w", error="disk full", retryable=False)
    env = failed.error
    assert env is not None
    assert set(env) == ENVELOPE_KEYS
    assert env["message"] == "disk full"
    assert isinstance(env["type"], str) and isinstance(env["code"], str)
    assert env["retryable"] is False


async def test_error_from_a_dict(store: TaskStore) -> None:
    claimed = await _running(store)
    failed = await store.fail(
        claimed.id,
        worker_id="w",
        error={"type": "QuotaError", "code": "quota", "message": "over quota"},
        retryable=False,
    )
    env = failed.error
    assert env is not None
    assert set(env) == ENVELOPE_KEYS
    assert (env["type"], env["code"], env["message"]) == ("QuotaError", "quota", "over quota")
    assert env["retryable"] is False
    assert env["traceback"] is None
    assert (await store.get(claimed.id)) == failed


async def test_error_that_is_not_json_is_refused(store: TaskStore) -> None:
    claimed = await _running(store)
    with pytest.raises(InvalidArgument) as info:
        await store.fail(claimed.id, worker_id="w", error={"message": object()})
    assert info.value.field == "error"
    with pytest.raises(InvalidArgument) as info:
        await store.fail(claimed.id, worker_id="w", error=12345)  # type: ignore[arg-type]
    assert info.value.field == "error"
    assert await store.get(claimed.id) == claimed


async def test_backoff_grows_exponentially_and_is_capped_at_an_hour(store: TaskStore) -> None:
    await store.submit("t", queue="q", max_attempts=16)
    for attempt in range(1, 15):
        [held] = await store.claim("q", worker_id="w")
        assert held.attempt == attempt
        offset = timedelta(seconds=store.clock_offset)
        before = utcnow() + offset
        failed = await store.fail(held.id, worker_id="w", error=f"attempt {attempt}")
        after = utcnow() + offset
        assert failed.status is Status.QUEUED
        undisturbed = min(2.0 ** (attempt - 1), 3600.0)
        low, high = _delay_bounds(failed.run_at, before, after)
        assert low <= undisturbed + SLACK, f"attempt {attempt}: waited {low} s"
        assert high >= undisturbed / 2 - SLACK, f"attempt {attempt}: waited {high} s"
        store.clock_offset += high + 0.01
