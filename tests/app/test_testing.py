"""conveyor.testing.run_tasks on both backends, and the pytest plugin through pytester."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import conveyor
from _support import ADMIN_URL
from conveyor.store.base import TaskStore
from conveyor.testing import run_tasks

pytest_plugins = ["pytester"]


async def test_run_tasks_runs_until_empty_and_reports(store: TaskStore) -> None:
    app = conveyor.App(store.url)
    order: list[str] = []

    @app.task(name="parent")
    async def parent(ctx: Any, n: int) -> int:
        order.append(f"parent {n}")
        await ctx.submit_child(child, n * 10)
        return n

    @app.task(name="child", queue="children")
    def child(ctx: Any, n: int) -> int:
        order.append(f"child {n}")
        return n + 1

    @app.task(name="broken", max_attempts=1)
    async def broken(ctx: Any) -> None:
        raise RuntimeError("boom")

    @app.task(name="flaky", max_attempts=3, backoff=600)  # its retry is not due in this test
    async def flaky(ctx: Any) -> None:
        raise ValueError("try later")

    with app.using(store):
        await parent.submit(1)
        await broken.submit()
        await flaky.submit()
        await store.submit("nobody-knows-me")
        report = await run_tasks(app)
    assert report.names == ["parent", "broken", "flaky", "nobody-knows-me", "child"]
    assert [t.result for t in report.succeeded] == [1, 11]
    failed = {t.name: t for t in report.failed}
    assert failed["broken"].status is conveyor.Status.FAILED
    assert failed["broken"].error is not None and failed["broken"].error["message"] == "boom"
    # A retry waiting out its backoff is reported, not waited for.
    assert failed["flaky"].status is conveyor.Status.QUEUED and failed["flaky"].attempt == 1
    assert failed["nobody-knows-me"].error is not None
    assert failed["nobody-knows-me"].error["code"] == "unknown_task"
    assert order == ["parent 1", "child 10"]
    assert (await run_tasks(app, store=store)).ran == []  # nothing claimable is left


async def test_run_tasks_keeps_partition_order_and_skips_schedules(store: TaskStore) -> None:
    app = conveyor.App(store.url)
    seen: list[int] = []

    @app.periodic(every=1, name="tick")
    @app.task(name="ordered", partition=lambda n: "p")
    async def ordered(ctx: Any, n: int) -> None:
        seen.append(n)

    with app.using(store):
        for n in range(5):
            await ordered.submit(n)
        report = await run_tasks(app)
    assert seen == [0, 1, 2, 3, 4] and len(report.succeeded) == 5
    assert all(t.metadata.get("periodic") is None for t in report.ran)


async def test_using_forgets_the_tasks_a_test_defines(store: TaskStore, tmp_path: Path) -> None:
    """Tasks and schedules defined inside a function while the app uses a test
    store are gone after; those of a module imported meanwhile stay."""
    import importlib
    import sys
    import types

    app = conveyor.App(store.url)
    holder = types.ModuleType("conveyor_test_app_holder")
    holder.app = app  # type: ignore[attr-defined]

    @app.task(name="kept")
    async def kept(ctx: Any) -> None: ...

    (tmp_path / "late_tasks_module.py").write_text(
        "from conveyor_test_app_holder import app\n"
        "@app.task(name='late')\nasync def late(ctx):\n    return 'late'\n"
    )
    sys.modules[holder.__name__] = holder
    sys.path.insert(0, str(tmp_path))
    try:
        for _ in range(2):  # the second time, the same names are free again
            with app.using(store):

                @app.periodic(every=60, name="tick")
                @app.task(name="mine")
                async def mine(ctx: Any) -> str:
                    return "mine"

                importlib.import_module("late_tasks_module")
                await mine.submit()
                assert {t.name for t in (await run_tasks(app)).succeeded} == {"mine"}
                assert sorted(app.tasks) == ["kept", "late", "mine"]
            assert sorted(app.tasks) == ["kept", "late"] and app.schedules == {}
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("late_tasks_module", None)
        sys.modules.pop(holder.__name__, None)


EXAMPLE_CONFTEST = """
import pytest
import conveyor

app = conveyor.App()

@app.task(name="add")
async def add(ctx, a, b):
    return a + b

@app.task(name="fail", max_attempts=1)
def fail(ctx):
    raise RuntimeError("no")
"""

EXAMPLE_TESTS = """
import pytest
from conftest import add, app, fail

@pytest.fixture
def conveyor_app(conveyor_store):
    with app.using(conveyor_store):
        yield app

@pytest.mark.asyncio
async def test_add(conveyor_app, run_tasks):
    await add.submit(2, 3)
    await fail.submit()
    report = await run_tasks()
    assert [t.result for t in report.succeeded] == [5]
    assert [t.error["message"] for t in report.failed] == ["no"]

@pytest.mark.asyncio
async def test_each_test_starts_empty(conveyor_store, run_tasks):
    assert (await conveyor_store.list()).items == []
    assert (await run_tasks()).ran == []
    print("URL", conveyor_store.url)

@pytest.mark.asyncio
async def test_a_fresh_app(conveyor_app, run_tasks):
    @conveyor_app.task(name="hello")
    def hello(ctx, who):
        return f"hello {who}"
    await hello.submit("you")
    assert [t.result for t in (await run_tasks()).succeeded] == ["hello you"]
"""


def _example(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(EXAMPLE_CONFTEST)
    pytester.makepyfile(test_example=EXAMPLE_TESTS)
    pytester.makeini(
        "[pytest]\nasyncio_mode = strict\nasyncio_default_fixture_loop_scope = function\n"
    )


def test_plugin_on_sqlite(pytester: pytest.Pytester) -> None:
    _example(pytester)
    result = pytester.runpytest_subprocess("-q", "-s")
    result.assert_outcomes(passed=3)
    assert "sqlite+aiosqlite" in result.stdout.str()


def test_plugin_on_postgres(pytester: pytest.Pytester, pg_url: str) -> None:
    import psycopg
    from sqlalchemy.engine import make_url

    _example(pytester)
    result = pytester.runpytest_subprocess("-q", "-s", f"--conveyor-url={ADMIN_URL}")
    result.assert_outcomes(passed=3)
    found = re.search(r"URL (\S+)", result.stdout.str())
    assert found is not None
    database = make_url(found.group(1)).database
    assert database and database.startswith("conveyor_test_")
    admin = make_url(ADMIN_URL).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(admin) as conn:
        left = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchall()
    assert left == []  # dropped at the end of the session


def test_plugin_refuses_a_non_postgres_url(pytester: pytest.Pytester) -> None:
    _example(pytester)
    result = pytester.runpytest_subprocess("-q", "--conveyor-url=mysql://x@y/z")
    assert result.ret != 0
    assert "must be a postgresql:// URL" in result.stdout.str() + result.stderr.str()
