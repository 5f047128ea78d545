"""The dashboard's bulk actions: retry, cancel or purge every task of the tasks
list's current filter (``store.retry_where``, ``cancel_where``, ``purge_where``).

An action takes two steps: the button asks for a preview, which counts the
tasks the action would change and writes nothing; the preview's confirm button
acts. Both are posted as the other actions are (``HX-Request`` required, only
with ``allow_actions``), with the filter in the form.
"""

from __future__ import annotations

from typing import Any, Literal

from conveyor.errors import InvalidArgument
from conveyor.store.base import TaskStore

Action = Literal["retry", "cancel", "purge"]

#: The statuses of the list's filter each action applies to ("": any status).
APPLIES: dict[Action, tuple[str, ...]] = {
    "retry": ("", "failed", "cancelled", "evicted", "skipped"),
    "cancel": ("", "queued", "running"),
    "purge": ("", "succeeded", "failed", "cancelled", "evicted", "skipped"),
}
#: The action routes (``/actions/<name>``) and the action each runs.
ROUTES: dict[str, Action] = {
    "retry_where": "retry",
    "cancel_where": "cancel",
    "purge_where": "purge",
}
VERBS: dict[Action, tuple[str, str]] = {
    "retry": ("Retry", "queued again"),
    "cancel": ("Cancel", "cancelled"),
    "purge": ("Purge", "purged"),
}
FIELDS = ("queue", "status", "name", "partition", "group")


def available(filters: dict[str, str | None]) -> list[Action]:
    """The bulk actions that apply to the tasks list's filter (none without a queue)."""
    if not filters.get("queue"):
        return []
    status = filters.get("status") or ""
    return [action for action, statuses in APPLIES.items() if status in statuses]


def form_filters(filters: dict[str, str | None]) -> dict[str, str]:
    """The filter as the form fields the preview and confirm buttons post."""
    return {field: filters.get(field) or "" for field in FIELDS}


def _selection(form: dict[str, str]) -> dict[str, Any]:
    """The store's keyword filters from a posted form ("" means not given)."""
    return {
        "queue": form.get("queue", ""),
        "group": form.get("group") or None,
        "status": form.get("status") or None,
        "name": form.get("name") or None,
        "partition": form.get("partition") or None,
    }


def _action(value: str) -> Action:
    if value not in APPLIES:
        raise InvalidArgument("action", f"must be retry, cancel or purge, got {value!r}")
    return value


async def preview(store: TaskStore, form: dict[str, str]) -> dict[str, Any]:
    """What the confirmation shows: how many tasks the action would change now."""
    action = _action(form.get("action", ""))
    selection = _selection(form)
    count = await store.internal.count_where(action, **selection)
    return {
        "action": action,
        "verb": VERBS[action][0],
        "count": count,
        "queue": selection["queue"],
        "view": f"group {selection['group']}" if selection["group"] else "queue mode",
        "described": [
            f"{field} {selection[field]}"
            for field in ("status", "name", "partition")
            if selection[field]
        ],
        "vals": {field: form.get(field, "") for field in FIELDS},
    }


async def act(store: TaskStore, route: str, form: dict[str, str]) -> tuple[str, bool]:
    """Run the bulk action of ``route``; the message to flash and whether it did."""
    action = ROUTES[route]
    selection = _selection(form)
    methods = {
        "retry": store.retry_where,
        "cancel": store.cancel_where,
        "purge": store.purge_where,
    }
    changed = await methods[action](**selection)
    where = f"queue {selection['queue']}" + (
        f" (group {selection['group']})" if selection["group"] else ""
    )
    if not changed:
        return f"no tasks of {where} match any more: nothing changed", False
    return f"{changed} task(s) of {where} {VERBS[action][1]}", True
