"""Worker logging: lines that name their task, plain or JSON, with other
libraries kept quiet.

* :class:`TaskLogger` prefixes every line about a task with its id, name and
  attempt (``task 01J… myapp.send_email attempt 2: will retry at …``) and
  attaches them as ``extra`` fields (``task_id``, ``task_name``, ``attempt``,
  ``queue``) for formatters that ship logs;
* :class:`JsonFormatter` writes one JSON object per line;
* :func:`setup_logging` is what ``conveyor worker --log-level --log-format``
  calls: conveyor's loggers at the asked level, every other library at
  ``library_level`` (warning by default) so ``--log-level debug`` shows
  conveyor's own story, not the driver's internals.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import MutableMapping
from datetime import UTC, datetime
from typing import IO, Any

from conveyor.models import Task

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
LIBRARIES = ("sqlalchemy", "alembic", "aiosqlite", "psycopg", "asyncio")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: Fields a conveyor log record may carry; JSON lines include those present.
TASK_FIELDS = ("task_id", "task_name", "attempt", "queue", "group", "worker_id")
_RECORD_KEYS = frozenset(vars(logging.makeLogRecord({})))


class TaskLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger whose lines are about one task (see the module docs)."""

    def __init__(self, logger: logging.Logger, task: Task) -> None:
        fields = {
            "task_id": task.id,
            "task_name": task.name,
            "attempt": task.attempt,
            "queue": task.queue,
        }
        if task.group is not None:
            fields["group"] = task.group
        super().__init__(logger, fields)
        self.prefix = f"task {task.id} {task.name} attempt {task.attempt}: "

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        """Prefix the message and merge the task's fields into ``extra``."""
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return f"{self.prefix}{msg}", kwargs


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601), ``level``,
    ``logger``, ``message``, the task fields present, any other ``extra``
    values, and ``exception`` (the formatted traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        for key, value in vars(record).items():
            if key not in _RECORD_KEYS and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, default=str, ensure_ascii=False)


def setup_logging(
    level: str = "info",
    fmt: str = "text",
    *,
    library_level: str = "warning",
    stream: IO[str] | None = None,
) -> None:
    """Send logs to ``stream`` (stderr) as ``fmt`` (``"text"`` or ``"json"``):
    conveyor's loggers at ``level``, everything else at ``library_level``.

    Replaces handlers a previous call installed; leaves others alone.
    """
    conveyor_level = _level("level", level)
    others = _level("library_level", library_level)
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.set_name("conveyor")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "conveyor"]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(others)
    # Some libraries set their own loggers' levels at import (SQLAlchemy sets
    # WARN): name them, so library_level applies to them as to the rest.
    for library in LIBRARIES:
        logging.getLogger(library).setLevel(others)
    logging.getLogger("conveyor").setLevel(conveyor_level)


def _level(field: str, name: str) -> int:
    if name.lower() not in LEVELS:
        raise ValueError(f"{field} must be one of {', '.join(LEVELS)}, got {name!r}")
    return int(logging.getLevelName(name.upper()))


__all__ = ["FORMATS", "LEVELS", "JsonFormatter", "TaskLogger", "setup_logging"]
