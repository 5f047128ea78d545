"""conveyor: a durable task queue and message bus on SQLAlchemy 2.

SQLite for development and embedded use, PostgreSQL for production; one API.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from conveyor.connect import connect, connect_sync
from conveyor.encryption import Encryption
from conveyor.errors import (
    AlreadyExists,
    ConfigurationError,
    ConveyorError,
    DecryptionError,
    InvalidArgument,
    LostLease,
    MigrationRequired,
    NotFound,
    ProtocolVersionMismatch,
    QueueFull,
    StoreError,
    StoreUnavailable,
    TaskCancelled,
)
from conveyor.models import (
    Backoff,
    BatchInfo,
    ConsumerGroup,
    GroupStats,
    Page,
    QueueStats,
    Rate,
    SeekResult,
    Status,
    Task,
)
from conveyor.outcomes import Permanent, Snooze

if TYPE_CHECKING:
    from conveyor.app import App
    from conveyor.store.api_dependencies import Batch
    from conveyor.store.base import TaskStore
    from conveyor.sync_store import SyncStore
    from conveyor.worker.context import Context

#: The names whose modules need SQLAlchemy, imported on first use (PEP 562), so
#: that ``import conveyor`` and ``conveyor --help`` stay quick.
_LAZY = {
    "App": "conveyor.app",
    "Batch": "conveyor.store.api_dependencies",
    "Context": "conveyor.worker.context",
    "SyncStore": "conveyor.sync_store",
    "TaskStore": "conveyor.store.base",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "AlreadyExists",
    "App",
    "Backoff",
    "Batch",
    "BatchInfo",
    "ConfigurationError",
    "ConsumerGroup",
    "Context",
    "ConveyorError",
    "DecryptionError",
    "Encryption",
    "GroupStats",
    "InvalidArgument",
    "LostLease",
    "MigrationRequired",
    "NotFound",
    "Page",
    "Permanent",
    "ProtocolVersionMismatch",
    "QueueFull",
    "QueueStats",
    "Rate",
    "SeekResult",
    "Snooze",
    "Status",
    "StoreError",
    "StoreUnavailable",
    "SyncStore",
    "Task",
    "TaskCancelled",
    "TaskStore",
    "__version__",
    "connect",
    "connect_sync",
]

__version__ = "0.1.0"
