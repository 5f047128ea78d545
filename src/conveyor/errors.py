"""The exceptions conveyor raises.

Every error derives from :class:`ConveyorError` and carries a stable ``code``::

    ConveyorError                      code
    ├── ConfigurationError             "configuration"
    │   └── MigrationRequired          "migration_required"
    ├── InvalidArgument (ValueError)   "invalid_argument"
    ├── AlreadyExists                  "already_exists"
    ├── QueueFull                      "queue_full"
    ├── LostLease                      "lost_lease"
    │   └── TaskCancelled              "task_cancelled"
    ├── ProtocolVersionMismatch        "protocol_version_mismatch"
    ├── NotFound                       "not_found"
    ├── StoreUnavailable               "store_unavailable"
    ├── StoreError                     "store_error"
    └── DecryptionError                "decryption"

Driver errors are translated in one place (the store's transaction runner) and
chained with ``raise ... from`` so the original stays visible.
"""

from __future__ import annotations


class ConveyorError(Exception):
    """Root of every error conveyor raises."""

    code: str = "conveyor_error"


class ConfigurationError(ConveyorError):
    """The store cannot be set up as asked (bad URL, missing driver, bad option)."""

    code = "configuration"


class MigrationRequired(ConfigurationError):
    """The database has no conveyor schema, or an older one, and the store was opened
    with ``migrate=False`` (as conveyor's read-only commands open it): nothing was
    created. ``current`` holds the revisions the database is at (empty: no conveyor
    schema at all), ``head`` the one this version of conveyor needs. Run
    ``conveyor migrate``, or open the store once with ``migrate=True``."""

    code = "migration_required"

    def __init__(self, current: tuple[str, ...], head: str, message: str) -> None:
        self.current = current
        self.head = head
        super().__init__(message)


class InvalidArgument(ConveyorError, ValueError):
    """An argument is malformed; nothing was written.

    ``field`` names the offending argument.
    """

    code = "invalid_argument"

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class AlreadyExists(ConveyorError):
    """A task with this idempotency key exists and ``conflict="reject"`` was asked."""

    code = "already_exists"

    def __init__(self, key: str, task_id: str) -> None:
        self.key = key
        self.task_id = task_id
        super().__init__(f"a task with key {key!r} already exists (id {task_id})")


class QueueFull(ConveyorError):
    """The queue holds ``limit`` queued tasks or more (its ``max_depth`` setting)
    and this submit would have added to them; nothing was written.

    ``depth`` is how many tasks were queued (in queue mode) when the submit looked.
    """

    code = "queue_full"

    def __init__(self, queue: str, depth: int, limit: int) -> None:
        self.queue = queue
        self.depth = depth
        self.limit = limit
        super().__init__(
            f"queue {queue!r} is full: {depth} queued task(s), max_depth {limit}; "
            "nothing was written. Retry once workers have drained it, or raise its "
            "max_depth (configure_queue, `conveyor queue set QUEUE --max-depth N`)"
        )


class LostLease(ConveyorError):
    """The caller no longer holds the task's lease; nothing was changed.

    The lease expired and was recovered, another worker claimed the task, or the
    write was fenced to an attempt that is not the current one.
    """

    code = "lost_lease"

    def __init__(self, task_id: str, message: str | None = None) -> None:
        self.task_id = task_id
        super().__init__(message or f"task {task_id}: the lease is no longer held by this worker")


class TaskCancelled(LostLease):
    """The task was cancelled while the caller held it; stop working on it."""

    code = "task_cancelled"

    def __init__(self, task_id: str) -> None:
        super().__init__(task_id, f"task {task_id} was cancelled")


class ProtocolVersionMismatch(ConveyorError):
    """The database was written by an incompatible version of conveyor."""

    code = "protocol_version_mismatch"


class NotFound(ConveyorError):
    """No task has the given id, or no consumer group the given name on a queue.

    ``what`` names what was looked for; ``hint``, when given, says what to do next
    (it ends the message).
    """

    code = "not_found"

    def __init__(self, what: str, *, hint: str | None = None) -> None:
        self.what = what
        self.hint = hint
        super().__init__(f"{what} not found" + (f": {hint}" if hint else ""))


class StoreUnavailable(ConveyorError):
    """The database could not complete the call (connection lost, timeouts, or
    contention that outlasted the bounded retries). Safe to retry."""

    code = "store_unavailable"


class StoreError(ConveyorError):
    """The database refused an operation in a way no rule of the protocol expects
    (a constraint it should not meet, a value it cannot store). The transaction was
    rolled back and nothing was written; the message carries the database's words."""

    code = "store_error"


class DecryptionError(ConveyorError):
    """A sealed value of task ``task_id`` does not open: this store has no key
    ``key_id``, or the value was altered or moved from another row. Nothing falls
    back to the stored text: the read, claim or write that met it fails."""

    code = "decryption"

    def __init__(self, task_id: str, key_id: str, reason: str) -> None:
        self.task_id = task_id
        self.key_id = key_id
        super().__init__(f"task {task_id}: cannot decrypt (key {key_id!r}): {reason}")
