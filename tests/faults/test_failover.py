"""Failover: the primary of a three-member Patroni cluster dies (``kill -9`` of its
postmaster) or is handed over (``patronictl switchover``) under running producers
and workers that reach the cluster through one libpq multi-host URL with
``target_session_attrs=read-write`` (issue 30 §1).

Two producers and four worker processes, each with its own store, run through the
fault; nothing restarts them. Patroni runs in synchronous mode, so a commit
returns only once the synchronous standby has it, and only that standby may be
promoted. Each scenario then checks and records: no acknowledged submit lost; no
task acknowledged as done lost (one would run again with no lost
acknowledgement to explain it); duplicate runs only from lost acknowledgements,
and no more of them than tasks were in flight at the fault; per-partition order;
the LISTEN connections back on the new primary and wake-ups by NOTIFY again; and
how long it took until the first task and until full throughput.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _faultkit import (
    QUEUE,
    Figures,
    check_delivery,
    drained,
    executions,
    first_completion_after,
    lost_ack_evidence,
    read_jsonl,
    spawn,
    statuses,
    stop_all,
    unhandled_output,
    until,
    wakeups,
)
from _patroni import Node, PatroniCluster

import conveyor

# With the other private-cluster scenarios, in one xdist process: one at a time,
# never beside another heavy fault test.
pytestmark = [pytest.mark.failover, pytest.mark.xdist_group("pg_cluster")]

WORKERS = 4
CONCURRENCY = 4
LEASE = 10.0
POLL = 8.0  # far longer than a wake-up we accept: quick pickups prove NOTIFY
PRODUCERS = (0, 1_000_000)  # first sequence numbers: their tasks and partitions apart
PRODUCE_S = 14.0  # each producer runs this long; the fault lands FAULT_AT s in
FAULT_AT = 4.0
RATE = 30.0  # tasks per second per producer at most
MIN_TASKS = 100
PARTITIONS = 4
LISTENER = "conveyor-listener"
BASELINE_S = 3.0  # throughput before the fault is measured over this long
WINDOW_S = 1.0  # full throughput: a window this long with...
SHARE = 0.8  # ...at least this share of the completions of one before the fault


def _listeners(cluster: PatroniCluster, db: str) -> int:
    """LISTEN connections to ``db`` on the current primary (0 while there is none)."""
    try:
        dsn = cluster.leader().dsn
    except AssertionError:
        return 0
    with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
            (db, LISTENER),
        ).fetchone()
    return int(row[0]) if row else 0


def _writable_elsewhere(url: str, old: Node) -> bool:
    """Whether the multi-host URL now reaches a primary other than ``old``."""
    with psycopg.connect(url, connect_timeout=2) as conn:
        row = conn.execute("SELECT inet_server_port(), pg_is_in_recovery()").fetchone()
    return row is not None and row[0] != old.pg_port and row[1] is False


def _finished(url: str) -> dict[str, float]:
    """Each finished task's id: when it finished (epoch seconds, the server's clock)."""
    found: dict[str, float] = {}
    with conveyor.connect_sync(url, listen=False) as store:
        cursor = None
        while True:
            page = store.list(queue=QUEUE, limit=1000, cursor=cursor)
            for task in page.items:
                if isinstance(task.finished_at, datetime):
                    found[task.id] = task.finished_at.timestamp()
            cursor = page.next_cursor
            if cursor is None:
                return found


def _in_flight(
    runs: list[dict[str, Any]], finished: dict[str, float], fault: float, promoted: float
) -> int:
    """Tasks in flight at the failover: a run of theirs had started before the new
    primary took writes, and their success was recorded only after the fault (or
    never): the most whose acknowledgement the failover can lose. Until the
    promotion, the old primary's backends outlive its postmaster for a moment and
    may still hand out claims, which (``durable_claims=False``, the default) commit
    without waiting for the standby, so the new primary may not have them."""
    started = {r["id"] for r in runs if r["t0"] <= promoted}
    return sum(1 for task_id in started if finished.get(task_id, float("inf")) > fault)


def _second_runs(
    runs: list[dict[str, Any]], evidence: set[tuple[str, str]], promoted: float
) -> tuple[int, int, int]:
    """Every successful run of a task after its first, by cause: (a lost
    acknowledgement: the worker logged that it could not record the earlier run's
    success; a lost claim: the earlier run began before the promotion and the later
    one has the same attempt number, so the new primary never had that claim
    (claims commit without waiting for the standby, ``durable_claims=False``);
    neither: a success recorded and then lost, which synchronous commits forbid)."""
    done: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        if run["ok"]:
            done.setdefault(run["id"], []).append(run)
    acks = claims = other = 0
    for task_id, its in done.items():
        for earlier, later in itertools.pairwise(sorted(its, key=lambda r: r["t0"])):
            if (task_id, str(earlier["attempt"])) in evidence:
                acks += 1
            elif earlier["t0"] <= promoted and later["attempt"] == earlier["attempt"]:
                claims += 1
            else:
                other += 1
    return acks, claims, other


def _full_throughput_after(runs: list[dict[str, Any]], moment: float) -> float | None:
    """Seconds from ``moment`` to the end of the first :data:`WINDOW_S` window after
    it with at least :data:`SHARE` of the handler runs of a window before it."""
    ends = sorted(r["t1"] for r in runs)
    baseline = sum(1 for t in ends if moment - BASELINE_S <= t < moment) / BASELINE_S
    if baseline <= 0:
        return None
    want = SHARE * baseline * WINDOW_S
    start = moment
    while start < (ends[-1] if ends else moment):
        if sum(1 for t in ends if start <= t < start + WINDOW_S) >= want:
            return start + WINDOW_S - moment
        start += 0.1
    return None


def _outage(runs: list[dict[str, Any]], began: float, until: float) -> tuple[float, float]:
    """The longest pause between handler runs ending, from ``began`` until ``until``
    (the last submit): (when the last run before it ended, its length in seconds)."""
    ends = sorted(r["t1"] for r in runs if began - 1.0 <= r["t1"] <= until)
    if len(ends) < 2:
        return began, 0.0
    gap, start = max((b - a, a) for a, b in itertools.pairwise(ends))
    return start, gap


def _scenario(
    cluster: PatroniCluster,
    tmp_path: Path,
    name: str,
    injected: str,
    inject: Callable[[], dict[str, object]],
    planned: bool = False,
) -> Figures:
    """Run producers and workers through the multi-host URL, call ``inject()``
    :data:`FAULT_AT` seconds in, drain, and measure. The fault's moment is the
    call, or for a ``planned`` handover (which patronictl starts a moment after it
    is asked) when the work stopped: the start of the longest pause in completions."""
    cluster.wait_healthy(120)  # the previous scenario's old primary has rejoined
    db = f"failover_{name}_{uuid.uuid4().hex[:6]}"
    url = cluster.create_database(db)
    with conveyor.connect_sync(url, listen=False):
        pass  # migrated once, before the children start
    logdir = tmp_path / name
    logdir.mkdir()
    figures = Figures(scenario=name, injected=injected)
    workers = [
        spawn("worker", url, logdir, f"w{i}", LEASE, POLL, CONCURRENCY, logdir=logdir,
              log=f"worker-w{i}.log")
        for i in range(WORKERS)
    ]  # fmt: skip
    producers: list[Any] = []
    try:
        until(lambda: _listeners(cluster, db) == WORKERS, 60, "workers listening")
        # Load stays on until the recovery can be measured, however long the fault
        # takes to inject (a switchover under load: 10-15 s of patronictl).
        hold = logdir / "produce.hold"
        hold.touch()
        for first in PRODUCERS:
            producers.append(
                spawn("producer", url, logdir, PRODUCE_S, RATE, PARTITIONS, first,
                      logdir=logdir, log=f"producer-{first}.log")
            )  # fmt: skip
        for producer in producers:
            assert producer.stdout is not None and producer.stdout.readline().strip() == "ready"
        time.sleep(FAULT_AT)
        old = cluster.leader()
        began = time.time()
        figures.extra.update(inject())
        figures.extra["inject_s"] = round(time.time() - began, 2)
        until(lambda: _writable_elsewhere(url, old), 60, "a new primary")
        promoted = time.time()
        until(lambda: _listeners(cluster, db) == WORKERS, 60, "listeners on the new primary")
        listening = time.time()
        time.sleep(BASELINE_S + 2 * WINDOW_S)
        hold.unlink()
        submitted = 0
        for producer, first in zip(producers, PRODUCERS, strict=True):
            out, _ = producer.communicate(timeout=120)
            log = (logdir / f"producer-{first}.log").read_text()
            assert producer.returncode == 0, log
            result = json.loads(out.strip().splitlines()[-1])
            figures.extra[f"producer_{first}"] = result
            submitted += result["submitted"]
        figures.extra["submitted"] = submitted
        figures.extra["drain_s"] = round(until(lambda: drained(url), 90, "queue drained"), 2)
        figures.wakeup_s = round(wakeups(url, logdir, POLL), 3)
        cluster.wait_healthy(120)  # the old primary a replica again
        rejoined = time.time()
    finally:
        codes = stop_all(workers)
        stop_all(producers, timeout=0)
    runs = [r for r in executions(logdir) if r["seq"] >= 0]
    acked = [a for path in sorted(logdir.glob("acked*.jsonl")) for a in read_jsonl(path)]
    stopped, gap = _outage(runs, began, max(a["t"] for a in acked))
    fault = max(began, stopped) if planned else began
    figures.extra["outage_s"] = round(gap, 2)
    figures.extra["promoted_s"] = round(promoted - fault, 2)
    figures.listener_recovery_s = round(listening - fault, 2)
    figures.extra["rejoined_s"] = round(rejoined - fault, 2)
    check_delivery(figures, acked, runs, statuses(url), logdir)
    lost_acks, lost_claims, unexplained = _second_runs(runs, lost_ack_evidence(logdir), promoted)
    figures.extra["from_lost_acks"] = lost_acks
    figures.extra["from_lost_claims"] = lost_claims
    figures.extra["acked_done_lost"] = unexplained
    figures.extra["in_flight_at_fault"] = _in_flight(runs, _finished(url), fault, promoted)
    recovery = first_completion_after(runs, fault)
    figures.recovery_s = None if recovery is None else round(recovery, 2)
    full = _full_throughput_after(runs, fault)
    figures.extra["full_throughput_s"] = None if full is None else round(full, 2)
    figures.extra["worker_exit_codes"] = codes
    figures.show()
    for line in unhandled_output(logdir)[:5]:
        print(line[:400])
    assert codes == [0] * WORKERS, "workers must wind down cleanly after the failover"
    return figures


def _assert_guarantees(figures: Figures) -> None:
    assert figures.tasks >= MIN_TASKS
    assert figures.extra["submitted"] == figures.tasks
    assert figures.lost == 0, "an acknowledged submit was lost"
    assert figures.processed == figures.tasks
    assert figures.extra["acked_done_lost"] == 0, "a task acknowledged as done ran again"
    explained = figures.extra["from_lost_acks"] + figures.extra["from_lost_claims"]
    assert figures.duplicates == explained
    assert figures.duplicates <= figures.extra["in_flight_at_fault"], (
        "more tasks ran twice than were in flight at the failover"
    )
    assert figures.order_violations == 0
    assert figures.unhandled_log_lines == 0
    assert figures.wakeup_s is not None and figures.wakeup_s < POLL / 4, "wake-ups by NOTIFY"
    assert figures.extra["full_throughput_s"] is not None, "throughput never came back"


@pytest.mark.timeout(240)
def test_primary_killed_under_load(patroni_cluster: PatroniCluster, tmp_path: Path) -> None:
    def kill() -> dict[str, object]:
        node, pid = patroni_cluster.kill_primary()
        return {"killed": node.name, "postmaster_pid": pid}

    figures = _scenario(
        patroni_cluster,
        tmp_path,
        "failover_kill",
        "kill -9 of the primary's postmaster (Patroni, synchronous mode, 3 members)",
        kill,
    )
    _assert_guarantees(figures)


@pytest.mark.timeout(240)
def test_planned_switchover_under_load(patroni_cluster: PatroniCluster, tmp_path: Path) -> None:
    def switchover() -> dict[str, object]:
        candidate = patroni_cluster.sync_standby()
        patroni_cluster.switchover(candidate)
        return {"candidate": candidate.name}

    figures = _scenario(
        patroni_cluster,
        tmp_path,
        "failover_switchover",
        "patronictl switchover to the synchronous standby (3 members)",
        switchover,
        planned=True,
    )
    _assert_guarantees(figures)


async def test_a_listener_that_reaches_a_standby_keeps_trying(
    patroni_cluster: PatroniCluster,
) -> None:
    # A hot standby refuses LISTEN as read-only: that is a server to wait out (it
    # may be promoted; the next connect may find the primary), not a refusal for good.
    from conveyor.store.postgres.listen import Listener

    patroni_cluster.wait_healthy(120)
    standby = patroni_cluster.sync_standby()
    listener = Listener(
        standby.dsn, on_work=lambda q: None, on_done=lambda t: None, on_reset=lambda: None
    )
    await listener.start(wait=5.0)
    try:
        await asyncio.sleep(1.0)  # several attempts at the listener's backoff
        assert listener.state == "down"
    finally:
        await listener.stop()
