"""What a worker does before its first claim: open the store when the database
may not be up yet, and check its consumer group.

A worker is often started together with its database (a container set, a host
booting), or while the database restarts. Rather than exit at once, it waits:
:func:`open_when_ready` tries again with backoff for up to ``wait`` seconds,
logging that it is waiting, and gives up with a :class:`StoreUnavailable` that
says how long it waited.

A worker with a group checks that the group is subscribed to each of its queues
(:func:`join_group`) and refuses to start otherwise: it never registers a group
unless told where the group starts (``subscribe=``), so a misspelt ``--group``
stops at once instead of creating a group that replays the whole history.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from conveyor import _values as v
from conveyor.errors import ConveyorError, InvalidArgument, NotFound, StoreUnavailable

if TYPE_CHECKING:
    from conveyor.store.base import TaskStore

#: Where a group a worker subscribes starts (see :meth:`TaskStore.subscribe`).
Start = Literal["all", "new"] | datetime

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


def subscribe_start(subscribe: Start | None, group: str | None) -> Start | None:
    """A worker's ``subscribe`` argument, checked: ``"all"``, ``"new"`` or an aware
    datetime, and only with a group."""
    if subscribe is None:
        return None
    if group is None:
        raise InvalidArgument("subscribe", "subscribes the worker's group: give group= too")
    if isinstance(subscribe, datetime):
        return v.aware("subscribe", subscribe)
    if isinstance(subscribe, str) and subscribe in ("all", "new"):
        return subscribe
    raise InvalidArgument(
        "subscribe",
        f'must be "all" (the retained history too), "new" (tasks submitted from now on) '
        f"or an aware datetime, got {subscribe!r}",
    )


async def join_group(
    store: TaskStore,
    queues: Sequence[str],
    group: str,
    subscribe: Start | None,
    stopping: asyncio.Event,
) -> bool:
    """Check that ``group`` is subscribed to every queue, subscribing it first where
    ``subscribe`` asks; False if ``stopping`` is set first. A missing (or
    unsubscribed) group raises :class:`NotFound` (every claim as it would fail);
    other failures (the database away) are retried with backoff."""
    pause = FIRST_PAUSE
    while not stopping.is_set():
        try:
            await store.internal.join_groups(queues, group, subscribe)
            return True
        except NotFound:
            raise
        except (ConveyorError, OSError) as exc:
            log.warning("could not check group %r (%s); next try in %.1f s", group, exc, pause)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), pause)
            pause = min(pause * 2, MAX_PAUSE)
    return False
