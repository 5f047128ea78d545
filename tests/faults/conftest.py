"""Fault scenarios: every test here carries the ``faults`` marker (run alone with
``pytest -m faults``), and the Postgres ones share one private, throwaway cluster
(the failover ones a private Patroni cluster of three)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from _patroni import PatroniCluster
from _pgcluster import Cluster, ClusterUnavailable

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.faults)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """A private PostgreSQL server on its own port, started for this test run; the
    tests may stop, restart and kill it (never the shared server)."""
    try:
        cluster = Cluster()
    except ClusterUnavailable as exc:  # pragma: no cover - depends on the machine
        if os.environ.get("CI") == "true":
            pytest.fail(f"the fault tests need a private PostgreSQL cluster: {exc}")
        pytest.skip(str(exc))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


def _unavailable(what: str, exc: Exception) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what}: {exc}")
    pytest.skip(str(exc))


@pytest.fixture(scope="session")
def patroni_cluster() -> Iterator[PatroniCluster]:
    """etcd and three Patroni members of PostgreSQL (synchronous mode), started for
    this test run on private ports; the tests kill and switch over its primary."""
    try:
        cluster = PatroniCluster()
    except ClusterUnavailable as exc:  # pragma: no cover - depends on the machine
        _unavailable("the failover tests need patroni, etcd and PostgreSQL", exc)
        raise
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()
