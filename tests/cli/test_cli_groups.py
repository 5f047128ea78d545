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
