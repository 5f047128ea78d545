"""The long run: off by default, ``CONVEYOR_SOAK=1`` turns it on.

``CONVEYOR_SOAK_TASKS`` tasks (default 100 000) go through four worker processes
(two in queue mode, one per consumer group) with random failures (some retried,
some failing for good), cancels, retries of cancelled tasks, a group subscribed
halfway (``start="new"``) and ``maintain()`` with retention on. At the end the
counts reconcile exactly, for queue mode and for every group: every task
submitted is terminal or was purged by retention, and the store's own figures
(stats, maintenance history) agree with the test's.
``CONVEYOR_SOAK_BACKENDS`` (default ``postgres``) picks the backends.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
from _faultkit import SOAK_QUEUE, Figures, spawn, stop_all, unhandled_output

import conveyor
from conveyor import SyncStore

ENABLED = os.environ.get("CONVEYOR_SOAK") == "1"
TASKS = int(os.environ.get("CONVEYOR_SOAK_TASKS", "100000"))
BACKENDS = os.environ.get("CONVEYOR_SOAK_BACKENDS", "postgres").split(",")
BATCH = 1000
RETENTION = 20.0  # seconds after which finished tasks are purged
TERMINAL = ("succeeded", "failed", "cancelled", "evicted")

pytestmark = pytest.mark.skipif(not ENABLED, reason="the soak test runs with CONVEYOR_SOAK=1")


def _roll(n: int, salt: str) -> float:
    digest = hashlib.sha256(f"{salt}:{n}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _all_tasks(store: SyncStore, group: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    cursor = None
    while True:
        page = store.list(queue=SOAK_QUEUE, group=group, limit=1000, cursor=cursor)
        out.update({t.id: t.status.value for t in page.items})
        cursor = page.next_cursor
        if cursor is None:
            return out


def _busy(store: SyncStore) -> int:
    [stats] = store.stats(SOAK_QUEUE)
    busy = stats.counts.get("queued", 0) + stats.counts.get("running", 0)
    return busy + sum(g.lag for g in stats.groups.values())


@pytest.mark.timeout(7200)
def test_soak(backend: str, store_url: str, tmp_path: Path) -> None:
    if backend not in BACKENDS:
        pytest.skip(f"CONVEYOR_SOAK_BACKENDS={','.join(BACKENDS)}")
    rng = random.Random(2026)
    began = time.monotonic()
    with conveyor.connect_sync(store_url) as store:
        store.configure_queue(SOAK_QUEUE, retention=RETENTION, max_attempts=3, backoff=0.2)
        store.subscribe(SOAK_QUEUE, "audit", start="all")
        workers = [
            spawn(
                "soakworker",
                store_url,
                tmp_path,
                f"q{i}",
                "-",
                logdir=tmp_path,
                log=f"worker-q{i}.log",
            )
            for i in range(2)
        ]
        workers += [
            spawn(
                "soakworker",
                store_url,
                tmp_path,
                name,
                name,
                logdir=tmp_path,
                log=f"worker-{name}.log",
            )
            for name in ("audit",)
        ]
        submitted: list[str] = []
        after_late: set[str] = set()
        cancelled = retried = retry_missed = 0
        late_subscribed = False
        try:
            for start in range(0, TASKS, BATCH):
                requests = []
                for n in range(start, min(start + BATCH, TASKS)):
                    part = f"s{n % 16}" if n % 4 == 0 else None
                    kwargs = {
                        "n": n,
                        "flaky": _roll(n, "flaky") < 0.05,
                        "doomed": _roll(n, "doomed") < 0.002,
                    }
                    requests.append(
                        {
                            "name": "soak",
                            "payload": {"kwargs": kwargs},
                            "queue": SOAK_QUEUE,
                            "partition": part,
                        }
                    )
                ids = [t.id for t in store.submit_many(requests)]
                submitted += ids
                if late_subscribed:
                    after_late.update(ids)
                if not late_subscribed and len(submitted) >= TASKS // 2:
                    store.subscribe(SOAK_QUEUE, "late", start="new")
                    late_subscribed = True
                    # Its worker starts only now: a worker refuses a group that is
                    # not subscribed (it never registers one on its own).
                    workers.append(
                        spawn(
                            "soakworker",
                            store_url,
                            tmp_path,
                            "late",
                            "late",
                            logdir=tmp_path,
                            log="worker-late.log",
                        )
                    )
                # Cancel ~1% of what is out there, and retry some of what was cancelled.
                for task_id in rng.sample(submitted[-5 * BATCH :], k=BATCH // 100):
                    if store.cancel(task_id) is not None:
                        cancelled += 1
                        if rng.random() < 0.2:
                            try:
                                again = store.retry(task_id)
                            except conveyor.ConveyorError:
                                again = None
                            if again is not None:
                                retried += 1
                            else:
                                retry_missed += 1
                while _busy(store) > 20 * BATCH:  # keep the backlog bounded
                    time.sleep(0.5)
            produced = time.monotonic() - began
            deadline = time.monotonic() + 3600
            while _busy(store) > 0:
                assert time.monotonic() < deadline, "the soak never drained"
                assert all(w.poll() is None for w in workers), "a worker died"
                time.sleep(1.0)
            drained = time.monotonic() - began
        finally:
            codes = stop_all(workers, timeout=60)
        history = store.maintenance_history(limit=10_000)
        assert len(history) < 10_000
        deleted = sum(int(h["deleted"]) for h in history)
        [stats] = store.stats(SOAK_QUEUE)
        modes: dict[str, Any] = {}
        expected = {"queue": set(submitted), "audit": set(submitted), "late": after_late}
        present_all = set(_all_tasks(store, None))
        purged_all = set(submitted) - present_all
        for mode, group in (("queue", None), ("audit", "audit"), ("late", "late")):
            statuses = _all_tasks(store, group)
            mine = expected[mode]
            terminal = sum(1 for i in mine if statuses.get(i) in TERMINAL)
            purged = len(mine & purged_all)
            counts = stats.counts if group is None else stats.groups[group].counts
            by_status = {s: sum(1 for i in mine if statuses.get(i) == s) for s in TERMINAL}
            modes[mode] = {
                "expected": len(mine),
                "terminal": terminal,
                "purged": purged,
                "by_status": by_status,
                "stats_counts": {k: v for k, v in counts.items() if v},
            }
            assert terminal + purged == len(mine), (mode, modes[mode])
            assert {k: v for k, v in counts.items() if v} == {
                k: v for k, v in by_status.items() if v
            }, (mode, modes[mode])
    figures = Figures(
        scenario=f"soak_{backend}",
        injected="random failures, cancels, retries, a late group, retention",
        tasks=len(submitted),
        processed=sum(m["terminal"] + m["purged"] for m in modes.values()),
        lost=sum(m["expected"] - m["terminal"] - m["purged"] for m in modes.values()),
        unhandled_log_lines=len(unhandled_output(tmp_path)),
        extra={
            "modes": modes,
            "purged_by_retention": len(purged_all),
            "maintenance_deleted": deleted,
            "cancelled": cancelled,
            "retried": retried,
            "retry_missed": retry_missed,
            "produce_s": round(produced, 1),
            "drain_s": round(drained, 1),
            "deliveries_per_s": round(
                (len(submitted) * 2 + len(after_late)) / max(drained, 1e-9), 1
            ),
            "worker_exit_codes": codes,
        },
    )
    figures.show()
    assert deleted == len(purged_all)
    assert figures.lost == 0
    assert figures.unhandled_log_lines == 0
    assert codes == [0] * len(workers)
