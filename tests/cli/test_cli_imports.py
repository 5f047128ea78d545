"""A command imports only what it uses: ``conveyor --help`` no database layer at
all, ``conveyor stats`` on SQLite none of the extras (the dashboard's web stack,
Prometheus, OpenTelemetry, the PostgreSQL driver, Alembic, the worker's
supervisor, Pydantic for typer's check of values that are strings already).
Checked on the modules a real ``python -X importtime -m conveyor.cli ...`` loads."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

import conveyor

#: Imported by no command that does not need them.
EXTRAS = (
    "psycopg",
    "alembic",
    "starlette",
    "uvicorn",
    "jinja2",
    "prometheus_client",
    "opentelemetry",
    "cronsim",
    "conveyor.web",
    "conveyor.worker.loop",
    "conveyor.worker.context",
    "conveyor.schedule",
    "conveyor.metrics",
    "conveyor.worker.supervisor",
    "conveyor.worker.signals",
    # typer checks option values with Pydantic; conveyor.cli._coercion spares the
    # strings and flags, which are all `stats` and `--help` are given.
    "pydantic",
    "pydantic_core",
)
#: Imported by no command on SQLite: the async layer (and the ORM it imports),
#: which the store only needs where it runs on an event loop of its own; a
#: command's SQLite store runs its transactions on a blocking connection
#: (conveyor.store.sqlite.oneshot).
ASYNC_LAYER = ("sqlalchemy.ext.asyncio", "sqlalchemy.orm", "aiosqlite", "greenlet")
#: ... and not by a command that opens no database.
DATABASE = ("sqlalchemy", "aiosqlite", "sqlite3", "greenlet", "conveyor.store", "conveyor.app")


def imported(*args: str, cwd: Path) -> set[str]:
    """The modules ``conveyor ARGS`` imports, from Python's own import log."""
    env = {k: v for k, v in os.environ.items() if k not in ("CONVEYOR_URL", "CONVEYOR_APP")}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "conveyor.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


def loaded(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in packages))


@pytest.mark.parametrize("args", [("--help",), ("--version",), ("list", "--help")])
def test_help_imports_no_database_layer(args: tuple[str, ...], tmp_path: Path) -> None:
    modules = imported(*args, cwd=tmp_path)
    assert "conveyor.cli" in modules  # the log is read right
    assert loaded(modules, EXTRAS + DATABASE) == []


