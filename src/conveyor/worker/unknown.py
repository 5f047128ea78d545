"""What a worker does with a claimed task whose name its app has no handler for.

Workers of different apps can share a database and a queue (two examples on one
``conveyor.db`` and ``default``), and in a rolling deploy old workers claim the
task types only new ones know. So by default (``unknown="release"``) such a task
is handed back, not failed: snoozed (queued again later, no attempt spent: its
``max_attempts`` grows by one) with a backoff that doubles with each claim of it,
from :data:`FIRST_DELAY` up to :data:`MAX_DELAY`, so workers that cannot run it do
not spin on it while one that can will take it within that time. The first such
task of each name is logged as a warning; later ones at debug level.
``unknown="fail"`` fails it for good instead (``code="unknown_task"``), as
earlier versions did.

The claim itself does not filter by name: names live on the task rows, not on
the delivery rows the claim reads by index, so a filter would join every
candidate and read past a backlog of foreign tasks on every claim — the hottest
statement, paying for a rare case. The backoff bounds that case instead.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Literal

from conveyor.errors import InvalidArgument
from conveyor.models import Task
from conveyor.outcomes import UnknownTask

log = logging.getLogger("conveyor.worker")

Policy = Literal["release", "fail"]
POLICIES = ("release", "fail")
FIRST_DELAY = 1.0  # seconds before a released unknown task is claimable again
MAX_DELAY = 60.0


def policy(value: object) -> Policy:
    """The ``unknown`` argument, checked."""
    if value == "release":
        return "release"
    if value == "fail":
        return "fail"
    raise InvalidArgument(
        "unknown",
        f'must be "release" (hand tasks with no handler back) or "fail" (fail them for '
        f"good), got {value!r}",
    )


def release_delay(task: Task) -> float:
    """Seconds until a released task of an unknown name is claimable again: doubles
    with each claim of it (its attempt number counts them), capped."""
    doublings = min(max(task.attempt - 1, 0), 16)  # past the cap long before 16
    return min(FIRST_DELAY * 2.0**doublings, MAX_DELAY)


class UnknownNames:
    """One worker's handling of task names its app does not know."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._warned: set[str] = set()

    def error(self, task: Task, known: Collection[str]) -> UnknownTask:
        """The error a task is failed with under ``unknown="fail"``."""
        names = ", ".join(sorted(known)) or "none"
        return UnknownTask(
            f"no task named {task.name!r} is registered in this worker's app (known: {names})"
        )

    def note_release(self, task: Task, delay: float, known: Collection[str]) -> None:
        """Log a release: a warning the first time for each name, then debug."""
        if task.name in self._warned:
            if log.isEnabledFor(logging.DEBUG):
                log.debug("no handler for %r: handed back for %.0f s", task.name, delay)
            return
        self._warned.add(task.name)
        log.warning(
            "no handler for task name %r in this worker's app (known: %s): handing such "
            "tasks back without spending an attempt, to run again in %g s or later, so a "
            "worker that knows the name can run them (--unknown fail fails them instead; "
            "this is logged once per name)",
            task.name,
            ", ".join(sorted(known)) or "none",
            delay,
        )


__all__ = ["MAX_DELAY", "POLICIES", "Policy", "UnknownNames", "policy", "release_delay"]
