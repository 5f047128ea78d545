"""`conveyor groups ...`, as a user runs them."""

from __future__ import annotations

from test_cli_commands import assert_one_line_error, ok_json, run_all, run_cli

import conveyor
from conveyor import Status


def test_groups_list_shows_every_group_of_a_queue(store_url: str) -> None:
    with conveyor.connect_sync(store_url) as store:
        store.subscribe("orders", "billing")
        store.subscribe("orders", "audit", start="new")
        store.subscribe("emails", "sender")
        store.unsubscribe("emails", "sender")
    listed = ok_json("groups", "list", url=store_url)
    assert [(g["queue"], g["name"], g["active"]) for g in listed] == [
        ("emails", "sender", False),
        ("orders", "audit", True),
        ("orders", "billing", True),
    ]
    one = ok_json("groups", "list", "--queue", "orders", url=store_url)
    assert {g["name"] for g in one} == {"audit", "billing"}
    table, none = run_all(
        ("groups", "list"), ("groups", "list", "--queue", "nothing"), url=store_url
    )
    assert table.returncode == 0 and "billing" in table.stdout and "sender" in table.stdout
    assert none.returncode == 0 and "no consumer group" in none.stdout


def test_groups_list_shows_each_groups_health(store_url: str) -> None:
    """Tasks waiting some 1,000 s (submitted by a store whose clock is behind):
    a group that never claimed is stalled, one that just claimed is lagging, one
    with no work is ok; --lagging-after moves the threshold."""
    with conveyor.connect_sync(store_url) as store:
        store.store.clock_offset = -1000
        store.subscribe("orders", "stuck")
        store.subscribe("orders", "slow")
        store.subscribe("emails", "idle")
        for n in range(3):
            store.submit("order", {"n": n}, queue="orders")
        store.store.clock_offset = 0
        assert len(store.claim("orders", worker_id="w", group="slow")) == 1
    listed, relaxed = (
        ok_json("groups", "list", url=store_url),
        ok_json("groups", "list", "--lagging-after", "5000", url=store_url),
    )
    health = {g["name"]: g for g in listed}
    assert health["stuck"]["state"] == "stalled"
    assert health["stuck"]["lag"] == 3 and health["stuck"]["last_claim_at"] is None
    assert 1000 <= health["stuck"]["oldest_age"] < 1100
    assert health["slow"]["state"] == "lagging" and health["slow"]["lag"] == 3
    assert health["slow"]["last_claim_at"] is not None
    assert (health["idle"]["state"], health["idle"]["lag"], health["idle"]["oldest_age"]) == (
        "ok",
        0,
        None,
    )
    assert {g["name"]: g["state"] for g in relaxed} == {"idle": "ok", "slow": "ok", "stuck": "ok"}
    table, bad = run_all(
        ("groups", "list", "--queue", "orders"),
        ("groups", "list", "--lagging-after", "0"),
        url=store_url,
    )
    assert table.returncode == 0, table.stderr
    rows = {line.split()[1]: line for line in table.stdout.splitlines() if "orders" in line}
    assert "stalled" in rows["stuck"] and "lagging" in rows["slow"]
    assert "16m" in rows["stuck"]  # the oldest claimable task's age
    assert bad.returncode != 0 and "lagging_after" in bad.stderr


def test_groups_seek_replays_and_skips_and_prints_the_counts(store_url: str) -> None:
    with conveyor.connect_sync(store_url) as store:
        store.subscribe("orders", "billing")
        store.subscribe("orders", "audit")
        tasks = [store.submit("bill", i, queue="orders", partition="c1") for i in range(4)]
        for _ in range(3):
            [held] = store.claim("orders", worker_id="w", group="billing")
            store.succeed(held.id, worker_id="w", group="billing")
        point = tasks[1].created_at.isoformat()

    got = ok_json("groups", "seek", "orders", "billing", "--to", point, url=store_url)
    assert got == {
        "queue": "orders",
        "group": "billing",
        "partition": None,
        "requeued": 2,
        "skipped": 0,
        "left_running": 0,
        "to": point,
    }
    text, skip = run_all(
        ("groups", "seek", "orders", "audit", "--to", "end", "--partition", "c1"),
        ("groups", "seek", "orders", "billing", "--to", "start", "--json"),
        url=store_url,
    )
    assert text.returncode == 0, text.stderr
    assert "skipped 4" in text.stdout and "requeued 0" in text.stdout
    assert "partition c1" in text.stdout
    assert skip.returncode == 0 and '"requeued": 1' in skip.stdout
    with conveyor.connect_sync(store_url) as store:
        assert [store.get(t.id, group="billing").status for t in tasks] == [Status.QUEUED] * 4  # type: ignore[union-attr]
        assert {store.get(t.id, group="audit").status for t in tasks} == {Status.SKIPPED}  # type: ignore[union-attr]
        assert {store.get(t.id).status for t in tasks} == {Status.QUEUED}  # type: ignore[union-attr]


def test_groups_seek_refuses_bad_points_and_unknown_groups(store_url: str) -> None:
    with conveyor.connect_sync(store_url) as store:
        store.subscribe("orders", "billing")
        store.submit("bill", queue="orders")
    naive, garbage, missing, absent = run_all(
        ("groups", "seek", "orders", "billing", "--to", "2026-12-01T00:00"),
        ("groups", "seek", "orders", "billing", "--to", "tomorrow"),
        ("groups", "seek", "orders", "nobody", "--to", "end"),
        ("groups", "seek", "orders", "billing"),
        url=store_url,
    )
    assert "--to needs a time zone" in assert_one_line_error(naive, 2)
    assert "--to is not start, end or an ISO 8601 time" in assert_one_line_error(garbage, 2)
    assert "nobody" in assert_one_line_error(missing, 1)
    assert absent.returncode == 2 and "--to" in absent.stderr
    with conveyor.connect_sync(store_url) as store:
        [report] = store.stats("orders")
        assert report.groups["billing"].counts["queued"] == 1  # nothing written


def test_groups_seek_is_in_the_help() -> None:
    shown = run_cli("groups", "seek", "--help")
    assert shown.returncode == 0
    assert "--to" in shown.stdout and "--partition" in shown.stdout
