"""The worker: claims tasks of an :class:`~conveyor.app.App`, runs their handlers and
records the outcomes (:mod:`.loop`); one attempt of a task (:mod:`.attempt`), its
feed and slots, heartbeats, group commit, recording, handler context, logging,
start-up (the database, its group: :mod:`.startup`), stop and wind-down
(:mod:`.stopping`), its share of maintenance, tasks it has no handler for
(:mod:`.unknown`) and the supervisor of worker processes.

``Context`` and ``Worker`` are imported on first use (PEP 562): the CLI imports
this package's logging and supervisor modules, and ``conveyor --help`` must not
load the store for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conveyor.worker.context import Context
    from conveyor.worker.loop import Worker

_LAZY = {"Context": "conveyor.worker.context", "Worker": "conveyor.worker.loop"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["Context", "Worker"]
