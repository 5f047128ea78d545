"""Worker logs: every line about a task names its id, name and attempt; JSON
lines for log shippers; other libraries kept at warning."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

import conveyor
from conveyor import Status
from conveyor.worker import Context
from conveyor.worker.logs import JsonFormatter, TaskLogger, setup_logging


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    ours = logging.getLogger("conveyor")
    saved = (list(root.handlers), root.level, ours.level)
    try:
        yield
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        ours.setLevel(saved[2])


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_every_line_about_a_task_names_it(
    app: conveyor.App, caplog: pytest.LogCaptureFixture
) -> None:
    @app.task(name="flaky", queue="q", backoff=0.01, max_attempts=2)
    async def flaky(ctx: Context) -> str:
        if ctx.task.attempt == 1:
            raise RuntimeError("first time")
        return "ok"

    caplog.set_level(logging.INFO, logger="conveyor")
    worker = app.worker("q", poll_interval=0.05)
    job = asyncio.create_task(worker.run())
    try:
        task = await flaky.submit()
        done = await app.store.wait(task.id, timeout=10)
    finally:
        worker.stop()
        await asyncio.wait_for(job, 15)
    assert done.status is Status.SUCCEEDED
    about = [r for r in caplog.records if getattr(r, "task_id", None) == task.id]
    messages = [r.getMessage() for r in about]
    assert any("attempt failed" in m and "first time" in m for m in messages), messages
    assert any("will retry" in m for m in messages), messages
    assert any("succeeded" in m for m in messages), messages  # successes are logged at info
    for record in about:
        text = record.getMessage()
        assert task.id in text and "flaky" in text and f"attempt {record.attempt}" in text
        assert record.task_name == "flaky"  # type: ignore[attr-defined]
    assert {r.attempt for r in about} == {1, 2}  # type: ignore[attr-defined]


def test_json_lines_carry_the_task_fields() -> None:
    task = conveyor.Task.__new__(conveyor.Task)  # only the fields TaskLogger reads
    object.__setattr__(task, "id", "01TASK")
    object.__setattr__(task, "name", "myapp.send")
    object.__setattr__(task, "attempt", 3)
    object.__setattr__(task, "queue", "emails")
    object.__setattr__(task, "group", None)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("conveyor.test.json")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        TaskLogger(logger, task).warning("will retry at %s", "soon")
        try:
            raise ValueError("bad")
        except ValueError:
            logger.exception("outside any task")
    finally:
        logger.removeHandler(handler)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "task 01TASK myapp.send attempt 3: will retry at soon"
    assert (first["task_id"], first["task_name"], first["attempt"], first["queue"]) == (
        "01TASK",
        "myapp.send",
        3,
        "emails",
    )
    assert first["level"] == "warning" and first["logger"] == "conveyor.test.json"
    assert first["time"].endswith("+00:00")
    assert "ValueError: bad" in second["exception"]


def test_debug_is_conveyor_debug_not_the_drivers(restore_logging: None) -> None:
    stream = io.StringIO()
    setup_logging("debug", "json", stream=stream)
    assert logging.getLogger("conveyor.worker").isEnabledFor(logging.DEBUG)
    for noisy in ("sqlalchemy.engine", "aiosqlite", "asyncio", "psycopg", "alembic"):
        assert not logging.getLogger(noisy).isEnabledFor(logging.INFO), noisy
        assert logging.getLogger(noisy).isEnabledFor(logging.WARNING), noisy
    logging.getLogger("conveyor.worker").debug("hello")
    assert json.loads(stream.getvalue())["message"] == "hello"
    setup_logging("info", "text", library_level="debug", stream=stream)
    assert logging.getLogger("sqlalchemy.engine").isEnabledFor(logging.DEBUG)
    assert len([h for h in logging.getLogger().handlers if h.get_name() == "conveyor"]) == 1
