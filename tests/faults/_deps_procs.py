"""Child processes of the dependency fault tests (tests/faults/test_dependency_faults.py).

    python _deps_procs.py ack URL IDS GO       succeed each parent of IDS in order
    python _deps_procs.py sub URL IDS GO OUT   submit a child after each parent of IDS,
                                               its id appended to OUT
    python _deps_procs.py worker URL LOG       run the batch app (tasks ``part`` and
                                               ``report``), one JSON line per run in LOG

``IDS`` holds one parent id a line (already leased to worker ``w``); both the
acknowledger and the submitter wait for the file ``GO`` before starting, so
they run through the parents side by side.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import conveyor

CHILD_QUEUE = "race-children"
BATCH_QUEUE = "batch"

app = conveyor.App(os.environ.get("CONVEYOR_URL", "sqlite:///deps.db"))


def _append(path: str, line: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


@app.task(name="part", queue=BATCH_QUEUE)
async def part(ctx: conveyor.Context, n: int) -> int:
    """One task of the batch: a short sleep, its run recorded."""
    _append(os.environ["DEPS_LOG"], {"kind": "part", "id": ctx.task.id, "pid": os.getpid()})
    await asyncio.sleep(0.05)
    return n


@app.task(name="report", queue=BATCH_QUEUE)
async def report(ctx: conveyor.Context, day: str) -> None:
    """The batch's callback: records the summary it read."""
    summary = await ctx.batch_summary()
    assert summary is not None
    _append(
        os.environ["DEPS_LOG"],
        {
            "kind": "report",
            "id": ctx.task.id,
            "attempt": ctx.task.attempt,
            "day": day,
            "succeeded": len(summary.succeeded),
            "failed": len(summary.failed),
            "cancelled": len(summary.cancelled),
            "total": summary.total,
        },
    )


def _wait_for(go: str) -> None:
    while not Path(go).exists():
        time.sleep(0.001)


async def ack(url: str, ids: list[str], go: str) -> None:
    async with conveyor.connect(url) as store:
        await store.get(ids[0])  # connected before the start
        _wait_for(go)
        for task_id in ids:
            await store.succeed(task_id, worker_id="w")


async def sub(url: str, ids: list[str], go: str, out: str) -> None:
    async with conveyor.connect(url) as store:
        await store.get(ids[0])
        _wait_for(go)
        for task_id in ids:
            child = await store.submit("child", queue=CHILD_QUEUE, after=[task_id])
            _append(out, {"id": child.id, "parent": task_id, "status": child.status.value})


def main() -> None:
    role, url = sys.argv[1], sys.argv[2]
    if role == "worker":
        os.environ["DEPS_LOG"] = sys.argv[3]
        app.run_worker(queues=[BATCH_QUEUE], concurrency=4, lease=1.0, poll_interval=0.05, url=url)
        return
    ids = Path(sys.argv[3]).read_text().split()
    if role == "ack":
        asyncio.run(ack(url, ids, sys.argv[4]))
    else:
        asyncio.run(sub(url, ids, sys.argv[4], sys.argv[5]))


if __name__ == "__main__":
    main()
