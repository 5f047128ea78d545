"""What a worker holds (:class:`Held`, a stream's :class:`Run`) and how it records
an attempt's outcome (:class:`Recorder`): the success through the group commit,
a failure, a snooze or a hand-back, each fenced on the attempt and retried
through a database outage for as long as the lease may still be ours."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from conveyor.errors import (
    ConveyorError,
    InvalidArgument,
    LostLease,
    StoreUnavailable,
    TaskCancelled,
)
from conveyor.models import Status, Task
from conveyor.store.base import TaskStore
from conveyor.worker.group_commit import Acks
from conveyor.worker.heartbeats import Heartbeats
from conveyor.worker.logs import TaskLogger

log = logging.getLogger("conveyor.worker")

T = TypeVar("T")

# A final write that meets a database outage is retried for the lease's length
# (at least this many seconds): giving up sooner lets the lease run out and the
# task run again elsewhere, while a late write is harmless (it is fenced).
WRITE_RETRY_MIN = 6.0


@dataclass(eq=False)
class Run:
    """A stream run's hold on a slot. The run gives its slot up while the success
    of one of its tasks is written (the next task must wait for that write, but
    other work need not), and takes a slot again for its next task."""

    holding: bool = True
    left: int = 0  # its tasks still held by the worker (the stream is claimable at 0)


@dataclass(eq=False)
class Held:
    """A task this worker holds a lease on."""

    task: Task
    interval: float  # seconds between heartbeats
    next_beat: float  # monotonic time of the next heartbeat
    handler: asyncio.Future[Any] | None = None
    lost: bool = False
    cancelled: bool = False
    finishing: bool = False  # the outcome is being written; a LostLease then is ours
    beating: bool = False  # a heartbeat is in flight
    slot: bool = False  # runs alone in a slot, freed when its handler returns
    run: Run | None = None  # the stream run it belongs to
    acking: bool = False  # its handler returned; its success is being written
    outcome: str = "lost"  # for metrics and traces: succeeded, failed, retry, snoozed, lost
    error: BaseException | None = None

    _log: TaskLogger | None = field(default=None, init=False, repr=False)

    @property
    def log(self) -> TaskLogger:
        """Lines about this task name it (made on first use: most tasks log nothing
        at the default level)."""
        if self._log is None:
            self._log = TaskLogger(log, self.task)
        return self._log

    @property
    def extra(self) -> dict[str, Any]:
        """The task's log fields (``task_id``, ``task_name``, ``attempt``, ``queue``)."""
        return dict(self.log.extra or {})


class Recorder:
    """The final writes of one worker's attempts. ``let_go`` is told when a task
    handed back is no longer held."""

    def __init__(
        self,
        store: TaskStore,
        worker_id: str,
        group: str | None,
        acks: Acks,
        heartbeats: Heartbeats,
        let_go: Callable[[Held], None],
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.group = group
        self.acks = acks
        self.heartbeats = heartbeats
        self.let_go = let_go

    async def succeed(self, held: Held, result: Any) -> bool:
        task = held.task
        try:
            await self._write(held, lambda: self.acks.succeed(task, result))
        except InvalidArgument as exc:  # the result is not JSON
            return await self.fail(held, exc, retryable=False)
        except LostLease as exc:
            held.log.info("dropped at completion: %s", exc)
            return isinstance(exc, TaskCancelled)
        except (ConveyorError, OSError) as exc:
            held.log.error("could not record success (%s); the lease will run out", exc)
            return False
        held.outcome = "succeeded"
        return True

    async def fail(self, held: Held, error: BaseException, *, retryable: bool) -> bool:
        task = held.task
        try:
            after = await self._write(
                held,
                lambda: self.store.fail(
                    task.id,
                    worker_id=self.worker_id,
                    error=error,
                    retryable=retryable,
                    group=self.group,
                    attempt=task.attempt,
                ),
            )
        except LostLease as exc:
            held.log.info("dropped at failure: %s", exc)
            return isinstance(exc, TaskCancelled)
        except (ConveyorError, OSError) as exc:
            held.log.error("could not record failure (%s); the lease will run out", exc)
            return False
        held.outcome, held.error = ("retry" if after.status is Status.QUEUED else "failed"), error
        if after.status is Status.QUEUED:
            held.log.info("will retry at %s", after.run_at.isoformat())
            return False
        held.log.warning("failed for good: %s", after.error and after.error.get("message"))
        return True

    async def snooze(self, held: Held, delay: float) -> bool:
        """The handler asked to run again in ``delay`` seconds (no attempt spent)."""
        task = held.task
        try:
            after = await self._write(
                held,
                lambda: self.store.snooze(
                    task.id,
                    worker_id=self.worker_id,
                    delay=delay,
                    group=self.group,
                    attempt=task.attempt,
                ),
            )
        except LostLease as exc:
            held.log.info("dropped at snooze: %s", exc)
            return isinstance(exc, TaskCancelled)
        except (ConveyorError, OSError) as exc:
            held.log.error("could not snooze (%s); the lease will run out", exc)
            return False
        held.outcome = "snoozed"
        held.log.info("snoozed: runs again at %s, no attempt spent", after.run_at.isoformat())
        return False

    async def _write(self, held: Held, call: Callable[[], Awaitable[T]]) -> T:
        """A final write, retried through a database outage for as long as the
        lease may still be ours (the heartbeats keep renewing it once the database
        is back; past it, recovery hands the task to others and the fence refuses
        the late write)."""
        held.finishing = True
        pause = 0.1
        give_up: float | None = None
        while True:
            try:
                return await call()
            except StoreUnavailable as exc:
                now = time.monotonic()
                if give_up is None:
                    give_up = now + max(self.heartbeats.lease_for(held.task.queue), WRITE_RETRY_MIN)
                if now >= give_up:
                    raise
                held.log.warning("write failed (%s); retrying", exc)
                await asyncio.sleep(min(pause, give_up - now))
                pause = min(pause * 2, 2.0)

    async def release(self, held: Held) -> None:
        task = held.task
        held.finishing = True
        try:
            await self.store.release(
                task.id, worker_id=self.worker_id, group=self.group, attempt=task.attempt
            )
            held.log.info("handed back")
        except LostLease:
            pass  # finished, recovered or cancelled meanwhile: nothing to hand back
        except (ConveyorError, OSError) as exc:
            held.log.warning("could not hand back (%s); the lease will run out", exc)
        finally:
            self.let_go(held)


__all__ = ["WRITE_RETRY_MIN", "Held", "Recorder", "Run"]
