"""The statements of the submits with keys or partitions (:mod:`conveyor.store.catalogue`,
run by :mod:`conveyor.store.protocol.submit_together`) on both backends, each run in
one transaction with the statements it follows: what it writes, what it returns,
what it leaves alone."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy import text

from conveyor import _values as v
from conveyor.store.base import TaskStore
from conveyor.store.protocol import texts

MISSING = "01ARZ3NDEKTSV4RRFFQ69G5FAZ"


async def _rows(store: TaskStore, sql: str, **params: Any) -> list[Any]:
    async def work(conn: Any) -> list[Any]:
        return list(await conn.execute(text(sql), params))

    return list(await store._run(work, write=False))


async def _tx(
    store: TaskStore, steps: Sequence[tuple[str, dict[str, Any]]], rows_of: int = -1
) -> list[Any]:
    """The named statements run in order in one transaction; the rows of one."""
    await store.open()
    assert store._texts is not None
    built = store._texts
    return await texts.together(
        store, [(built[name], params) for name, params in steps], rows_of=rows_of
    )


def _one(task_id: str, key: str | None = None, **values: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": task_id,
        "name": "n",
        "queue": "q",
        "payload": "{}",
        "metadata": "{}",
        "priority": 0,
        "max_attempts": None,
        "backoff": None,
        "delay": None,
        "run_at": None,
        "correlation_id": None,
        "key": key,
        "parent_id": None,
    }
    out.update(values)
    return out


def _many(ids: list[str], **lists: Any) -> dict[str, Any]:
    n = len(ids)
    out: dict[str, Any] = {
        "ids": ids,
        "names": ["n"] * n,
        "queues": ["q"] * n,
        "payloads": [f'{{"i": {i}}}' for i in range(n)],
        "metadatas": ["{}"] * n,
        "priorities": [0] * n,
        "max_attempts": None,
        "backoffs": None,
        "delays": None,
        "run_ats": None,
        "correlation_ids": None,
    }
    out.update(lists)
    return out


def _claim(keys: dict[str, str]) -> list[tuple[str, dict[str, Any]]]:
    """The keys claimed (each for its task id) and locked, in the lock order."""
    ordered = sorted(keys)
    return [
        (
            "claim_keys",
            {"keys": json.dumps(ordered), "ids": json.dumps([keys[k] for k in ordered])},
        ),
        ("lock_keys", {"keys": json.dumps(ordered)}),
    ]


async def _tasks(store: TaskStore) -> list[tuple[str, str | None, str | None, str]]:
    found = await _rows(
        store, "SELECT id, key, partition, root_id FROM conveyor_tasks ORDER BY seq"
    )
    return [(row.id, row.key, row.partition, row.root_id) for row in found]


async def _deliveries(store: TaskStore, task_id: str) -> list[tuple[str, str]]:
    found = await _rows(
        store,
        "SELECT d.grp, d.status FROM conveyor_deliveries AS d "
        "JOIN conveyor_tasks AS t ON t.seq = d.task_seq WHERE t.id = :id ORDER BY d.grp",
        id=task_id,
    )
    return [(row.grp, row.status) for row in found]


async def _streams(store: TaskStore) -> dict[tuple[str, str], tuple[Any, bool]]:
    """Each stream's (grp, partition): its head's task id and whether it is available."""
    found = await _rows(
        store,
        "SELECT s.grp, s.partition, t.id, s.available_at FROM conveyor_streams AS s "
        "LEFT JOIN conveyor_tasks AS t ON t.seq = s.head_seq",
    )
    return {(row.grp, row.partition): (row.id, row.available_at is not None) for row in found}


@pytest.fixture
async def grouped(store: TaskStore) -> TaskStore:
    """A store whose queue ``q`` has an active group ``g``."""
    await store.subscribe("q", "g")
    return store


@pytest.mark.parametrize("name", ["submit_keyed", "submit_keyed_in"])
async def test_submit_keyed_writes_only_when_its_claim_wins(grouped: TaskStore, name: str) -> None:
    """The first submit of a key claims it and writes its task; the next writes
    nothing, and ``key_holder`` answers the first with its view in queue mode."""
    store = grouped
    first, second = v.new_task_id(), v.new_task_id()
    (row,) = await _tx(store, [(name, _one(first, "k")), ("key_holder", {"key": "k"})])
    assert (row.id, row.key, row.grp, row.status) == (first, "k", "", "queued")
    (row,) = await _tx(store, [(name, _one(second, "k")), ("key_holder", {"key": "k"})])
    assert row.id == first
    assert await _tasks(store) == [(first, "k", None, first)]
    assert await _deliveries(store, first) == [("", "queued"), ("g", "queued")]
    assert await _tx(store, [("key_holder", {"key": "nobody"})]) == []


@pytest.mark.parametrize("name", ["submit_keyed_child", "submit_keyed_child_in"])
async def test_submit_keyed_child_claims_nothing_for_a_missing_parent(
    store: TaskStore, name: str
) -> None:
    root, child, orphan = v.new_task_id(), v.new_task_id(), v.new_task_id()
    await _tx(store, [("submit_keyed", _one(root, "root"))])
    (row,) = await _tx(store, [(name, _one(child, "c", parent_id=root))])
    assert (row.id, row.root_id, row.orphan) == (child, root, None)
    (row,) = await _tx(store, [(name, _one(orphan, "o", parent_id=MISSING))])
    assert (row.id, row.orphan) == (None, MISSING)
    assert await _tx(store, [("key_holder", {"key": "o"})]) == []
    assert await _tasks(store) == [(root, "root", None, root), (child, "c", None, root)]


@pytest.mark.parametrize("name", ["submit_key_owned", "submit_key_owned_in"])
async def test_submit_key_owned_writes_only_for_the_keys_owner(store: TaskStore, name: str) -> None:
    """Written when the key's row names the task, else nothing (no claim of its own)."""
    held, other, free = v.new_task_id(), v.new_task_id(), v.new_task_id()
    await _tx(store, [("submit_keyed", _one(held, "k"))])
    assert await _tx(store, [(name, _one(other, "k"))]) == []
    assert await _tx(store, [(name, _one(free, "unclaimed"))]) == []
    assert await _tx(store, [("key_holder", {"key": "unclaimed"})]) == []
    rows = await _tx(store, [("replace_key", {"key": "k", "id": other}), (name, _one(other, "k"))])
    assert [row.id for row in rows] == [other]
    assert [t[0] for t in await _tasks(store)] == [held, other]


