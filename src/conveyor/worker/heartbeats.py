"""Keeping a worker's leases alive: heartbeats for every task it holds, each at
a third of its lease, and the lease lengths of its queues (see :class:`Heartbeats`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from conveyor.errors import ConveyorError, LostLease, TaskCancelled
from conveyor.models import Task
from conveyor.store.base import TaskStore
from conveyor.store.protocol.queries import DEFAULT_LEASE

log = logging.getLogger("conveyor.worker")


class Leased(Protocol):
    """What a heartbeat needs of a held task (the worker's record of it)."""

    next_beat: float  # monotonic time of the next heartbeat
    lost: bool
    cancelled: bool
    beating: bool  # a heartbeat is in flight

    @property
    def task(self) -> Task:
        """The leased task."""
        ...

    @property
    def interval(self) -> float:
        """Seconds between heartbeats."""
        ...

    @property
    def handler(self) -> asyncio.Future[Any] | None:
        """The running handler, cancelled when the lease is lost."""
        ...

    @property
    def finishing(self) -> bool:
        """The outcome is being written: a LostLease then is the worker's own doing."""
        ...

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """The task's logger."""
        ...


class Heartbeats:
    """Renews the lease of every task in ``held`` every third of its length.

    One heartbeat task per lease, so a slow write for one delays no other. A
    heartbeat that meets :class:`LostLease` (recovered, claimed by another,
    cancelled) marks the task lost and cancels its handler, unless the worker is
    writing its outcome already. ``lease`` is the worker's fixed lease, or None
    to use each queue's configured lease (learnt by :meth:`refresh`).
    """

    def __init__(
        self,
        store: TaskStore,
        *,
        worker_id: str,
        group: str | None,
        queues: Sequence[str],
        lease: float | None,
        held: Mapping[str, Leased],
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.group = group
        self.queues = list(queues)
        self.lease = lease
        self.held = held
        #: Heartbeats in flight (cancelled when the worker stops).
        self.beats: set[asyncio.Task[None]] = set()
        self._queue_leases: dict[str, float] = {}

    def lease_for(self, queue: str) -> float:
        """The lease length, in seconds, a claim from ``queue`` gets."""
        if self.lease is not None:
            return self.lease
        return self._queue_leases.get(queue, DEFAULT_LEASE)

    async def refresh(self) -> None:
        """Learn the queues' configured lease lengths (only used when ``lease=None``)."""
        if self.lease is not None:
            return
        for queue in self.queues:
            try:
                setting = (await self.store.get_queue(queue))["lease"]
            except (ConveyorError, OSError) as exc:
                log.warning("cannot read the settings of queue %s: %s", queue, exc)
                continue
            self._queue_leases[queue] = float(setting) if setting else DEFAULT_LEASE

    async def run(self) -> None:
        """Send heartbeats as they fall due, until cancelled."""
        while True:
            now = time.monotonic()
            for held in self.held.values():
                if held.next_beat <= now and not (held.lost or held.beating):
                    held.beating = True
                    beat = asyncio.create_task(
                        self._beat(held), name=f"conveyor-beat-{held.task.id}"
                    )
                    self.beats.add(beat)
                    beat.add_done_callback(self.beats.discard)
            # Tick at a quarter of the shortest interval, counting queues with nothing
            # held yet, so a task claimed while idle gets its first beat on time.
            shortest = min(
                (h.interval for h in self.held.values()),
                default=min(self.lease_for(q) for q in self.queues) / 3,
            )
            await asyncio.sleep(min(1.0, shortest / 4))

    async def _beat(self, held: Leased) -> None:
        task = held.task
        try:
            await self.store.heartbeat(
                task.id, worker_id=self.worker_id, group=self.group, attempt=task.attempt
            )
            held.next_beat = time.monotonic() + held.interval
        except LostLease as exc:
            if held.finishing:
                return  # our own succeed/fail/release got there first
            held.lost = True
            held.cancelled = isinstance(exc, TaskCancelled)
            held.log.info("lease lost (%s); stopping the handler", exc)
            if held.handler is not None:
                held.handler.cancel()
        except (ConveyorError, OSError) as exc:
            # Try again soon; the lease has two more intervals of slack.
            held.next_beat = time.monotonic() + min(1.0, held.interval / 3)
            held.log.warning("heartbeat failed: %s", exc)
        finally:
            held.beating = False


__all__ = ["Heartbeats", "Leased"]
