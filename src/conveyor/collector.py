"""The garbage collector of a worker process: settled once at the first start."""

from __future__ import annotations

import gc

_collector_settled = False


def settle_collector() -> None:
    """Collect garbage once, then freeze every object still alive into the
    collector's permanent generation; once per process (later calls do nothing).

    What is alive when a worker starts (modules, the app, the store, the driver)
    lives as long as the process. Left in the oldest generation, every full
    collection walks it again: 30-60 ms of stalled event loop on a two-core
    machine with SQLAlchemy and a driver loaded, every few thousand tasks, which
    shows as tail latency. Frozen, a full collection walks only what came after.
    Once per process: objects frozen are never collected, so freezing again at
    every start (a process that starts many workers, as a test suite does) would
    keep each one's garbage cycles forever.
    """
    global _collector_settled
    if _collector_settled:
        return
    _collector_settled = True
    gc.collect()
    gc.freeze()


__all__ = ["settle_collector"]
