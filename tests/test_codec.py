"""The row → Task path's shortcuts give exactly what the plain constructor gives."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor import _values as v
from conveyor.models import Status, Task
from conveyor.store.protocol import codec


def _values() -> dict[str, object]:
    moment = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    out: dict[str, object] = {}
    for i, field in enumerate(dataclasses.fields(Task)):
        out[field.name] = f"v{i}"
    out.update(
        payload={"args": [1]},
        metadata={"m": 1},
        priority=3,
        status=Status.RUNNING,
        attempt=2,
        max_attempts=5,
        run_at=moment,
        created_at=moment,
        started_at=moment,
        finished_at=None,
        lease_expires_at=moment,
        progress=0.5,
        result=[1, 2],
        error=None,
        lease=30.0,
    )
    return out


def test_the_slot_maker_builds_the_same_frozen_task() -> None:
    values = _values()
    made = codec.make_task(**values)
    plain = Task(**values)  # type: ignore[arg-type]
    assert type(made) is Task
    assert made == plain and repr(made) == repr(plain)
    assert all(getattr(made, name) is value for name, value in values.items())
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.attempt = 3  # type: ignore[misc]


def test_the_slot_maker_wants_every_field() -> None:
    values = _values()
    del values["lease"]
    with pytest.raises(TypeError):
        codec.make_task(**values)


def test_the_queued_maker_fixes_what_a_new_task_has_not_yet() -> None:
    values = _values()
    fixed = {
        "status": Status.QUEUED,
        "attempt": 0,
        "started_at": None,
        "finished_at": None,
        "lease_expires_at": None,
        "worker_id": None,
        "progress": None,
        "progress_message": None,
        "result": None,
        "error": None,
        "group": None,
        "lease": None,
    }
    given_values = {name: value for name, value in values.items() if name not in fixed}
    made = codec.queued_task(**given_values)
    assert made == Task(**{**given_values, **fixed})  # type: ignore[arg-type]
    assert repr(made) == repr(Task(**{**given_values, **fixed}))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        codec.queued_task(**values)  # a fixed field is not an argument


def test_a_queued_task_settled_later_is_the_task_built_at_once() -> None:
    moment = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    values: dict[str, Any] = {
        name: value
        for name, value in _values().items()
        if name in {f.name for f in dataclasses.fields(Task)}
    }
    given_values = {
        name: values[name]
        for name in (
            "id name queue partition payload metadata priority key parent_id root_id correlation_id"
        ).split()
    }
    early = codec.queued_task(**given_values, max_attempts=None, run_at=None, created_at=None)
    codec.settle_queued(early, 7, moment, moment)
    at_once = codec.queued_task(**given_values, max_attempts=7, run_at=moment, created_at=moment)
    assert early == at_once and repr(early) == repr(at_once)
    with pytest.raises(dataclasses.FrozenInstanceError):
        early.max_attempts = 8  # type: ignore[misc]


@given(st.integers(min_value=0, max_value=253_402_300_799_999_999))  # up to 9999-12-31
def test_remembered_datetimes_are_the_plain_ones(us: int) -> None:
    assert codec._from_us(us) == v.from_us(us)
    assert codec._from_us(us) == v.from_us(us)  # from the cache the second time
