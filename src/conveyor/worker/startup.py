"""Opening the store when the database may not be up yet.

A worker is often started together with its database (a container set, a host
booting), or while the database restarts. Rather than exit at once, it waits:
:func:`open_when_ready` tries again with backoff for up to ``wait`` seconds,
logging that it is waiting, and gives up with a :class:`StoreUnavailable` that
says how long it waited.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from conveyor.errors import StoreUnavailable
from conveyor.store.base import TaskStore

log = logging.getLogger("conveyor.worker")

FIRST_PAUSE = 0.5  # seconds before the second try; doubles up to MAX_PAUSE
MAX_PAUSE = 5.0


async def open_when_ready(store: TaskStore, wait: float, stopping: asyncio.Event) -> bool:
    """Open ``store``, retrying for up to ``wait`` seconds while the database does
    not answer. False when ``stopping`` is set meanwhile (nothing was opened)."""
    deadline = time.monotonic() + wait
    pause = FIRST_PAUSE
    while True:
        try:
            await store.open()
            return True
        except StoreUnavailable as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                if wait <= 0:
                    raise
                raise StoreUnavailable(
                    f"the database did not answer within {wait:g} s: {exc} Start it, or "
                    "wait longer with --wait-for-db SECONDS."
                ) from exc
            delay = min(pause, left)
            log.warning(
                "waiting for the database (%s); next try in %.1f s, giving up in %.0f s",
                " ".join(str(exc).split()),
                delay,
                left,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), delay)
            if stopping.is_set():
                log.info("stopped while waiting for the database")
                return False
            pause = min(pause * 2, MAX_PAUSE)
