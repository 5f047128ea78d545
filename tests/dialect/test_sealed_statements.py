"""The statements' side of encryption at rest, on both backends: every plain
submit statement writes nothing when a queue of its tasks is encrypted (whatever
the store believes); ``insert_rows`` refuses a plain row of an encrypted queue
with a row saying so; ``submit_sealed``/``submit_sealed_one`` write the key id
and report each queue's setting."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_submit_statements import _one, _plain, _rows, _run

from conveyor import _values as v
from conveyor.store.base import TaskStore


async def _counts(store: TaskStore) -> tuple[int, int]:
    tasks = await _rows(store, "SELECT count(*) AS n FROM conveyor_tasks")
    deliveries = await _rows(store, "SELECT count(*) AS n FROM conveyor_deliveries")
    return int(tasks[0].n), int(deliveries[0].n)


@pytest.fixture
async def vault(store: TaskStore) -> TaskStore:
    """A store whose queue ``vault`` is encrypted (an active group ``g`` on it)
    and whose queue ``q`` is not."""
    await store.configure_queue("vault", encrypt=True)
    await store.subscribe("vault", "g")
    return store


@pytest.mark.parametrize("name", ["submit_plain", "submit_plain_in", "submit_children"])
async def test_a_plain_batch_statement_writes_nothing_to_an_encrypted_queue(
    vault: TaskStore, name: str
) -> None:
    ids = [v.new_task_id() for _ in range(3)]
    params = _plain(ids, ["q", "vault", "q"])
    if name == "submit_children":
        params["parent_ids"] = [None, None, None]
    assert [r for r in await _run(vault, name, params) if r.id is not None] == []
    assert await _counts(vault) == (0, 0)
    # The same batch without the encrypted queue is written.
    assert len(await _run(vault, name, {**params, "queues": ["q", "q", "q"]})) == 3


@pytest.mark.parametrize("name", ["submit_one", "submit_one_in", "submit_child"])
async def test_a_plain_single_statement_writes_nothing_to_an_encrypted_queue(
    vault: TaskStore, name: str
) -> None:
    params = _one(v.new_task_id(), "vault")
    if name == "submit_child":
        params["parent_id"] = None
    assert [r for r in await _run(vault, name, params) if r.id is not None] == []
    assert await _counts(vault) == (0, 0)


async def test_insert_rows_refuses_a_plain_row_of_an_encrypted_queue(vault: TaskStore) -> None:
    now = v.now_us()

    def row(queue: str, key_id: str | None) -> list[Any]:
        task_id = v.new_task_id()
        return [task_id, "n", queue, None, "{}", "{}", 0, 3, None, now, now, None, None,
                task_id, None, key_id]  # fmt: skip

    refused = await _run(
        vault, "insert_rows", {"rows": json.dumps([row("q", None), row("vault", None)])}
    )
    assert [bool(r.refused) for r in refused] == [True]
    assert await _counts(vault) == (0, 0)
    written = await _run(
        vault, "insert_rows", {"rows": json.dumps([row("q", None), row("vault", "k")])}
    )
    assert not any(r.refused for r in written)
    rows = await _rows(vault, "SELECT queue, key_id FROM conveyor_tasks ORDER BY seq")
    assert [(r.queue, r.key_id) for r in rows] == [("q", None), ("vault", "k")]
    assert await _counts(vault) == (2, 3)  # the vault task for queue mode and group g


async def test_submit_sealed_writes_the_key_id_and_reports_each_queues_setting(
    vault: TaskStore,
) -> None:
    ids = [v.new_task_id() for _ in range(2)]
    rows = await _run(vault, "submit_sealed", {**_plain(ids, ["vault", "q"]), "key_id": "k1"})
    assert {(r.id, bool(r.encrypt)) for r in rows} == {(ids[0], True), (ids[1], False)}
    one = v.new_task_id()
    [row] = await _run(vault, "submit_sealed_one", {**_one(one, "vault"), "key_id": "k1"})
    assert row.id == one and row.encrypt
    stored = await _rows(vault, "SELECT id, key_id FROM conveyor_tasks")
    assert {r.id: r.key_id for r in stored} == dict.fromkeys([*ids, one], "k1")
    assert await _counts(vault) == (3, 5)
