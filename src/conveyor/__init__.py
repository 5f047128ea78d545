"""conveyor: a durable task queue and message bus on SQLAlchemy 2.

SQLite for development and embedded use, PostgreSQL for production; one API.
"""

from __future__ import annotations

from conveyor.app import App
from conveyor.connect import SyncStore, connect, connect_sync
from conveyor.context import Context
from conveyor.errors import (
    AlreadyExists,
    ConfigurationError,
    ConveyorError,
    InvalidArgument,
    LostLease,
    MigrationRequired,
    NotFound,
    ProtocolVersionMismatch,
    StoreError,
    StoreUnavailable,
    TaskCancelled,
)
from conveyor.models import Backoff, ConsumerGroup, GroupStats, Page, QueueStats, Status, Task
from conveyor.outcomes import Permanent, Snooze
from conveyor.store.base import TaskStore

__all__ = [
    "AlreadyExists",
    "App",
    "Backoff",
    "ConfigurationError",
    "ConsumerGroup",
    "Context",
    "ConveyorError",
    "GroupStats",
    "InvalidArgument",
    "LostLease",
    "MigrationRequired",
    "NotFound",
    "Page",
    "Permanent",
    "ProtocolVersionMismatch",
    "QueueStats",
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
