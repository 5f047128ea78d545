"""Shared fixtures: every store test runs against a real SQLite file and a real
PostgreSQL database.

PostgreSQL: ``CONVEYOR_TEST_PG_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``)
names a server and a database to connect to for administration; each test run
creates its own fresh database there and drops it at the end. Without a server
the Postgres tests skip locally, and fail under ``CI=true``.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

import conveyor
from _support import ADMIN_URL
from conveyor.store.base import TaskStore

# The tests name their databases. $CONVEYOR_URL wins over App(url), so one left set
# in the shell would send every App of the tests (and the processes they start)
# to that database; tests that want it set it themselves.
os.environ.pop("CONVEYOR_URL", None)
# Likewise a replica or a LISTEN URL left set would follow every Postgres store.
os.environ.pop("CONVEYOR_READ_URL", None)
os.environ.pop("CONVEYOR_LISTEN_URL", None)

BACKENDS = ["sqlite", "postgres"]
TABLES = (
    "conveyor_deliveries, conveyor_streams, conveyor_keys, conveyor_groups, "
    "conveyor_queues, conveyor_maintenance, conveyor_counts, conveyor_throughput, "
    "conveyor_totals, conveyor_tasks, conveyor_schedules, conveyor_waiters, conveyor_workers, "
    "conveyor_pauses, conveyor_group_claims, conveyor_dependencies, conveyor_batches, "
    "conveyor_rate_state"
)


def _psycopg_dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh database for this test run; its schema is migrated once."""
    try:
        import psycopg

        admin = psycopg.connect(_psycopg_dsn(ADMIN_URL), autocommit=True, connect_timeout=3)
    except Exception as exc:  # pragma: no cover - depends on the machine
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL is required in CI and did not answer: {exc}")
        pytest.skip(f"no PostgreSQL server: {exc}")
    name = f"conveyor_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    url = make_url(ADMIN_URL).set(database=name).render_as_string(hide_password=False)

    async def migrate() -> None:
        async with conveyor.connect(url):
            pass

    asyncio.run(migrate())
    try:
        yield url
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def _truncate(url: str) -> None:
    import psycopg

    # DELETE, not TRUNCATE: on these tiny tables it is ~10x faster (TRUNCATE rewrites
    # the catalog and syncs it), and it runs before every Postgres test. Children
    # come before parents in TABLES, so one transaction empties them all.
    with psycopg.connect(_psycopg_dsn(url)) as conn:
        for table in TABLES.split(", "):
            conn.execute(f"DELETE FROM {table}")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The backend under test: ``"sqlite"`` or ``"postgres"``."""
    return str(request.param)


@pytest.fixture
def store_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """An empty store's URL on the backend under test."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'conveyor.db'}"
    url = str(request.getfixturevalue("pg_url"))
    _truncate(url)
    return url


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[TaskStore]:
    """An open, empty async store."""
    async with conveyor.connect(store_url) as st:
        yield st


@pytest.fixture
def sync_store(store_url: str) -> Iterator[conveyor.SyncStore]:
    """An open, empty blocking store."""
    with conveyor.connect_sync(store_url) as st:
        yield st


@pytest.fixture
async def app(store_url: str) -> AsyncIterator[conveyor.App]:
    """An App on the empty store under test, closed at the end."""
    application = conveyor.App(store_url)
    try:
        yield application
    finally:
        await application.close()
