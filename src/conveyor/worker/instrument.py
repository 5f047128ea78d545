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
        # The labelled child of each (metric, queue, task name): prometheus_client's
        # labels() validates and locks on every call, several times per task.
        self._children: dict[tuple[str, str, str], Any] = {}

    def _child(self, metric: str, queue: str, name: str) -> Any:
        key = (metric, queue, name)
        child = self._children.get(key)
        if child is None:
            assert self.metrics is not None
            child = getattr(self.metrics, metric).labels(queue, name)
            self._children[key] = child
        return child

    def claimed(self, tasks: Sequence[Task], seconds: float) -> None:
        """A claim call returned ``tasks`` after ``seconds``."""
        m = self.metrics
        if m is None:
            return
        m.claim_seconds.observe(seconds)
        # One increment per (queue, task name) in the claim, not one per task: each
        # takes the counter's lock.
        counts: dict[tuple[str, str], int] = {}
        for task in tasks:
            key = (task.queue, task.name)
            counts[key] = counts.get(key, 0) + 1
        for (queue, name), n in counts.items():
            self._child("claims", queue, name).inc(n)

    def acked(self, size: int) -> None:
        """One commit acknowledged ``size`` successes."""
        if self.metrics is not None:
            self.metrics.ack_batch.observe(size)

    async def attempt(self, held: _Held, run: Awaitable[bool]) -> bool:
        """Run one attempt (``run``, the worker's execution of ``held``) inside its
        consumer span, then count its outcome (which the worker sets on ``held``)."""
        started = time.monotonic()
        if not tracing.recording():  # no span to make: spare the context manager
            try:
                return await run
            finally:
                self._count(held, started)
        with tracing.consumer_span(held.task, self.group) as span:
            try:
                return await run
            finally:
                span.outcome(held.outcome, held.error)
                self._count(held, started)

    def _count(self, held: _Held, started: float) -> None:
        if self.metrics is None:
            return
        task = held.task
        metric = _OUTCOME_METRIC.get(held.outcome, "lost")
        self._child(metric, task.queue, task.name).inc()
        self._child("run_seconds", task.queue, task.name).observe(time.monotonic() - started)


#: The counter of each outcome the worker records (anything else: ``lost``).
_OUTCOME_METRIC = {
    "succeeded": "succeeded",
    "failed": "failed",
    "retry": "retries",
    "snoozed": "snoozed",
}
