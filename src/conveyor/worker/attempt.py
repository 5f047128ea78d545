"""One attempt of a claimed task: its handler found (or the task handed back or
failed when the app has none), called with a :class:`~conveyor.worker.context.Context`
under the task's timeout, and its outcome given to the
:class:`~conveyor.worker.recording.Recorder`; a lost lease told apart from a
stop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from conveyor.errors import LostLease, TaskCancelled
from conveyor.outcomes import Snooze, TaskTimeout, is_retryable
from conveyor.store.base import TaskStore
from conveyor.task_functions import TaskHost, payload_arguments
from conveyor.worker.context import Context, call_async, start_handler
from conveyor.worker.recording import Held, Recorder
from conveyor.worker.unknown import UnknownNames, release_delay

log = logging.getLogger("conveyor.worker")


class Attempts:
    """Runs one worker's attempts. ``returned(held, seconds)`` is told when a
    handler has returned its result, before the success is written (the worker
    gives the task's slot to other work then)."""

    def __init__(
        self,
        app: TaskHost,
        store: TaskStore,
        worker_id: str,
        group: str | None,
        unknown: UnknownNames,
        record: Recorder,
        returned: Callable[[Held, float], None],
    ) -> None:
        self.app = app
        self.store = store
        self.worker_id = worker_id
        self.group = group
        self.unknown = unknown
        self.record = record
        self.returned = returned

    async def run(self, held: Held) -> bool:
        """Run one task and record its outcome. True when the task reached a
        terminal status (so the next task of its stream may run)."""
        task = held.task
        fn = self.app.tasks.get(task.name)
        if fn is None:
            if self.unknown.policy == "fail":
                held.log.error("no handler is registered under this name")
                error = self.unknown.error(task, self.app.tasks)
                return await self.record.fail(held, error, retryable=False)
            delay = release_delay(task)
            self.unknown.note_release(task, delay, self.app.tasks)
            return await self.record.snooze(held, delay)
        args, kwargs = payload_arguments(task.payload)
        ctx = Context(
            task,
            host=self.app,
            store=self.store,
            worker_id=self.worker_id,
            group=self.group,
            loop=asyncio.get_running_loop(),
        )
        # An unpartitioned coroutine handler runs in this runner, which is its
        # task's alone: a task of its own per run cost ~7 µs (about 6 % of a
        # worker's client CPU per no-op task). A lost lease then cancels the
        # runner itself (below, told apart from a stop's cancel). A stream run's
        # tasks share one runner, so each handler gets a task (and a context) of
        # its own, as does a thread's future.
        inline = fn.is_async and held.run is None
        handler: Awaitable[Any]
        if inline:
            handler = call_async(fn, ctx, args, kwargs)
            held.handler = asyncio.current_task()
        else:
            handler = held.handler = start_handler(fn, ctx, args, kwargs)
        if log.isEnabledFor(logging.DEBUG):
            held.log.debug("running")
        started = time.monotonic()
        scope: asyncio.Timeout | None = None
        try:
            if fn.timeout is None:  # no timeout: spare the context manager (per task)
                result = await handler
            else:
                async with asyncio.timeout(fn.timeout) as scope:
                    result = await handler
        except LostLease as exc:
            held.log.info("dropped: %s", exc)
            return isinstance(exc, TaskCancelled)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            # The lease was lost and nothing else cancelled this runner: inline,
            # the heartbeat's cancel was this runner's (withdrawn here, so only a
            # stop's remains); otherwise it was the handler's own task's.
            if held.lost and (
                current is None or (current.uncancel() == 0 if inline else not current.cancelling())
            ):
                held.log.info("dropped: the lease was lost while running")
                return held.cancelled
            raise
        except Snooze as snooze:
            return await self.record.snooze(held, snooze.delay)
        except Exception as exc:
            if isinstance(exc, TimeoutError) and scope is not None and scope.expired():
                if not fn.is_async:
                    held.log.warning(
                        "timed out; the handler's thread cannot be stopped and is left to "
                        "finish in the background"
                    )
                exc = TaskTimeout(f"{task.name} ran past its timeout of {fn.timeout:g} s")
            retryable = is_retryable(exc, retry_on=fn.retry_on, no_retry_on=fn.no_retry_on)
            held.log.info("attempt failed%s: %r", "" if retryable else " for good", exc)
            return await self.record.fail(held, exc, retryable=retryable)
        finally:
            held.handler = None
        if inline and held.lost:
            # The handler swallowed the lost lease's cancel and returned: withdraw
            # that request, or it would stay counted against this runner.
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                current.uncancel()
        if isinstance(result, Snooze):
            return await self.record.snooze(held, result.delay)
        took = time.monotonic() - started
        if log.isEnabledFor(logging.INFO):
            held.log.info("succeeded in %.3f s", took)
        self.returned(held, took)
        return await self.record.succeed(held, result)


__all__ = ["Attempts"]
