"""Helpers for the test suites of applications that use conveyor.

:func:`run_tasks` runs an app's queued tasks inline, the way a test wants them:
one at a time, in this event loop, until nothing claimable is left (tasks that
tasks submit included), and reports what ran and what failed::

    report = await run_tasks(app)
    assert [t.name for t in report.succeeded] == ["myapp.tasks.send_email"]

The pytest fixtures (``conveyor_url``, ``conveyor_store``, ``conveyor_app``,
``run_tasks``) live in :mod:`conveyor.pytest_plugin`, which pytest loads by itself
once conveyor is installed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from conveyor.models import Status, Task
from conveyor.store.base import TaskStore

if TYPE_CHECKING:
    from conveyor.app import App
    from conveyor.worker.startup import Start
    from conveyor.worker.unknown import Policy


@dataclass
class Drained:
    """What :func:`run_tasks` ran: the tasks as they ended, in the order first claimed."""

    #: Every task that ran, as it stands now.
    ran: list[Task] = field(default_factory=list)

    @property
    def succeeded(self) -> list[Task]:
        """The tasks that succeeded (``task.result`` is what the handler returned)."""
        return [t for t in self.ran if t.status is Status.SUCCEEDED]

    @property
    def failed(self) -> list[Task]:
        """The tasks that did not succeed: failed for good, waiting for a retry
        (status ``queued``), or cancelled. ``task.error`` says why."""
        return [t for t in self.ran if t.status is not Status.SUCCEEDED]

    @property
    def names(self) -> list[str]:
        """The names of the tasks that ran, in order."""
        return [t.name for t in self.ran]


class _Recording:
    """The store, as the draining worker sees it: every claim is written down."""

    def __init__(self, store: TaskStore) -> None:
        self._store = store
        self.claimed: list[str] = []

    async def claim(self, *args: Any, **kwargs: Any) -> list[Task]:
        tasks = await self._store.claim(*args, **kwargs)
        self.claimed.extend(t.id for t in tasks)
        return tasks

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def run_tasks(
    app: App,
    *,
    queues: str | Sequence[str] | None = None,
    group: str | None = None,
    subscribe: Start | None = None,
    store: TaskStore | None = None,
    unknown: Policy = "fail",
) -> Drained:
    """Run the app's claimable tasks now, one at a time, until none is left.

    ``queues`` defaults to every queue the app's task functions use; ``store`` to
    the app's store; ``group`` consumes as that consumer group (subscribed
    already, or from ``subscribe``: ``"all"``, ``"new"`` or a datetime). Tasks a
    handler submits run too. A failed attempt whose retry waits out a backoff is not run
    again: it is reported in :attr:`Drained.failed` with its error. Periodic
    schedules are not ticked. A task whose name the app has no handler for fails
    for good (code ``unknown_task``), so the test sees why; ``unknown="release"``
    hands it back as a worker does by default.
    """
    target = store if store is not None else app.store
    if queues is None:
        queues = sorted({fn.queue for fn in app.tasks.values()}) or ["default"]
    recording = _Recording(target)
    worker = app.worker(
        queues,
        store=cast(TaskStore, recording),
        concurrency=1,
        group=group,
        subscribe=subscribe,
        unknown=unknown,
        poll_interval=0.05,
        grace=60,  # after the last claim, wait for acknowledgements still being written
        maintain_interval=None,
        worker_id="conveyor-testing",
    )
    worker.stop_when_idle = True
    worker.run_schedules = False
    await worker.run()
    report = Drained()
    seen: set[str] = set()
    for task_id in recording.claimed:
        if task_id in seen:
            continue
        seen.add(task_id)
        task = await target.get(task_id, group=group)
        if task is not None:
            report.ran.append(task)
    return report


__all__ = ["Drained", "run_tasks"]
