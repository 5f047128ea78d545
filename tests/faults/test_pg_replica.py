"""Reads from a streaming replica (``read_url``): a private primary and a hot
standby made from it with ``pg_basebackup -R``, replay paused on the standby to
tell the two apart. The inspection reads (list, stats, groups, workers, streams)
show what the standby has replayed; get() and wait() read the primary, so a
caller sees its own writes, unless it asks for the replica."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from _pgcluster import Cluster, ClusterUnavailable

import conveyor
from conveyor.errors import InvalidArgument

pytestmark = pytest.mark.xdist_group("pg_replica")


class Pair:
    """A primary, its standby, and the database's URL on each."""

    def __init__(self, primary: Cluster, standby: Cluster, database: str) -> None:
        self.primary = primary
        self.standby = standby
        self.primary_url = primary.url(database)
        self.standby_url = standby.url(database)

    def replay(self, on: bool) -> None:
        """Pause or resume WAL replay on the standby (and wait until it is so)."""
        with psycopg.connect(self.standby.admin_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_wal_replay_resume()" if on else "SELECT pg_wal_replay_pause()")
            deadline = time.monotonic() + 30
            while not on:
                row = conn.execute("SELECT pg_get_wal_replay_pause_state()").fetchone()
                if row is not None and row[0] == "paused":
                    return
                assert time.monotonic() < deadline, "the standby did not pause its replay"
                time.sleep(0.05)

    def caught_up(self) -> None:
        """Wait until the standby has replayed everything the primary wrote so far."""
        with psycopg.connect(self.primary.admin_dsn, autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        with psycopg.connect(self.standby.admin_dsn, autocommit=True) as conn:
            deadline = time.monotonic() + 30
            while True:
                done = conn.execute(
                    "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (row[0],)
                ).fetchone()
                if done is not None and done[0]:
                    return
                assert time.monotonic() < deadline, "the standby did not catch up"
                time.sleep(0.05)


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    """A private primary (its database migrated) and a streaming replica of it."""
    try:
        primary = Cluster()
    except ClusterUnavailable as exc:  # pragma: no cover - depends on the machine
        if __import__("os").environ.get("CI") == "true":
            pytest.fail(f"the replica tests need private PostgreSQL clusters: {exc}")
        pytest.skip(str(exc))
    standby: Cluster | None = None
    try:
        primary.start()
        url = primary.create_database("conveyor_replica")

        async def migrate() -> None:
            async with conveyor.connect(url, listen=False):
                pass

        asyncio.run(migrate())
        standby = Cluster(standby_of=primary)
        standby.start()
        yield Pair(primary, standby, "conveyor_replica")
    finally:
        if standby is not None:
            standby.destroy()
        primary.destroy()


async def test_inspection_reads_come_from_the_replica_and_get_and_wait_from_the_primary(
    pair: Pair,
) -> None:
    async with conveyor.connect(pair.primary_url, read_url=pair.standby_url) as store:
        await store.subscribe("rq", "audit")
        pair.caught_up()
        before = {s.queue: s for s in await store.stats()}
        pair.replay(False)
        try:
            task = await store.submit("job", queue="rq", payload={"n": 1})
            await store.subscribe("rq", "billing")
            # The caller's own write: get() reads the primary.
            assert (await store.get(task.id)) is not None
            # What the replica has not replayed yet is not in the inspection reads.
            assert task.id not in [t.id for t in (await store.list(queue="rq")).items]
            after = {s.queue: s for s in await store.stats()}
            assert after.get("rq") == before.get("rq")
            assert [g.name for g in await store.groups("rq")] == ["audit"]
            assert await store.get(task.id, replica=True) is None
            # wait() reads the primary: it sees the task finish while the replica lags.
            [held] = await store.claim("rq", worker_id="w")
            assert "w" not in [w.worker_id for w in await store.workers()]
            await store.succeed(held.id, worker_id="w", result=2, attempt=held.attempt)
            finished = await store.wait(task.id, timeout=10)
            assert finished.status == "succeeded"
        finally:
            pair.replay(True)
        pair.caught_up()
        listed = (await store.list(queue="rq")).items
        assert [t.id for t in listed] == [task.id] and listed[0].status == "succeeded"
        assert sorted(g.name for g in await store.groups("rq")) == ["audit", "billing"]
        replayed = await store.get(task.id, replica=True)
        assert replayed is not None and replayed.status == "succeeded"


async def test_the_replica_url_comes_from_the_environment(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONVEYOR_READ_URL", pair.standby_url)
    async with conveyor.connect(pair.primary_url, listen=False) as store:
        assert store.read_url is not None  # type: ignore[attr-defined]
        pair.replay(False)
        try:
            task = await store.submit("job", queue="envq")
            assert task.id not in [t.id for t in (await store.list(queue="envq")).items]
        finally:
            pair.replay(True)
        pair.caught_up()
        assert task.id in [t.id for t in (await store.list(queue="envq")).items]


def test_the_cli_reads_from_read_url(pair: Pair) -> None:
    def cli(*args: str) -> Any:
        done = subprocess.run(
            [sys.executable, "-m", "conveyor.cli", *args, "--url", pair.primary_url, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    async def submit() -> str:
        async with conveyor.connect(pair.primary_url, listen=False) as store:
            return (await store.submit("job", queue="cliq")).id

    pair.replay(False)
    try:
        task_id = asyncio.run(submit())
        on_replica = cli("list", "--queue", "cliq", "--read-url", pair.standby_url)
        assert task_id not in [t["id"] for t in on_replica["items"]]
        assert task_id in [t["id"] for t in cli("list", "--queue", "cliq")["items"]]
        queues = [s["queue"] for s in cli("stats", "--read-url", pair.standby_url)]
        assert "cliq" not in queues
    finally:
        pair.replay(True)


def test_a_read_url_is_a_postgres_option(tmp_path: object) -> None:
    with pytest.raises(InvalidArgument, match="read_url"):
        conveyor.connect(f"sqlite:///{tmp_path}/x.db", read_url="postgresql://h/db")
    with pytest.raises(InvalidArgument, match="read_url"):
        conveyor.connect("postgresql://h/db", read_url="sqlite:///x.db")
    with pytest.raises(InvalidArgument, match="replica"):
        asyncio.run(conveyor.connect(f"sqlite:///{tmp_path}/y.db").get("x", replica="yes"))  # type: ignore[arg-type]