@pytest.mark.parametrize("name", ["submit_keyed_many", "submit_keyed_many_in"])
async def test_a_keyed_batch_writes_the_tasks_whose_keys_name_them(
    grouped: TaskStore, name: str
) -> None:
    """After the keys' claims, each keyed task is written only if its key names it,
    a task without a key always; ``key_answers`` gives each unkeyed task and each
    key's holder (``holds``)."""
    store = grouped
    held = v.new_task_id()
    await _tx(store, [("submit_keyed", _one(held, "held"))])
    a, b, c, d = (v.new_task_id() for _ in range(4))
    keys = [None, "held", "new", "new"]
    await _tx(store, [*_claim({"held": b, "new": c}), (name, _many([a, b, c, d], keys=keys))])
    assert [t[0] for t in await _tasks(store)] == [held, a, c]
    answers = await _tx(store, [("key_answers", {"ids": [a], "keys": ["held", "new", "none"]})])
    assert sorted((row.holds or "", row.id) for row in answers) == sorted(
        [("", a), ("held", held), ("new", c)]
    )
    assert await _deliveries(store, c) == [("", "queued"), ("g", "queued")]


@pytest.mark.parametrize(
    "name", ["submit_partitioned", "submit_partitioned_in", "submit_keyed_partitioned"]
)
async def test_a_partitioned_submit_leaves_each_stream_with_its_first_task_available(
    grouped: TaskStore, name: str
) -> None:
    """Between the groups shared with the queue-mode streams locked, and every
    group's streams locked and recomputed: each partition's stream, in queue mode
    and the group, has its first task as head and is available; an unpartitioned
    task joins no stream."""
    store = grouped
    ids = [v.new_task_id() for _ in range(4)]
    parts = ["a", "b", "a", None]
    pairs = json.dumps([["q", "a"], ["q", "b"]])
    rows = await _tx(
        store,
        [
            ("share_groups", {"queues": json.dumps(["q"])}),
            ("lock_streams", {"keys": json.dumps([["q", "", "a"], ["q", "", "b"]])}),
            (name, _many(ids, partitions=parts, keys=[None] * 4)),
            ("lock_group_streams", {"pairs": pairs}),
            ("refresh_group_streams", {"pairs": pairs}),
        ],
        rows_of=2,
    )
    assert sorted(row.id for row in rows) == sorted(ids)
    assert [(t[0], t[2]) for t in await _tasks(store)] == list(zip(ids, parts, strict=True))
    want = {
        (grp, p): (head, True) for grp in ("", "g") for p, head in (("a", ids[0]), ("b", ids[1]))
    }
    assert await _streams(store) == want


