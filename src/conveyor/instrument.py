"""The worker's observability hooks: Prometheus counters and OpenTelemetry spans.

The worker calls these at a handful of points (a claim, an attempt, an
acknowledgement batch); each does nothing when its library is not installed.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Sequence
from typing import Any, Protocol

from conveyor import metrics, tracing
from conveyor.models import Task


class _Held(Protocol):
    task: Task
    outcome: str
    error: BaseException | None


class Instruments:
    """Metrics and traces for one worker (``worker`` has ``held``, ``concurrency``
    and ``group``)."""

    def __init__(self, worker: Any) -> None:
        self.group: str | None = getattr(worker, "group", None)
        self.metrics = metrics.worker_metrics()
        if self.metrics is not None:
            self.metrics.track(worker)

    def claimed(self, tasks: Sequence[Task], seconds: float) -> None:
        """A claim call returned ``tasks`` after ``seconds``."""
        m = self.metrics
        if m is None:
            return
        m.claim_seconds.observe(seconds)
        for task in tasks:
            m.claims.labels(task.queue, task.name).inc()

    def acked(self, size: int) -> None:
        """One commit acknowledged ``size`` successes."""
        if self.metrics is not None:
            self.metrics.ack_batch.observe(size)

    async def attempt(self, held: _Held, run: Awaitable[bool]) -> bool:
        """Run one attempt (``run``, the worker's execution of ``held``) inside its
        consumer span, then count its outcome (which the worker sets on ``held``)."""
        task = held.task
        started = time.monotonic()
        with tracing.consumer_span(task, self.group) as span:
            try:
                return await run
            finally:
                span.outcome(held.outcome, held.error)
                m = self.metrics
                if m is not None:
                    counter = {
                        "succeeded": m.succeeded,
                        "failed": m.failed,
                        "retry": m.retries,
                        "snoozed": m.snoozed,
                    }.get(held.outcome, m.lost)
                    counter.labels(task.queue, task.name).inc()
                    m.run_seconds.labels(task.queue, task.name).observe(time.monotonic() - started)
