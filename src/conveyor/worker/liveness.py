"""A worker's announcements: its row among the live workers, kept fresh while it
runs (see :mod:`conveyor.store.protocol.presence`), so ``conveyor workers`` and the
dashboard show it busy or idle, and forgotten when it stops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from conveyor.errors import ConveyorError
from conveyor.store.base import TaskStore
from conveyor.store.protocol.presence import ANNOUNCE_EVERY, ANNOUNCE_TTL

log = logging.getLogger("conveyor.worker")

#: Seconds a stopping worker gives the store to forget it; past that its row
#: simply expires, and the worker does not wait on a database that is down.
RETIRE_TIMEOUT = 2.0


class Announcer:
    """Announces one worker now and every ``every`` seconds; :meth:`retire` ends it."""

    def __init__(
        self,
        store: TaskStore,
        *,
        worker_id: str,
        queues: Sequence[str],
        group: str | None,
        concurrency: int,
        every: float = ANNOUNCE_EVERY,
        ttl: float = ANNOUNCE_TTL,
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.queues = list(queues)
        self.group = group
        self.concurrency = concurrency
        self.every = every
        self.ttl = ttl
        self._failing = False

    async def announce(self) -> None:
        """One announcement; a failure is logged (once until it works again), not raised:
        being listed is not worth stopping work for."""
        try:
            await self.store.announce_worker(
                self.worker_id,
                queues=self.queues,
                group=self.group,
                concurrency=self.concurrency,
                ttl=self.ttl,
            )
        except (ConveyorError, OSError) as exc:
            if not self._failing:
                log.warning("cannot record this worker among the live ones: %s", exc)
            self._failing = True
        else:
            self._failing = False

    async def run(self) -> None:
        """Announce every ``every`` seconds until cancelled (the first one is
        :meth:`announce`, made before the worker starts claiming)."""
        while True:
            await asyncio.sleep(self.every)
            await self.announce()

    async def retire(self) -> None:
        """Leave the live workers, within :data:`RETIRE_TIMEOUT` seconds."""
        try:
            await asyncio.wait_for(self.store.retire_worker(self.worker_id), RETIRE_TIMEOUT)
        except (ConveyorError, OSError, TimeoutError) as exc:
            log.debug("could not retire worker %s (its row expires): %s", self.worker_id, exc)


__all__ = ["RETIRE_TIMEOUT", "Announcer"]