@pytest.mark.parametrize(
    "args", [("stats",), ("list",), ("get", "TASK"), ("stats", "--queue", "q", "--json")]
)
def test_reads_on_sqlite_import_no_extras_nor_the_async_layer(
    args: tuple[str, ...], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with conveyor.connect_sync(url) as store:
        task = store.submit("t", queue="q")
    args = tuple(task.id if a == "TASK" else a for a in args)
    modules = imported(*args, "--url", url, cwd=tmp_path)
    assert "sqlalchemy" in modules and "conveyor.store.sqlite.oneshot" in modules
    assert loaded(modules, EXTRAS + ASYNC_LAYER) == []


def test_a_write_on_sqlite_imports_no_async_layer(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    modules = imported("submit", "t", "--queue", "q", "--url", url, cwd=tmp_path)
    assert "conveyor.store.sqlite.oneshot" in modules
    assert loaded(modules, ASYNC_LAYER) == []
    with conveyor.connect_sync(url) as store:
        (report,) = store.stats("q")
    assert report.counts["queued"] == 1


def test_import_conveyor_is_light() -> None:
    script = (
        "import sys, conveyor\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'aiosqlite'))\n"
        "assert not heavy, heavy\n"
        "import conveyor.connect\n"
        "assert callable(conveyor.connect) and conveyor.connect.__module__ == 'conveyor.connect'\n"
        "assert conveyor.App.__name__ == 'App' and 'sqlalchemy' in sys.modules\n"
        "from conveyor import Context, SyncStore, TaskStore\n"
        "from conveyor.connect import SyncStore as Same\n"
        "assert Same is SyncStore\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_stats_queue_option_keeps_the_string_given(tmp_path: Path) -> None:
    """The direct check of string options changes no value: a ``--queue`` that
    looks like a number or a flag's word stays the string given."""
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with conveyor.connect_sync(url) as store:
        store.submit("t", queue="007")
    done = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "stats", "--url", url, "--queue", "007", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)
    assert report["queue"] == "007" and report["counts"]["queued"] == 1


def test_command_annotations_are_not_strings() -> None:
    """typer reads every command's annotations on every command line; strings
    (``from __future__ import annotations``) it would compile and evaluate."""
    from conveyor.cli import cli

    def callbacks(app: typer.Typer) -> list[Any]:
        found = [info.callback for info in app.registered_commands]
        if app.registered_callback is not None:
            found.append(app.registered_callback.callback)
        for group in app.registered_groups:
            assert group.typer_instance is not None
            found += callbacks(group.typer_instance)
        return found

    functions = callbacks(cli)
    assert len(functions) > 10
    for function in functions:
        strings = [k for k, a in inspect.get_annotations(function).items() if isinstance(a, str)]
        assert strings == [], f"{function.__module__}.{function.__qualname__}: {strings}"


def test_a_value_not_yet_a_string_gets_typers_own_check() -> None:
    from conveyor.cli import cli
    from conveyor.cli._coercion import _PlainValue, check_plain_value_directly

    stats = typer.main.get_command(cli).commands["stats"]  # type: ignore[attr-defined]
    url = next(p for p in stats.params if p.name == "url")
    if not hasattr(url, "type_descriptor"):
        pytest.skip("this typer checks values with click's types")
    check_plain_value_directly(url)
    assert isinstance(url._runtime_param, _PlainValue)
    ctx = stats.make_context("stats", [])
    assert url._runtime_param.coerce("sqlite:///a.db", param=url, ctx=ctx) == "sqlite:///a.db"
    assert url._runtime_param.coerce(None, param=url, ctx=ctx) is None
    assert isinstance(url._runtime_param, _PlainValue)
    # bytes: typer's own check decodes them, and from then on is the option's check.
    assert url._runtime_param.coerce(b"sqlite:///b.db", param=url, ctx=ctx) == "sqlite:///b.db"
    assert not isinstance(url._runtime_param, _PlainValue)


def test_an_int_option_checks_directly_only_its_in_range_ints() -> None:
    """``list --limit`` (1..10000, default 50): the default passes as it is; a
    number typed on the command line (a string) and an int out of range get
    typer's own check, which converts the one and refuses the other."""
    from conveyor.cli import cli
    from conveyor.cli._coercion import _PlainValue, check_plain_value_directly

    listing = typer.main.get_command(cli).commands["list"]  # type: ignore[attr-defined]
    limit = next(p for p in listing.params if p.name == "limit")
    if not hasattr(limit, "type_descriptor"):
        pytest.skip("this typer checks values with click's types")
    check_plain_value_directly(limit)
    assert isinstance(limit._runtime_param, _PlainValue)
    ctx = listing.make_context("list", [])
    for value in (50, 1, 10_000):
        assert limit._runtime_param.coerce(value, param=limit, ctx=ctx) == value
    assert isinstance(limit._runtime_param, _PlainValue)
    with pytest.raises(Exception, match="10000"):
        limit._runtime_param.coerce(10_001, param=limit, ctx=ctx)
    assert not isinstance(limit._runtime_param, _PlainValue)
    assert limit._runtime_param.coerce("7", param=limit, ctx=ctx) == 7


def test_list_refuses_a_limit_out_of_range(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with conveyor.connect_sync(url) as store:
        store.submit("t", queue="q")
    for limit, code in (("0", 2), ("10001", 2), ("1", 0)):
        done = subprocess.run(
            [sys.executable, "-m", "conveyor.cli", "list", "--url", url, "--limit", limit],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == code, (limit, done.stderr)
