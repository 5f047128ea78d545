"""The dashboard's seek of a consumer group (``store.seek``), from the groups
page: replay the group's tasks from a point, or skip what is queued before it.

Like the bulk actions (:mod:`conveyor.web.bulk`) it takes two steps: the form
asks for a preview, which counts what the seek would do now and writes nothing
(``store.internal.preview_seek``); the preview's confirm button seeks. Both are
posted as the other actions are (``HX-Request`` required, only with
``allow_actions``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from conveyor.errors import InvalidArgument
from conveyor.store.base import TaskStore

FIELDS = ("queue", "group", "to", "partition")


def point(value: str) -> datetime | Literal["start", "end"]:
    """The form's ``to``: start, end, or an ISO 8601 time with a zone."""
    value = value.strip()
    if value in ("start", "end"):
        return value  # type: ignore[return-value]
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidArgument(
            "to", f"must be start, end or an ISO 8601 time with a zone, got {value!r}"
        ) from None
    if moment.tzinfo is None:
        raise InvalidArgument("to", f"needs a time zone (e.g. {value}Z), got {value!r}")
    return moment


def _arguments(form: dict[str, str]) -> dict[str, Any]:
    return {
        "queue": form.get("queue", ""),
        "group": form.get("group", ""),
        "to": point(form.get("to", "")),
        "partition": form.get("partition") or None,
    }


async def preview(store: TaskStore, form: dict[str, str]) -> dict[str, Any]:
    """What the confirmation shows: what the seek would do now."""
    args = _arguments(form)
    would = await store.internal.preview_seek(
        args["queue"], args["group"], to=args["to"], partition=args["partition"]
    )
    return {
        "seek": would,
        "to": form.get("to", "").strip(),
        "vals": {field: form.get(field, "").strip() for field in FIELDS},
    }


async def act(store: TaskStore, form: dict[str, str]) -> tuple[str, bool]:
    """Seek; the message to flash and whether it changed anything."""
    args = _arguments(form)
    done = await store.seek(
        args["queue"], args["group"], to=args["to"], partition=args["partition"]
    )
    scope = f", partition {done.partition}" if done.partition is not None else ""
    message = (
        f"group {done.group} of queue {done.queue}{scope} moved to {form.get('to', '').strip()}: "
        f"{done.requeued} task(s) queued again, {done.skipped} skipped, "
        f"{done.left_running} left running"
    )
    return message, bool(done.requeued or done.skipped)
