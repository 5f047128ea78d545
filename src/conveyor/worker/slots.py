"""How a worker's slots change hands. A unit claimed starts in a free slot
(:meth:`Feed.take <conveyor.worker.feed.Feed.take>`); a slot is given up when a
handler returns, while its success is written; a stream run then takes a slot
back for its next task, ahead of the buffered units, first come first served."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from conveyor.worker.feed import Feed
from conveyor.worker.recording import Held, Run
from conveyor.worker.stopping import Stopping


class Slots:
    """The slots of one worker, counted by its ``feed``. ``fill`` starts buffered
    units while slots are free."""

    def __init__(self, feed: Feed[Held], stop: Stopping, fill: Callable[[], None]) -> None:
        self.feed = feed
        self.stop = stop
        self.fill = fill
        #: Set when a slot is freed (or back-pressure eases): room to claim into.
        self.freed = asyncio.Event()
        # Stream runs waiting to take a slot back for their next task.
        self._resume: deque[tuple[asyncio.Future[None], Run]] = deque()

    def free(self, held: Held | None = None, run: Run | None = None) -> None:
        """The slot of ``held`` (or of the stream ``run``) is free again: it goes to a
        stream run waiting to go on, else to a buffered unit."""
        if held is not None:
            if not held.slot:
                return
            held.slot = False
        if run is not None:
            if not run.holding:
                return
            run.holding = False
        feed = self.feed
        feed.busy -= 1
        self.freed.set()
        while self._resume and feed.busy < feed.concurrency:
            waiter, waiting = self._resume.popleft()
            if not waiter.done():
                feed.busy += 1
                waiting.holding = True
                waiter.set_result(None)
        self.fill()

    async def back(self, run: Run) -> bool:
        """Take a slot for the stream ``run``'s next task; False if stopped first."""
        feed = self.feed
        if feed.busy < feed.concurrency and not self._resume:
            feed.busy += 1
            run.holding = True
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._resume.append((waiter, run))
        await self.stop.until(waiter)  # cancels the waiter if stop() came first
        return run.holding


__all__ = ["Slots"]
