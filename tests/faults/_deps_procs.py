"""Child processes of the dependency fault tests (tests/faults/test_dependency_faults.py).

    python _deps_procs.py ack URL IDS GO       succeed each parent of IDS in order
    python _deps_procs.py sub URL IDS GO OUT   submit a child after each parent of IDS,
                                               its id appended to OUT
    python _deps_procs.py worker URL LOG       run the batch app (tasks ``part`` and
                                               ``report``), one JSON line per run in LOG

``IDS`` holds one parent id a line (already leased to worker ``w``); the
acknowledger and the submitter wait for the file ``GO`` (the start time), then
act on each parent at the same moment (:func:`_paced`).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Iterator
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


#: Seconds between two parents: both processes act on parent ``i`` at the same
#: moment, ``start + i * STEP``, so that each acknowledgement and its child's
#: submit meet (either may win).
STEP = 0.03


def _paced(go: str, ids: list[str], *, sweep: bool = False) -> Iterator[str]:
    """The ids, each when its moment comes (the start is written in ``GO``);
    ``sweep``: each a little later, by 0 to 15 ms in steps of 0.5 ms, so that
    some acknowledgements land inside the submit's transaction, whatever part
    of it reads the parent."""
    while not Path(go).exists() or not Path(go).read_text().strip():
        time.sleep(0.001)
    start = float(Path(go).read_text())
    for i, task_id in enumerate(ids):
        delay = start + i * STEP + (i % 30) * 0.0005 * sweep - time.time()
        if delay > 0:
            time.sleep(delay)
        yield task_id


async def ack(url: str, ids: list[str], go: str) -> None:
    async with conveyor.connect(url) as store:
        await store.get(ids[0])  # connected before the start
        for task_id in _paced(go, ids, sweep=True):
            await store.succeed(task_id, worker_id="w")


async def sub(url: str, ids: list[str], go: str, out: str) -> None:
    async with conveyor.connect(url) as store:
        await store.get(ids[0])
        for task_id in _paced(go, ids):
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
