"""Commands that only read (and those that act on tasks that must exist) never
create or migrate conveyor's schema: on a database without it, or with an older
one, they say so, name ``conveyor migrate`` and exit 6; the database is left as
it was. Subprocesses, on both backends."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, inspect, pool, text
from sqlalchemy.engine import make_url

from _support import scratch_pg_database
from conveyor.migrations import HEAD_REVISION, SCRIPT_LOCATION, VERSION_TABLE

EXIT_NO_SCHEMA = 6
TASK_ID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


#: Every command that must not build the schema, with its arguments.
READERS: list[tuple[str, ...]] = [
    ("stats",),
    ("stats", "--json"),
    ("list",),
    ("get", TASK_ID),
    ("queue", "show", "emails"),
    ("schedules",),
    ("cancel", TASK_ID),
    ("retry", TASK_ID),
]


def cli(*args: str, url: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_URL"}
    return subprocess.run(
        [sys.executable, "-m", "conveyor.cli", *args, "--url", url],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def run_all(calls: list[tuple[str, ...]], url: str) -> list[subprocess.CompletedProcess[str]]:
    with ThreadPoolExecutor(max_workers=2) as workers:
        return list(workers.map(lambda args: cli(*args, url=url), calls))


def _engine(url: str) -> Engine:
    parsed = make_url(url)
    driver = "sqlite" if parsed.get_backend_name() == "sqlite" else "postgresql+psycopg"
    return create_engine(parsed.set(drivername=driver), poolclass=pool.NullPool)


def tables(url: str) -> set[str]:
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            return set(inspect(conn).get_table_names())
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def foreign_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An application's database: one table of its own, nothing of conveyor's."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'shop.db'}"
        make = _engine(url)
        with make.begin() as conn:
            conn.execute(text("CREATE TABLE orders (id INTEGER PRIMARY KEY)"))
        make.dispose()
        yield url
        return
    request.getfixturevalue("pg_url")  # skips (or fails in CI) without a server
    with scratch_pg_database("conveyor_foreign") as url:
        make = _engine(url)
        with make.begin() as conn:
            conn.execute(text("CREATE TABLE orders (id INTEGER PRIMARY KEY)"))
        make.dispose()
        yield url


def assert_asks_to_migrate(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == EXIT_NO_SCHEMA, (proc.args, proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "conveyor migrate" in lines[0] and "Traceback" not in proc.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_readers_on_a_database_without_conveyor(foreign_db: str) -> None:
    for proc in run_all(READERS, foreign_db):
        assert_asks_to_migrate(proc, "no conveyor schema here")
    assert tables(foreign_db) == {"orders"}


def test_the_dashboard_on_a_database_without_conveyor(foreign_db: str) -> None:
    # It fails at open, before it listens; before, it built the schema and served.
    proc = cli("dashboard", "--port", str(_free_port()), url=foreign_db, timeout=60)
    assert proc.returncode == EXIT_NO_SCHEMA, proc.stderr
    assert "no conveyor schema here" in proc.stderr and "conveyor migrate" in proc.stderr
    assert tables(foreign_db) == {"orders"}


def test_readers_on_an_older_conveyor_schema(foreign_db: str) -> None:
    engine = _engine(foreign_db)
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0003")
    finally:
        engine.dispose()
    stats, listing = run_all([("stats",), ("list",)], foreign_db)
    for proc in (stats, listing):
        assert_asks_to_migrate(proc, "is at revision 0003", f"needs {HEAD_REVISION}")
    engine = _engine(foreign_db)
    try:
        with engine.connect() as conn:
            found = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars()
            assert list(found) == ["0003"]  # still where it was
    finally:
        engine.dispose()
    # The way out the message names.
    migrated = cli("migrate", url=foreign_db)
    assert migrated.returncode == 0, migrated.stderr
    after = cli("stats", url=foreign_db)
    assert after.returncode == 0, after.stderr


def test_the_exit_code_is_documented() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "--help"], capture_output=True, text=True, timeout=60
    )
    assert "6 no conveyor schema" in " ".join(proc.stdout.split())
