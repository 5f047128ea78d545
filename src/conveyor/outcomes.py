"""How a handler's run ends, and what the worker records for it.

A handler ends in one of four ways:

* it **returns** a value: the task succeeds with it as the result;
* it **snoozes** (``raise conveyor.Snooze(30)`` or ``return conveyor.Snooze(30)``):
  the task goes back to the queue to run again after the delay, and the run
  does not count against ``max_attempts`` (the attempt number still grows, so a
  stale run can never complete a newer one);
* it **raises** ``conveyor.Permanent``: the task fails for good
  (``retryable=False`` in the error envelope);
* it **raises** anything else: the attempt fails and is retried with backoff
  while attempts remain, unless ``@app.task(retry_on=..., no_retry_on=...)``
  says the exception is not worth retrying (:func:`is_retryable`).
"""

from __future__ import annotations

from conveyor import _values as v
from conveyor.errors import ConveyorError, InvalidArgument

#: What ``retry_on=`` / ``no_retry_on=`` accept: exception classes.
ExceptionTypes = tuple[type[BaseException], ...]


class Permanent(ConveyorError):
    """Raised by a handler: fail the task for good, without further attempts.

    ``raise conveyor.Permanent("no such customer")``; chain the cause with
    ``raise conveyor.Permanent("bad input") from exc`` to keep its traceback.
    The error envelope records ``type="Permanent"``, ``retryable=False``.
    """

    code = "permanent"


class Snooze(ConveyorError):
    """Raised (or returned) by a handler: run the task again after ``delay``
    seconds (an int, a float or a ``timedelta``), without spending an attempt."""

    code = "snooze"

    def __init__(self, delay: v.Duration) -> None:
        self.delay = v.duration_seconds("delay", delay)
        super().__init__(f"snoozed for {self.delay:g} s")


class TaskTimeout(ConveyorError):
    """The handler ran past its task's ``timeout``; the attempt failed."""

    code = "timeout"


class UnknownTask(ConveyorError):
    """No handler is registered under the task's name in this worker."""

    code = "unknown_task"


def exception_types(field: str, value: object) -> ExceptionTypes:
    """``value`` (an exception class or a sequence of them) as a tuple, or
    :class:`InvalidArgument` naming ``field``."""
    if value is None:
        return ()
    if isinstance(value, type):
        items: tuple[object, ...] = (value,)
    elif isinstance(value, tuple | list):
        items = tuple(value)
    else:
        raise InvalidArgument(
            field, f"must be an exception class or a tuple of them, got {value!r}"
        )
    checked: list[type[BaseException]] = []
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise InvalidArgument(
                field, f"must hold exception classes, e.g. (TimeoutError,), got {item!r}"
            )
        checked.append(item)
    return tuple(checked)


def is_retryable(
    error: BaseException, *, retry_on: ExceptionTypes, no_retry_on: ExceptionTypes
) -> bool:
    """Whether a failed attempt should be retried (attempts permitting).

    :class:`Permanent` never is; an instance of ``no_retry_on`` never is; when
    ``retry_on`` is given, only its instances are; otherwise everything is.
    """
    if isinstance(error, Permanent):
        return False
    if no_retry_on and isinstance(error, no_retry_on):
        return False
    if retry_on:
        return isinstance(error, retry_on)
    return True


__all__ = [
    "ExceptionTypes",
    "Permanent",
    "Snooze",
    "TaskTimeout",
    "UnknownTask",
    "exception_types",
    "is_retryable",
]
