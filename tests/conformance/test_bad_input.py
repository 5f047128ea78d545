"""Bad input: InvalidArgument naming the field, and nothing written (SPEC §2.2, §3.5)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from _support import assert_empty
from conveyor import ConveyorError, InvalidArgument, Task
from conveyor.store.base import TaskStore

LONG = "x" * 256
NAIVE = datetime(2030, 1, 1, 12, 0)
SOON = datetime.now(UTC) + timedelta(minutes=5)


class Unserialisable:
    pass


def _check(exc: InvalidArgument, fields: str | tuple[str, ...]) -> None:
    expected = (fields,) if isinstance(fields, str) else fields
    assert exc.field in expected, f"field {exc.field!r}, expected {expected}"
    assert isinstance(exc, ValueError) and isinstance(exc, ConveyorError)
    assert exc.code == "invalid_argument"
    assert exc.field in str(exc)


SUBMIT_CASES: list[tuple[str, dict[str, Any], str | tuple[str, ...]]] = [
    ("empty name", {"name": ""}, "name"),
    ("long name", {"name": LONG}, "name"),
    ("name not a string", {"name": 5}, "name"),
    ("name None", {"name": None}, "name"),
    ("payload object", {"payload": Unserialisable()}, "payload"),
    ("payload NaN", {"payload": float("nan")}, "payload"),
    ("payload nested inf", {"payload": {"x": [float("inf")]}}, "payload"),
    ("payload bytes", {"payload": b"raw"}, "payload"),
    ("payload set", {"payload": {"s": {1, 2}}}, "payload"),
    ("metadata object", {"metadata": {"a": object()}}, "metadata"),
    ("metadata NaN", {"metadata": {"a": float("nan")}}, "metadata"),
    ("metadata not a dict", {"metadata": "tag"}, "metadata"),
    ("delay with run_at", {"delay": 1, "run_at": SOON}, ("delay", "run_at")),
    ("negative delay", {"delay": -1}, "delay"),
    ("negative timedelta delay", {"delay": timedelta(seconds=-5)}, "delay"),
    ("non-numeric delay", {"delay": "soon"}, "delay"),
    ("NaN delay", {"delay": float("nan")}, "delay"),
    ("absurd delay", {"delay": 1e20}, "delay"),
    ("payload lone surrogate", {"payload": {"text": "\ud800"}}, "payload"),
    ("metadata lone surrogate", {"metadata": {"\udfff": 1}}, "metadata"),
    ("name lone surrogate", {"name": "job\ud800"}, "name"),
    ("name with NUL", {"name": "a\x00b"}, "name"),
    ("key lone surrogate", {"key": "\ud800"}, "key"),
    ("naive run_at", {"run_at": NAIVE}, "run_at"),
    ("run_at a string", {"run_at": "2030-01-01T00:00:00Z"}, "run_at"),
    ("unknown conflict", {"key": "k", "conflict": "merge"}, "conflict"),
    ("empty queue", {"queue": ""}, "queue"),
    ("long queue", {"queue": LONG}, "queue"),
    ("empty key", {"key": ""}, "key"),
    ("long key", {"key": LONG}, "key"),
    ("empty partition", {"partition": ""}, "partition"),
    ("long partition", {"partition": LONG}, "partition"),
    ("empty correlation id", {"correlation_id": ""}, "correlation_id"),
    ("priority text", {"priority": "high"}, "priority"),
    ("priority float", {"priority": 1.5}, "priority"),
    ("max_attempts zero", {"max_attempts": 0}, "max_attempts"),
    ("max_attempts negative", {"max_attempts": -2}, "max_attempts"),
    ("max_attempts text", {"max_attempts": "3"}, "max_attempts"),
    ("unknown parent", {"parent": "01ARZ3NDEKTSV4RRFFQ69G5FAV"}, "parent"),
]


async def test_submit_bad_input_writes_nothing(store: TaskStore, subtests: pytest.Subtests) -> None:
    for label, overrides, field in SUBMIT_CASES:
        with subtests.test(msg=label):
            args = {"name": "job", "payload": {"ok": True}, **overrides}
            name = args.pop("name")
            payload = args.pop("payload")
            with pytest.raises(InvalidArgument) as info:
                await store.submit(name, payload, **args)
            _check(info.value, field)
            await assert_empty(store)
            with pytest.raises(InvalidArgument) as info:
                await store.submit_many(
                    [{"name": "fine"}, {"name": name, "payload": payload, **args}]
                )
            _check(info.value, field)
            await assert_empty(store)


async def test_longest_names_are_accepted(store: TaskStore) -> None:
    edge = "y" * 255
    task = await store.submit(edge, queue=edge, key=edge, partition=edge, correlation_id=edge)
    assert (task.name, task.queue, task.key, task.partition) == (edge, edge, edge, edge)
    [claimed] = await store.claim(edge, worker_id=edge)
    assert claimed.worker_id == edge


async def test_sql_text_in_names_is_just_data(store: TaskStore) -> None:
    evil = "x'); DROP TABLE conveyor_tasks; --"
    task = await store.submit(evil, {"q": evil}, queue=evil, key=evil, metadata={evil: evil})
    assert await store.get_by_key(evil) == task
    [claimed] = await store.claim(evil, worker_id=evil)
    assert claimed.id == task.id and claimed.name == evil
    assert [t.id for t in (await store.list(queue=evil, name=evil)).items] == [task.id]


async def test_submit_many_bad_shapes(store: TaskStore) -> None:
    with pytest.raises(InvalidArgument) as info:
        await store.submit_many({"name": "x"})  # type: ignore[dict-item]
    assert isinstance(info.value, ValueError)
    with pytest.raises(InvalidArgument) as info:
        await store.submit_many([{"name": "x"}, 7])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument) as info:
        await store.submit_many([{"payload": 1}])
    _check(info.value, "name")
    await assert_empty(store)


# The store is typed Any: these calls pass wrong types on purpose.
Call = Callable[[Any, str], Awaitable[Any]]

CLAIM_CASES: list[tuple[str, Call, str]] = [
    ("empty queue", lambda s, _: s.claim("", worker_id="w"), "queues"),
    ("no queues", lambda s, _: s.claim([], worker_id="w"), "queues"),
    ("one empty queue", lambda s, _: s.claim(["q", ""], worker_id="w"), "queues"),
    ("long queue", lambda s, _: s.claim(LONG, worker_id="w"), "queues"),
    ("empty worker", lambda s, _: s.claim("q", worker_id=""), "worker_id"),
    ("long worker", lambda s, _: s.claim("q", worker_id=LONG), "worker_id"),
    ("negative lease", lambda s, _: s.claim("q", worker_id="w", lease=-1), "lease"),
    ("text lease", lambda s, _: s.claim("q", worker_id="w", lease="30"), "lease"),
    ("NaN lease", lambda s, _: s.claim("q", worker_id="w", lease=float("nan")), "lease"),
    ("absurd lease", lambda s, _: s.claim("q", worker_id="w", lease=1e20), "lease"),
    ("zero limit", lambda s, _: s.claim("q", worker_id="w", limit=0), "limit"),
    ("negative limit", lambda s, _: s.claim("q", worker_id="w", limit=-3), "limit"),
    ("text limit", lambda s, _: s.claim("q", worker_id="w", limit="2"), "limit"),
    ("float limit", lambda s, _: s.claim("q", worker_id="w", limit=1.5), "limit"),
    ("empty group", lambda s, _: s.claim("q", worker_id="w", group=""), "group"),
    ("long group", lambda s, _: s.claim("q", worker_id="w", group=LONG), "group"),
    ("empty partition", lambda s, _: s.claim("q", worker_id="w", partition=""), "partition"),
]


async def test_claim_bad_input_changes_nothing(store: TaskStore, subtests: pytest.Subtests) -> None:
    task = await store.submit("t", queue="q")
    for label, call, field in CLAIM_CASES:
        with subtests.test(msg=label):
            with pytest.raises(InvalidArgument) as info:
                await call(store, task.id)
            _check(info.value, field)
            assert await store.get(task.id) == task
    assert len(await store.claim("q", worker_id="w")) == 1


OWNED_CASES: list[tuple[str, Call, str]] = [
    ("heartbeat negative lease", lambda s, i: s.heartbeat(i, worker_id="w", lease=-1), "lease"),
    ("heartbeat text lease", lambda s, i: s.heartbeat(i, worker_id="w", lease="x"), "lease"),
    ("heartbeat absurd lease", lambda s, i: s.heartbeat(i, worker_id="w", lease=1e20), "lease"),
    ("heartbeat empty worker", lambda s, i: s.heartbeat(i, worker_id=""), "worker_id"),
    ("heartbeat empty id", lambda s, _: s.heartbeat("", worker_id="w"), "task_id"),
    ("progress above 1", lambda s, i: s.progress(i, worker_id="w", progress=1.5), "progress"),
    ("progress below 0", lambda s, i: s.progress(i, worker_id="w", progress=-0.1), "progress"),
    (
        "progress NaN",
        lambda s, i: s.progress(i, worker_id="w", progress=float("nan")),
        "progress",
    ),
    ("progress text", lambda s, i: s.progress(i, worker_id="w", progress="half"), "progress"),
    ("progress message", lambda s, i: s.progress(i, worker_id="w", message=5), "message"),
    (
        "progress message with NUL",
        lambda s, i: s.progress(i, worker_id="w", message="50%\x00"),
        "message",
    ),
    (
        "progress message lone surrogate",
        lambda s, i: s.progress(i, worker_id="w", message="\ud800"),
        "message",
    ),
    (
        "succeed object result",
        lambda s, i: s.succeed(i, worker_id="w", result=Unserialisable()),
        "result",
    ),
    (
        "succeed NaN result",
        lambda s, i: s.succeed(i, worker_id="w", result={"v": float("nan")}),
        "result",
    ),
    (
        "succeed lone surrogate result",
        lambda s, i: s.succeed(i, worker_id="w", result=["\udc80"]),
        "result",
    ),
    ("succeed long worker", lambda s, i: s.succeed(i, worker_id=LONG), "worker_id"),
    ("succeed attempt 0", lambda s, i: s.succeed(i, worker_id="w", attempt=0), "attempt"),
    ("succeed attempt text", lambda s, i: s.succeed(i, worker_id="w", attempt="1"), "attempt"),
    (
        "fail negative delay",
        lambda s, i: s.fail(i, worker_id="w", error="e", delay=-1),
        "delay",
    ),
    (
        "fail absurd delay",
        lambda s, i: s.fail(i, worker_id="w", error="e", delay=1e20),
        "delay",
    ),
    ("fail text delay", lambda s, i: s.fail(i, worker_id="w", error="e", delay="1s"), "delay"),
    ("fail object error", lambda s, i: s.fail(i, worker_id="w", error=object()), "error"),
]


async def test_owned_writes_bad_input_change_nothing(
    store: TaskStore, subtests: pytest.Subtests
) -> None:
    await store.submit("t", queue="q")
    [held] = await store.claim("q", worker_id="w")
    for label, call, field in OWNED_CASES:
        with subtests.test(msg=label):
            with pytest.raises(InvalidArgument) as info:
                await call(store, held.id)
            _check(info.value, field)
            assert await store.get(held.id) == held
    done = await store.succeed(held.id, worker_id="w", attempt=1)
    assert done.status == "succeeded"


async def test_other_calls_bad_input(store: TaskStore, subtests: pytest.Subtests) -> None:
    task: Task = await store.submit("t", key="k")
    cases: list[tuple[str, Callable[[], Awaitable[Any]], str]] = [
        ("wait negative timeout", lambda: store.wait(task.id, timeout=-1), "timeout"),
        ("wait text timeout", lambda: store.wait(task.id, timeout="1"), "timeout"),  # type: ignore[arg-type]
        ("get empty id", lambda: store.get(""), "task_id"),
        ("get empty group", lambda: store.get(task.id, group=""), "group"),
        ("get_by_key empty", lambda: store.get_by_key(""), "key"),
        ("cancel empty id", lambda: store.cancel(""), "task_id"),
        ("cancel_by_key empty", lambda: store.cancel_by_key(""), "key"),
        ("retry empty id", lambda: store.retry(""), "task_id"),
        ("retry empty group", lambda: store.retry(task.id, group=""), "group"),
        ("list empty queue", lambda: store.list(queue=""), "queue"),
        ("list long name", lambda: store.list(name=LONG), "name"),
    ]
    for label, call, field in cases:
        with subtests.test(msg=label):
            with pytest.raises(InvalidArgument) as info:
                await call()
            _check(info.value, field)
    assert await store.get(task.id) == task
    assert len((await store.list()).items) == 1
