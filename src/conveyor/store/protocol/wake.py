"""In-process wake-ups: idle workers waiting for work, ``wait()`` calls waiting
for a task to finish.

The backends' cross-process channels (Postgres LISTEN/NOTIFY) feed the same
wakers through :func:`wake`; on SQLite, waiters also poll.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from conveyor.store.seam import Seam


class Watch:
    """Interest in some keys (queue names or task ids; ``None``: every key)."""

    __slots__ = ("event", "keys")

    def __init__(self, keys: frozenset[str] | None) -> None:
        self.keys = keys
        self.event = asyncio.Event()

    async def wait(self, timeout: float) -> bool:
        """True once notified (at once if it already was), False after ``timeout``."""
        try:
            await asyncio.wait_for(self.event.wait(), timeout)
            return True
        except TimeoutError:
            return False


class Waker:
    """In-process wake-ups keyed by queue name or task id.

    A watch registered *before* the caller looks at the database cannot miss a
    notification that arrives while it looks. ``remember=True`` covers callers
    that cannot register first (``wait_for_work`` right after an empty claim): a
    key notified while nobody watched it is kept, and the next wait on it returns
    at once — at worst one extra claim, never a missed wake-up. Remembered keys
    are queue names, so the set stays small.
    """

    def __init__(self, *, remember: bool = False) -> None:
        self._watches: set[Watch] = set()
        self._remember = remember
        self._pending: set[str] = set()
        self._pending_all = False

    def notify(self, keys: Iterable[str] | None = None) -> None:
        """Wake the watches on any of ``keys`` (``None``: every watch)."""
        wanted = None if keys is None else frozenset(keys)
        hit: set[str] = set()
        for watch in self._watches:
            if wanted is None or watch.keys is None or not wanted.isdisjoint(watch.keys):
                watch.event.set()
                if wanted is not None and watch.keys is not None:
                    hit |= wanted & watch.keys
                elif wanted is not None:
                    hit |= wanted
        if self._remember:
            if wanted is None:
                self._pending_all = self._pending_all or not self._watches
            else:
                self._pending |= wanted - hit

    def watched(self) -> bool:
        """Whether anyone is waiting on this waker now."""
        return bool(self._watches)

    @contextmanager
    def watch(self, keys: Iterable[str] | None) -> Iterator[Watch]:
        """Register interest in ``keys`` for the duration of the block."""
        watch = Watch(None if keys is None else frozenset(keys))
        self._watches.add(watch)
        try:
            yield watch
        finally:
            self._watches.discard(watch)

    async def wait(self, keys: Iterable[str], timeout: float) -> bool:
        """Sleep until one of ``keys`` is notified (True) or ``timeout`` passes (False)."""
        wanted = frozenset(keys)
        if self._pending_all or not self._pending.isdisjoint(wanted):
            self._pending -= wanted
            self._pending_all = False
            return True
        with self.watch(wanted) as watch:
            return await watch.wait(timeout)


async def listen(st: Seam) -> None:
    """Start the store's cross-process wake channel if it has not started yet, and
    return once it has (or the dialect gave up waiting for it). Called before every
    claim and wait: a store that only submits never listens (on Postgres, a LISTEN
    connection hearing the store's own announcements cost every submit a wake-up of
    its own), and one that claims or waits is listening before it first looks."""
    start = st._wake_start
    if start is None:
        if st._engine is None:
            await st.open()
        start = st._wake_start
        if start is None:
            start = st._wake_start = asyncio.ensure_future(st._start_wake())
    if not start.done():
        # Shielded: a cancelled caller does not cancel a start others wait for.
        await asyncio.shield(start)


def wake_local(st: Seam, *, work: bool) -> None:
    """After a commit in this process. It does not say which queues or tasks, so it
    wakes every waiter here (all idle workers only when ``work``); each looks again,
    which is cheap."""
    wake(st, queues=None if work else (), task_ids=None)


def wake(
    st: Seam,
    *,
    queues: Iterable[str] | None = (),
    task_ids: Iterable[str] | None = (),
) -> None:
    """Wake this process's waiters: idle workers of ``queues`` and ``wait()`` calls
    on ``task_ids`` (``None``: all of them)."""
    if st._work_waker is not None and (queues is None or queues):
        st._work_waker.notify(queues)
    if st._done_waker is not None and (task_ids is None or task_ids):
        st._done_waker.notify(task_ids)
