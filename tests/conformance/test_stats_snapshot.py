"""stats() is one consistent snapshot: while other processes claim, hand back,
finish and roll up tasks, every read's counts add up to the number of tasks."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from _support import finished, released
from conveyor.store.base import TaskStore

CHURN = str(Path(__file__).with_name("_stats_churn.py"))
TASKS = 300
SECONDS = 4.0


async def test_counts_add_up_under_concurrent_claims(store: TaskStore, store_url: str) -> None:
    queue = "snap"
    await store.subscribe(queue, "g")  # a group's counts must add up too
    # Queue mode never finishes most of them: max_attempts is high so the few
    # retries the churn makes never fail a task for good (that would still add up,
    # but the test wants tasks moving between queued and running all along).
    await store.submit_many(
        [{"name": "job", "queue": queue, "max_attempts": 1000} for _ in range(TASKS)]
    )
    roles = ["claim", "claim", "maintain"]
    argvs = [[CHURN, store_url, queue, role, str(SECONDS)] for role in roles]
    reads = 0
    wrong: list[tuple[str, int, dict[str, int]]] = []  # (group or "", sum, counts)
    with released(argvs, timeout=60) as procs:
        while any(proc.poll() is None for proc in procs):
            for stats in await store.stats(queue):
                views = {"": stats.counts} | {g: s.counts for g, s in stats.groups.items()}
                for view, counts in views.items():
                    if sum(counts.values()) != TASKS:
                        wrong.append((view, sum(counts.values()), counts))
            reads += 1
            await asyncio.sleep(0)
        outputs = finished(procs, timeout=60)
    calls = [json.loads(out.strip().splitlines()[-1])["calls"] for out in outputs]
    assert all(n > 0 for n in calls), calls
    assert reads > 20, "too few reads overlapped the churn to test anything"
    assert not wrong, f"{len(wrong)} of {reads} reads did not add up, e.g. {wrong[:3]}"
    # And at rest, after the churn: the same total, with something finished.
    [final] = await store.stats(queue)
    assert sum(final.counts.values()) == TASKS
    assert final.counts["succeeded"] > 0
