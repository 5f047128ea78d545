"""list: filters and keyset pagination (SPEC §2.1)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from conveyor import InvalidArgument, Page, Status, Task
from conveyor.store.base import TaskStore


async def _all_pages(store: TaskStore, limit: int, **filters: Any) -> list[list[Task]]:
    pages: list[list[Task]] = []
    cursor: str | None = None
    while True:
        page = await store.list(limit=limit, cursor=cursor, **filters)
        assert isinstance(page, Page)
        assert len(page.items) <= limit
        pages.append(page.items)
        cursor = page.next_cursor
        if cursor is None:
            return pages
        assert page.items, "a page with a cursor after it is never empty"
        assert len(pages) < 1000


async def test_list_of_an_empty_store(store: TaskStore) -> None:
    page = await store.list()
    assert page.items == [] and page.next_cursor is None


async def test_list_returns_tasks_in_submit_order(store: TaskStore) -> None:
    submitted = [await store.submit("t", {"i": i}, priority=i % 3) for i in range(6)]
    page = await store.list()
    assert page.items == submitted
    assert page.next_cursor is None


async def test_filters(store: TaskStore) -> None:
    root = await store.submit("root", queue="q1", correlation_id="c1")
    child = await store.submit("child", queue="q2", parent=root, partition="p1")
    other = await store.submit("other", queue="q1", partition="p2", correlation_id="c1")
    lone = await store.submit("child", queue="q2", correlation_id="c2")
    await store.claim("q1", worker_id="w")  # root is running
    await store.cancel(lone.id)

    async def ids(**filters: str) -> list[str]:
        return [t.id for t in (await store.list(**filters)).items]  # type: ignore[arg-type]

    assert await ids(queue="q1") == [root.id, other.id]
    assert await ids(queue="q2") == [child.id, lone.id]
    assert await ids(name="child") == [child.id, lone.id]
    assert await ids(partition="p1") == [child.id]
    assert await ids(root_id=root.id) == [root.id, child.id]
    assert await ids(correlation_id="c1") == [root.id, other.id]
    assert await ids(status="running") == [root.id]
    assert await ids(status="cancelled") == [lone.id]
    assert await ids(status="queued") == [child.id, other.id]
    assert await ids(status="succeeded") == []
    assert await ids(queue="q2", name="child", status="queued") == [child.id]
    assert await ids(queue="nope") == []
    assert await ids(name="child", correlation_id="c1") == []


async def test_a_workflow_lists_its_root_and_descendants_page_by_page(
    store: TaskStore,
) -> None:
    """list(root_id=...) pages through a workflow in submit order, the root first
    (read by its id: only descendants are in the root index), and the other
    filters apply to the root and the descendants alike."""
    before = await store.submit("before")
    root = await store.submit("root", queue="wf")
    children = await store.submit_many(
        [{"name": "child", "queue": "wf", "parent": root.id, "payload": i} for i in range(9)]
    )
    grandchild = await store.submit("grand", queue="wf2", parent=children[4])
    other_root = await store.submit("root", queue="wf")
    await store.submit("child", queue="wf", parent=other_root)
    workflow = [root.id, *[c.id for c in children], grandchild.id]  # submit order
    pages = await _all_pages(store, limit=4, root_id=root.id)
    assert [len(p) for p in pages] == [4, 4, 3]
    assert [t.id for p in pages for t in p] == workflow
    assert pages[0][0].id == root.id
    assert [t.id for t in (await store.list(root_id=root.id, queue="wf2")).items] == [grandchild.id]
    assert [t.id for t in (await store.list(root_id=root.id, name="root")).items] == [root.id]
    await store.cancel(root.id)
    await store.cancel(children[6].id)
    cancelled = await store.list(root_id=root.id, status="cancelled", limit=1000)
    assert [t.id for t in cancelled.items] == [root.id, children[6].id]
    # A task with no descendants is a workflow of one; a child id lists nothing.
    assert [t.id for t in (await store.list(root_id=before.id)).items] == [before.id]
    assert (await store.list(root_id=children[0].id)).items == []


async def test_status_filter_takes_the_enum(store: TaskStore) -> None:
    a = await store.submit("a")
    await store.submit("b")
    await store.cancel(a.id)
    page = await store.list(status=Status.CANCELLED)
    assert [t.id for t in page.items] == [a.id]


async def test_pagination_walks_every_task_once(store: TaskStore) -> None:
    submitted = await store.submit_many([{"name": "t", "payload": i} for i in range(25)])
    pages = await _all_pages(store, limit=7)
    assert [len(p) for p in pages] == [7, 7, 7, 4]
    seen = [t.id for p in pages for t in p]
    assert seen == [t.id for t in submitted]


async def test_last_full_page_has_no_cursor(store: TaskStore) -> None:
    await store.submit_many([{"name": "t"} for _ in range(10)])
    first = await store.list(limit=5)
    assert len(first.items) == 5 and first.next_cursor is not None
    second = await store.list(limit=5, cursor=first.next_cursor)
    assert len(second.items) == 5 and second.next_cursor is None


async def test_pagination_with_a_filter(store: TaskStore) -> None:
    submitted = await store.submit_many(
        [{"name": "t", "queue": "even" if i % 2 == 0 else "odd"} for i in range(30)]
    )
    for t in submitted[:10]:
        await store.cancel(t.id)
    pages = await _all_pages(store, limit=4, queue="even", status="queued")
    seen = [t.id for p in pages for t in p]
    expected = [t.id for t in submitted[10:] if t.queue == "even"]
    assert seen == expected
    assert all(t.queue == "even" and t.status is Status.QUEUED for p in pages for t in p)


async def test_pagination_is_stable_while_tasks_are_inserted(store: TaskStore) -> None:
    submitted = await store.submit_many([{"name": "t", "payload": i} for i in range(12)])
    seen: list[str] = []
    page = await store.list(limit=5)
    seen += [t.id for t in page.items]
    late: list[Task] = []
    while page.next_cursor is not None:
        late.append(await store.submit("late"))
        late.append(await store.submit("late", priority=99))
        page = await store.list(limit=5, cursor=page.next_cursor)
        seen += [t.id for t in page.items]
    assert len(seen) == len(set(seen))
    assert seen[:12] == [t.id for t in submitted]
    # everything inserted during the walk was reached, after the originals, in order
    assert seen[12:] == [t.id for t in late]


async def test_pagination_skips_nothing_when_listed_tasks_change(store: TaskStore) -> None:
    submitted = await store.submit_many([{"name": "t", "queue": "q"} for _ in range(9)])
    first = await store.list(limit=3)
    await store.claim("q", worker_id="w", limit=5)  # status changes under the cursor
    cursor = first.next_cursor
    seen = [t.id for t in first.items]
    while cursor is not None:
        page = await store.list(limit=3, cursor=cursor)
        seen += [t.id for t in page.items]
        cursor = page.next_cursor
    assert seen == [t.id for t in submitted]


@pytest.mark.parametrize(
    "cursor",
    [
        "garbage!!",
        "",
        "e30",  # base64 of "{}"
        base64.urlsafe_b64encode(json.dumps({"s": "x"}).encode()).decode(),
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
    ],
)
async def test_invalid_cursor(store: TaskStore, cursor: str) -> None:
    await store.submit("t")
    with pytest.raises(InvalidArgument) as info:
        await store.list(cursor=cursor)
    assert info.value.field == "cursor"


@pytest.mark.parametrize("limit", [0, -1, "10", 1.5, None])
async def test_invalid_limit(store: TaskStore, limit: object) -> None:
    with pytest.raises(InvalidArgument) as info:
        await store.list(limit=limit)  # type: ignore[arg-type]
    assert info.value.field == "limit"


async def test_invalid_status(store: TaskStore) -> None:
    with pytest.raises(InvalidArgument) as info:
        await store.list(status="done")
    assert info.value.field == "status"


async def test_newest_first_walks_back_from_the_last_submit(store: TaskStore) -> None:
    submitted = await store.submit_many(
        [{"name": "t", "queue": "even" if i % 2 == 0 else "odd", "payload": i} for i in range(23)]
    )
    newest_first = [t.id for t in reversed(submitted)]
    page = await store.list(order="newest")
    assert [t.id for t in page.items] == newest_first
    pages = await _all_pages(store, limit=5, order="newest")
    assert [len(p) for p in pages] == [5, 5, 5, 5, 3]
    assert [t.id for p in pages for t in p] == newest_first
    evens = await _all_pages(store, limit=4, order="newest", queue="even")
    assert [t.id for p in evens for t in p] == [
        t.id for t in reversed(submitted) if t.queue == "even"
    ]
    # Tasks submitted during the walk are newer than its start: it never reaches them.
    first = await store.list(limit=10, order="newest")
    await store.submit("late")
    assert first.next_cursor is not None
    rest = await store.list(limit=100, order="newest", cursor=first.next_cursor)
    assert [t.id for t in [*first.items, *rest.items]] == newest_first


async def test_newest_first_through_a_workflow(store: TaskStore) -> None:
    root = await store.submit("root", queue="wf")
    children = await store.submit_many(
        [{"name": "child", "queue": "wf", "parent": root.id} for _ in range(5)]
    )
    pages = await _all_pages(store, limit=2, root_id=root.id, order="newest")
    assert [t.id for p in pages for t in p] == [*[c.id for c in reversed(children)], root.id]


async def test_a_cursor_keeps_its_order(store: TaskStore) -> None:
    await store.submit_many([{"name": "t"} for _ in range(4)])
    oldest = await store.list(limit=2)
    newest = await store.list(limit=2, order="newest")
    assert oldest.next_cursor is not None and newest.next_cursor is not None
    with pytest.raises(InvalidArgument) as info:
        await store.list(cursor=oldest.next_cursor, order="newest")
    assert info.value.field == "cursor" and "order" in str(info.value)
    with pytest.raises(InvalidArgument):
        await store.list(cursor=newest.next_cursor)


async def test_invalid_order(store: TaskStore) -> None:
    with pytest.raises(InvalidArgument) as info:
        await store.list(order="desc")  # type: ignore[arg-type]
    assert info.value.field == "order"
