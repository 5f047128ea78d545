"""`conveyor queue set --encrypt/--no-encrypt`, `queue show` and `conveyor rekey`,
as a subprocess, the keys from ``$CONVEYOR_ENCRYPTION_KEYS``."""

from __future__ import annotations

import base64

import pytest
from test_cli_commands import EXIT_UNAVAILABLE, assert_one_line_error, ok_json, run_cli

import conveyor

K1 = base64.b64encode(b"1" * 32).decode()
K2 = base64.b64encode(b"2" * 32).decode()


def test_encrypt_is_set_shown_and_cleared(store_url: str) -> None:
    settings = ok_json("queue", "set", "vault", "--encrypt", url=store_url)
    assert settings["encrypt"] is True
    shown = run_cli("queue", "show", "vault", url=store_url)
    assert shown.returncode == 0, shown.stderr
    assert "encrypt" in shown.stdout and "yes" in shown.stdout
    assert ok_json("queue", "show", "vault", url=store_url)["encrypt"] is True
    assert ok_json("queue", "set", "vault", "--no-encrypt", url=store_url)["encrypt"] is False
    with conveyor.connect_sync(store_url) as store:
        assert store.get_queue("vault")["encrypt"] is False


def test_rekey_seals_under_the_current_key(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    old = conveyor.Encryption(keys={"2026-06": K1}, current="2026-06")
    with conveyor.connect_sync(store_url, encryption=old) as store:
        store.submit("t", {"s": "before"}, queue="vault")  # plain: the queue was not encrypted
        store.configure_queue("vault", encrypt=True)
        made = [store.submit("t", {"s": i}, queue="vault").id for i in range(3)]
        store.submit("t", queue="plain")
    # No keys: refused with a one-line error that says what to set.
    monkeypatch.delenv("CONVEYOR_ENCRYPTION_KEYS", raising=False)
    line = assert_one_line_error(run_cli("rekey", url=store_url), EXIT_UNAVAILABLE)
    assert "CONVEYOR_ENCRYPTION_KEYS" in line
    monkeypatch.setenv("CONVEYOR_ENCRYPTION_KEYS", f"2026-12={K2},2026-06={K1}")
    assert ok_json("rekey", "--queue", "vault", "--batch", "2", url=store_url) == {
        "rekeyed": 4,
        "current": "2026-12",
    }
    again = run_cli("rekey", url=store_url)
    assert again.returncode == 0, again.stderr
    assert "rekeyed 0 tasks to key 2026-12" in again.stdout
    new = conveyor.Encryption(keys={"2026-12": K2}, current="2026-12")
    with conveyor.connect_sync(store_url, encryption=new) as store:
        assert [store.get(i).payload for i in made] == [{"s": 0}, {"s": 1}, {"s": 2}]  # type: ignore[union-attr]
        assert store.internal.count_rekey() == 0
    # A malformed variable: one line naming it.
    monkeypatch.setenv("CONVEYOR_ENCRYPTION_KEYS", "2026-12=notakey")
    line = assert_one_line_error(run_cli("rekey", url=store_url), EXIT_UNAVAILABLE)
    assert "CONVEYOR_ENCRYPTION_KEYS" in line and "2026-12" in line
