"""A command imports only what it uses: ``conveyor --help`` no database layer at
all, ``conveyor stats`` on SQLite none of the extras (the dashboard's web stack,
Prometheus, OpenTelemetry, the PostgreSQL driver, Alembic). Checked on the
modules a real ``python -X importtime -m conveyor.cli ...`` loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
)
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


def test_stats_on_sqlite_imports_none_of_the_extras(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with conveyor.connect_sync(url) as store:
        store.submit("t", queue="q")
    modules = imported("stats", "--url", url, cwd=tmp_path)
    assert "sqlalchemy" in modules and "conveyor.store.sqlite" in modules
    assert loaded(modules, EXTRAS) == []


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
