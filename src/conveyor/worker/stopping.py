"""A worker's stop: asked for from any thread or signal handler, before the
worker runs or while it does, in two steps (the first stops claiming and starts
the grace period, a second cuts the grace period short); the waits a stop cuts
short; and the wind-down, which lets running tasks finish within the grace
period and hands back the rest."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from conveyor.worker.recording import Held

log = logging.getLogger("conveyor.worker")


class Stopping:
    """The stop of one worker. ``held`` is the worker's held tasks, by id (read,
    never changed: for the log lines and what the wind-down hands back)."""

    def __init__(self, held: Mapping[str, Held]) -> None:
        self.held = held
        #: Set by the first request: claim nothing more.
        self.asked = asyncio.Event()
        #: Set by a second request: the grace period ends now.
        self.forced = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._calls = 0

    def begin(self) -> None:
        """On the worker's loop as it starts running: fresh events, and the
        requests made before it ran take effect now."""
        self._loop = asyncio.get_running_loop()
        self.asked, self.forced = asyncio.Event(), asyncio.Event()
        for _ in range(self._calls):
            self._request()

    def request(self) -> None:
        """Ask the worker to stop (safe from any thread and from signal handlers)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            self._calls += 1
            return
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            self._request()
        else:
            loop.call_soon_threadsafe(self._request)

    def _request(self) -> None:
        self._calls += 1
        if not self.asked.is_set():
            log.info("stopping: no more claims; %d task(s) in flight", len(self.held))
            self.asked.set()
        elif not self.forced.is_set():
            log.info("stopping now: the grace period is cut short")
            self.forced.set()

    async def until(self, *waits: Awaitable[Any]) -> None:
        """Wait for the first of ``waits`` or for stop, whichever comes first."""
        jobs = [asyncio.ensure_future(w) for w in (*waits, self.asked.wait())]
        try:
            await asyncio.wait(jobs, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)

    async def wind_down(
        self,
        runners: set[asyncio.Task[None]],
        grace: float,
        release: Callable[[Held], Awaitable[None]],
    ) -> None:
        """Let ``runners`` finish within ``grace`` seconds (or until a second
        request), then cancel what still runs and ``release`` every task held."""
        deadline = time.monotonic() + grace
        if runners:
            log.info("waiting up to %g s for %d task(s)", grace, len(self.held))
        forced = asyncio.ensure_future(self.forced.wait())
        try:
            while not forced.done():
                left = [r for r in runners if not r.done()]
                remaining = deadline - time.monotonic()
                if not left or remaining <= 0:
                    break
                await asyncio.wait(
                    [*left, forced], timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
        finally:
            forced.cancel()
        # Snapshot before cancelling: a cancelled runner lets go of its task.
        leftovers = list(self.held.values())
        pending = [r for r in runners if not r.done()]
        for runner in pending:
            runner.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if leftovers:
            log.info("handing back %d task(s)", len(leftovers))
            await asyncio.gather(*(release(h) for h in leftovers))


__all__ = ["Stopping"]
