"""conveyor behind a real PgBouncer: every test here carries the ``pgbouncer``
marker (select with ``pytest -m pgbouncer``) and runs once per pool mode,
``transaction`` and ``session``.

The ``store_url`` fixture of tests/conftest.py is overridden: it names the test
run's database through a PgBouncer (``?pooler=<mode>``), so the conformance
tests imported by the ``test_conformance_*`` modules of this folder run
unchanged through it, their child processes included. Without pgbouncer the
tests skip, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _bouncer import Bouncer, BouncerUnavailable
from sqlalchemy.engine import make_url

from _support import ADMIN_URL

HERE = Path(__file__).parent
# The conformance modules, importable by their names (as pytest imports them).
sys.path.insert(0, str(HERE.parent / "conformance"))

MODES = ["transaction", "session"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.pgbouncer)
            # One PgBouncer pair per xdist worker process: keep this folder together.
            item.add_marker(pytest.mark.xdist_group("pgbouncer"))


@pytest.fixture(scope="session")
def bouncers() -> Iterator[dict[str, Bouncer]]:
    """A PgBouncer per pool mode, in front of the shared server, for this test run."""
    started: dict[str, Bouncer] = {}
    try:
        for mode in MODES:
            bouncer = Bouncer(mode, ADMIN_URL)
            started[mode] = bouncer
            bouncer.start()
    except BouncerUnavailable as exc:  # pragma: no cover - depends on the machine
        if os.environ.get("CI") == "true":
            pytest.fail(f"the PgBouncer tests need pgbouncer: {exc}")
        pytest.skip(str(exc))
    try:
        yield started
    finally:
        for bouncer in started.values():
            bouncer.stop()


@pytest.fixture(params=MODES)
def pool_mode(request: pytest.FixtureRequest) -> str:
    """PgBouncer's pool_mode under test."""
    return str(request.param)


@pytest.fixture
def bouncer(bouncers: dict[str, Bouncer], pool_mode: str) -> Bouncer:
    """The PgBouncer of the pool mode under test."""
    return bouncers[pool_mode]


@pytest.fixture
def backend() -> str:
    """Only PostgreSQL has a PgBouncer."""
    return "postgres"


@pytest.fixture
def store_url(store_url: str, bouncer: Bouncer) -> str:
    """The test run's database (emptied by tests/conftest.py's ``store_url``) through
    the PgBouncer under test."""
    return bouncer.url(str(make_url(store_url).database))


@pytest.fixture
def direct_url(store_url: str, pg_url: str) -> str:
    """The same (emptied) database straight on the server, past PgBouncer."""
    return pg_url