@pytest.mark.parametrize("name", ["submit_partitioned_children", "submit_partitioned_children_in"])
async def test_partitioned_children_of_a_missing_parent_write_no_stream(
    store: TaskStore, name: str
) -> None:
    root = v.new_task_id()
    await _tx(store, [("submit_keyed", _one(root, "r"))])

    def steps(ids: list[str], parents: list[Any]) -> list[tuple[str, dict[str, Any]]]:
        pairs = json.dumps([["q", "p"]])
        guarded = {"parent_ids": parents}
        return [
            ("lock_streams_if_parents", {"keys": json.dumps([["q", "", "p"]]), **guarded}),
            (name, _many(ids, partitions=["p"] * len(ids), parent_ids=parents)),
            ("lock_group_streams_if_parents", {"pairs": pairs, **guarded}),
            ("refresh_group_streams", {"pairs": pairs}),
        ]

    lost = [v.new_task_id(), v.new_task_id()]
    rows = await _tx(store, steps(lost, [root, MISSING]), rows_of=1)
    assert [(row.id, row.orphan) for row in rows] == [(None, MISSING)]
    assert await _streams(store) == {}
    kids = [v.new_task_id()]
    rows = await _tx(store, steps(kids, [root]), rows_of=1)
    assert [(row.id, row.root_id) for row in rows] == [(kids[0], root)]
    assert await _streams(store) == {("", "p"): (kids[0], True)}


async def test_a_replace_withdraws_the_holder_and_moves_its_streams(grouped: TaskStore) -> None:
    """The replace's statements in their order: the holder's active rows cancelled,
    its streams recomputed (the next task of its partition becomes head), the key
    handed over, the new task written; ``key_holder`` answers the new one."""
    store = grouped
    holder, after, new = v.new_task_id(), v.new_task_id(), v.new_task_id()
    pairs = json.dumps([["q", "p"]])
    for claim, task_id, key in ((_claim({"k": holder}), holder, "k"), ([], after, None)):
        await _tx(
            store,
            [
                *claim,
                ("lock_streams", {"keys": json.dumps([["q", "", "p"]])}),
                ("submit_keyed_partitioned", _many([task_id], partitions=["p"], keys=[key])),
                ("lock_group_streams", {"pairs": pairs}),
                ("refresh_group_streams", {"pairs": pairs}),
            ],
        )
    assert (await _streams(store))[("g", "p")] == (holder, True)
    ids = {"key": "k", "id": new}
    (row,) = await _tx(
        store,
        [
            *_claim({"k": new}),
            ("replace_share", {**ids, "queues": json.dumps(["q"])}),
            ("replace_lock", {**ids, "pairs": json.dumps([])}),
            ("replace_cancel", ids),
            ("replace_refresh", ids),
            ("replace_key", ids),
            ("submit_key_owned", _one(new, "k")),
            ("key_holder", {"key": "k"}),
        ],
    )
    assert row.id == new
    assert await _deliveries(store, holder) == [("", "cancelled"), ("g", "cancelled")]
    assert await _deliveries(store, new) == [("", "queued"), ("g", "queued")]
    assert await _streams(store) == {("", "p"): (after, True), ("g", "p"): (after, True)}
