"""conveyor's pytest plugin, registered under the ``pytest11`` entry point: pytest
loads it by itself wherever conveyor is installed.

Fixtures:

* ``conveyor_url`` — the URL of an empty conveyor database for this test: a fresh
  SQLite file in the test's temporary directory; with ``--conveyor-url
  postgresql://user@host/db``, a database created on that server once per test
  session (emptied before each test, dropped at the end);
* ``conveyor_store`` — an open async store on it;
* ``conveyor_app`` — a :class:`conveyor.App` using that store. Override it in a
  ``conftest.py`` to point your own app at the test database::

      from myapp.tasks import app

      @pytest.fixture
      def conveyor_app(conveyor_store):
          with app.using(conveyor_store):
              yield app

  pytest finds ``myapp`` from a ``conftest.py`` beside it (the conftest's folder
  goes on ``sys.path``); from ``tests/conftest.py``, set ``pythonpath = ["."]``
  under ``[tool.pytest.ini_options]`` or install the project. Tasks a test
  defines on the app are unregistered when ``using`` ends (see
  :meth:`conveyor.App.using`), so they do not reach the next test.

* ``run_tasks`` — ``await run_tasks()`` runs ``conveyor_app``'s queued tasks
  inline until none is left and returns a :class:`conveyor.testing.Drained`
  (``.ran``, ``.succeeded``, ``.failed``); ``run_tasks(app)`` for another app.

The async fixtures need pytest-asyncio (``pip install pytest-asyncio``).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import conveyor
from conveyor.app import App
from conveyor.schema import metadata
from conveyor.store.base import TaskStore
from conveyor.testing import Drained
from conveyor.testing import run_tasks as drain

try:
    import pytest_asyncio

    HAVE_PYTEST_ASYNCIO = True
except ImportError:  # pragma: no cover - depends on the environment
    HAVE_PYTEST_ASYNCIO = False

RunTasks = Callable[..., Awaitable[Drained]]


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--conveyor-url``: run the conveyor fixtures on a PostgreSQL server."""
    group = parser.getgroup("conveyor")
    group.addoption(
        "--conveyor-url",
        default=None,
        help=(
            "PostgreSQL server for the conveyor_store fixture, e.g. "
            "postgresql://postgres@127.0.0.1/postgres: a database is created there "
            "for the test session and dropped after it (default: a SQLite file per test)."
        ),
    )


def _admin_dsn(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def _conveyor_server_database(pytestconfig: pytest.Config) -> Iterator[str | None]:
    """With ``--conveyor-url``: a migrated database made for this session."""
    server = pytestconfig.getoption("conveyor_url")
    if not server:
        yield None
        return
    from sqlalchemy.engine import make_url

    parsed = make_url(server)
    if parsed.get_backend_name() != "postgresql":
        raise pytest.UsageError(
            f"--conveyor-url must be a postgresql:// URL (got {parsed.drivername}); "
            "leave it out to test on SQLite"
        )
    try:
        import psycopg
    except ImportError:
        raise pytest.UsageError(
            "--conveyor-url needs the PostgreSQL driver: pip install 'conveyor[postgres]'"
        ) from None
    name = f"conveyor_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(_admin_dsn(server), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = parsed.set(database=name).render_as_string(hide_password=False)

    async def migrate() -> None:
        async with conveyor.connect(url, listen=False):
            pass

    try:
        asyncio.run(migrate())
        yield url
    finally:
        with psycopg.connect(_admin_dsn(server), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _empty(url: str) -> None:
    import psycopg

    # Children before parents; one transaction. The protocol version (conveyor_meta)
    # and Alembic's version table stay.
    with psycopg.connect(_admin_dsn(url)) as conn:
        for table in reversed(metadata.sorted_tables):
            if table.name != "conveyor_meta":
                conn.execute(f"DELETE FROM {table.name}")


@pytest.fixture
def conveyor_url(_conveyor_server_database: str | None, tmp_path: Path) -> str:
    """The URL of an empty conveyor database for this test."""
    if _conveyor_server_database is None:
        return f"sqlite:///{tmp_path / 'conveyor.db'}"
    _empty(_conveyor_server_database)
    return _conveyor_server_database


if HAVE_PYTEST_ASYNCIO:

    @pytest_asyncio.fixture
    async def conveyor_store(conveyor_url: str) -> AsyncIterator[TaskStore]:
        """An open async store on an empty database (see ``conveyor_url``)."""
        async with conveyor.connect(conveyor_url) as store:
            yield store

else:  # pragma: no cover - depends on the environment

    @pytest.fixture
    def conveyor_store() -> None:
        """Needs pytest-asyncio."""
        pytest.fail(
            "the conveyor_store fixture needs pytest-asyncio: pip install pytest-asyncio",
            pytrace=False,
        )


@pytest.fixture
def conveyor_app(conveyor_store: TaskStore) -> Iterator[App]:
    """An empty :class:`conveyor.App` on ``conveyor_store``; override it to use your own."""
    app = App(conveyor_store.url)
    with app.using(conveyor_store):
        yield app


@pytest.fixture
def run_tasks(conveyor_app: App) -> RunTasks:
    """``await run_tasks(app=conveyor_app, *, queues=None, group=None)``: run the
    app's queued tasks inline until none is left; see :func:`conveyor.testing.run_tasks`."""

    async def run(app: App | None = None, **options: Any) -> Drained:
        return await drain(conveyor_app if app is None else app, **options)

    return run
