"""SIGINT and SIGTERM as stop requests, from a worker process's first line to its
last: :class:`StopSignals`.

A signal that arrives while the worker is still starting (importing the
application, connecting) is kept and handed to the worker once it exists, and
one that arrives while it closes is taken as said: the process ends as a stop
does (exit 0), never killed half-way by the default action (exit 143).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """Counts SIGINT/SIGTERM and passes each on to :meth:`forward`'s target.

    Install it in the main thread (:meth:`install`); :meth:`restore` puts the
    handlers back as they were. Signals that came before a target was set are
    passed on when it is.
    """

    def __init__(self) -> None:
        self.count = 0
        self._target: Callable[[], object] | None = None
        self._previous: dict[int, Any] = {}
        self._lock = threading.Lock()

    @property
    def installed(self) -> bool:
        """Whether the handlers are in place."""
        return bool(self._previous)

    def install(self) -> StopSignals:
        """Take SIGINT and SIGTERM over (a no-op outside the main thread, where
        Python cannot set handlers)."""
        if not self._previous and threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
        return self

    def restore(self) -> None:
        """Put back the handlers found by :meth:`install`."""
        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def forward(self, target: Callable[[], object] | None) -> None:
        """Call ``target`` for every signal from now on, and now for each one that
        came before (``None``: only count them)."""
        with self._lock:
            self._target = target
            missed = self.count
        if target is not None:
            for _ in range(missed):
                target()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Runs in the main thread between two bytecodes: only count and pass on
        # (the target hands the call to the event loop, thread-safely).
        self.count += 1
        target = self._target
        if target is not None:
            target()


#: The process's stop signals, shared by the CLI (which installs them first, to
#: cover the application's import) and :meth:`conveyor.App.run_worker`.
PROCESS = StopSignals()

__all__ = ["PROCESS", "SIGNALS", "StopSignals"]
