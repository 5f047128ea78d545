"""`conveyor groups ...`, as a user runs them."""

from __future__ import annotations

from test_cli_commands import ok_json, run_all

import conveyor


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
