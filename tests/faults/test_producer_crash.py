"""A producer killed with ``kill -9`` inside ``submit_many`` leaves all of its batch or
none of it, never part of it (SPEC §3.1), on both backends; on SQLite the file
stays consistent (``PRAGMA integrity_check``)."""

from __future__ import annotations

import random
import sqlite3
import time
from pathlib import Path

import pytest
from _faultkit import Figures, spawn, stop_all
from sqlalchemy.engine import make_url

import conveyor

BATCH = 3000
ROUNDS = 4


def _count(url: str, queue: str) -> int:
    with conveyor.connect_sync(url) as store:
        stats = store.stats(queue)
    return sum(stats[0].counts.values()) if stats else 0


def _integrity(url: str) -> str:
    path = make_url(url).database
    assert path is not None
    with sqlite3.connect(path) as conn:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])


def _run_batch(url: str, queue: str, tmp_path: Path, kill_after: float | None) -> float | None:
    """One batch child; killed ``kill_after`` seconds into ``submit_many`` (None: let it
    finish). The seconds ``submit_many`` took when it reported the batch done before
    it died, else None."""
    child = spawn("batch", url, queue, BATCH, logdir=tmp_path, log=f"batch-{queue}.log")
    try:
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        assert line == "begin", (tmp_path / f"batch-{queue}.log").read_text()
        if kill_after is not None:
            time.sleep(kill_after)
            child.kill()
        child.wait(120)
        done = child.stdout.read().split()
        return float(done[1]) if done[:1] == ["done"] else None
    finally:
        stop_all([child], timeout=0)


@pytest.mark.timeout(240)
def test_producer_killed_inside_submit_many(backend: str, store_url: str, tmp_path: Path) -> None:
    figures = Figures(scenario=f"producer_kill_{backend}", injected="kill -9 inside submit_many")
    took = _run_batch(store_url, "calibrate", tmp_path, None)
    assert took is not None
    assert _count(store_url, "calibrate") == BATCH
    rng = random.Random(11)
    outcomes = []
    for r in range(ROUNDS):
        queue = f"crash{r}"
        reported = _run_batch(store_url, queue, tmp_path, rng.uniform(0.05, 0.6) * took) is not None
        if backend == "postgres":
            time.sleep(0.5)  # the server notices the dead client and rolls back
        found = _count(store_url, queue)
        outcomes.append({"found": found, "reported_done": reported})
        assert found in (0, BATCH), f"round {r}: {found} of {BATCH} tasks: a partial batch"
        if reported:
            assert found == BATCH, "a batch reported done must be all there"
        if backend == "sqlite":
            assert _integrity(store_url) == "ok"
    figures.tasks = BATCH * ROUNDS
    figures.lost = 0
    figures.extra = {
        "batch": BATCH,
        "rounds": outcomes,
        "killed_in_flight": sum(1 for o in outcomes if o["found"] == 0),
        "calibration_s": round(took, 2),
    }
    figures.show()
    # The kills landed inside the transaction at least once (the point of the test).
    assert figures.extra["killed_in_flight"] >= 1
    # And the store takes new work afterwards.
    with conveyor.connect_sync(store_url) as store:
        task = store.submit("after", queue="crash-after")
        [claimed] = store.claim("crash-after", worker_id="w")
        assert claimed.id == task.id


def _caller_rows(url: str, queue: str) -> int:
    from sqlalchemy import create_engine, text

    driver = "postgresql+psycopg" if url.startswith("postgresql") else "sqlite"
    engine = create_engine(make_url(url).set(drivername=driver))
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    text("SELECT count(*) FROM caller_rows WHERE queue = :q"), {"q": queue}
                ).scalar_one()
            )
    finally:
        engine.dispose()


def _run_txbatch(url: str, queue: str, tmp_path: Path, kill: str) -> None:
    """One caller transaction: killed inside submit_many (``"submitting"``), after it
    and before the commit (``"before_commit"``), or let to commit (``"commit"``)."""
    child = spawn("txbatch", url, queue, 2000, logdir=tmp_path, log=f"tx-{queue}.log")
    try:
        assert child.stdout is not None and child.stdin is not None
        log = tmp_path / f"tx-{queue}.log"
        assert child.stdout.readline().strip() == "begin", log.read_text()
        if kill == "submitting":
            time.sleep(0.05)
            child.kill()
        else:
            line = child.stdout.readline().strip()
            assert line == "submitted", log.read_text()
            if kill == "before_commit":
                child.kill()
            else:
                child.stdin.write("commit\n")
                child.stdin.flush()
        child.wait(120)
    finally:
        stop_all([child], timeout=0)


@pytest.mark.timeout(240)
def test_crash_inside_the_callers_transaction(backend: str, store_url: str, tmp_path: Path) -> None:
    figures = Figures(
        scenario=f"caller_transaction_kill_{backend}",
        injected="kill -9 inside the caller's transaction (during submit_many, before commit)",
    )
    outcomes = {}
    for kill in ("submitting", "before_commit", "before_commit", "commit"):
        queue = f"tx-{kill}-{len(outcomes)}"
        _run_txbatch(store_url, queue, tmp_path, kill)
        if backend == "postgres":
            time.sleep(0.5)  # the server notices the dead client and rolls back
        found, rows = _count(store_url, queue), _caller_rows(store_url, queue)
        outcomes[queue] = {"tasks": found, "caller_rows": rows}
        if kill == "commit":
            assert (found, rows) == (2000, 1)
        else:
            assert (found, rows) == (0, 0), f"{kill}: {found} tasks, {rows} caller rows"
        if backend == "sqlite":
            assert _integrity(store_url) == "ok"
    figures.tasks = 2000 * len(outcomes)
    figures.extra = {"rounds": outcomes}
    figures.show()
