"""An encrypted task's page in a real browser (headless Chromium, Playwright),
served by `conveyor dashboard` as a subprocess: without the key (no
``$CONVEYOR_ENCRYPTION_KEYS``) the page says "encrypted" where the payload and the
result would be; given the key in ``$CONVEYOR_ENCRYPTION_KEYS`` it shows them."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _browser import ARGS, WAIT_MS, chromium

import conveyor

KEY = base64.b64encode(b"b" * 32).decode()
pytestmark = pytest.mark.xdist_group("browser")

playwright_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A SQLite store with one finished task of an encrypted queue: (url, task id)."""
    chromium()
    db_url = f"sqlite:///{tmp_path_factory.mktemp('sealed') / 'conveyor.db'}"
    keys = conveyor.Encryption(keys={"2026-12": KEY}, current="2026-12")
    with conveyor.connect_sync(db_url, encryption=keys) as store:
        store.configure_queue("vault", encrypt=True)
        task = store.submit(
            "charge", {"card": "4111-s3cret"}, queue="vault", metadata={"who": "meta-s3cret"}
        )
        [held] = store.claim("vault", worker_id="w")
        store.succeed(held.id, worker_id="w", result={"receipt": "rcpt-s3cret"})
    return db_url, task.id


def _serve(db_url: str, keys: str | None) -> tuple[subprocess.Popen[str], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    env = {
        k: v for k, v in os.environ.items() if k not in ("CONVEYOR_URL", "CONVEYOR_ENCRYPTION_KEYS")
    }
    if keys is not None:
        env["CONVEYOR_ENCRYPTION_KEYS"] = keys
    command = [sys.executable, "-m", "conveyor.cli", "dashboard", "--url", db_url]
    proc = subprocess.Popen(
        [*command, "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(url + "/", timeout=1):
                return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                why = proc.communicate()[1]
                raise AssertionError(f"the dashboard did not start: {why}") from None
            time.sleep(0.1)


@pytest.fixture
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=chromium(), args=ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.mark.parametrize("with_key", [False, True], ids=["no key", "key from the environment"])
def test_an_encrypted_task_page(
    browser: Any, seeded: tuple[str, str], with_key: bool, tmp_path: Path
) -> None:
    db_url, task_id = seeded
    proc, url = _serve(db_url, f"2026-12={KEY}" if with_key else None)
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.set_default_timeout(WAIT_MS)
        problems: list[str] = []
        page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
        page.goto(f"{url}/tasks/{task_id}")
        expect = playwright_api.expect
        payload = page.locator("pre.json").first
        if with_key:
            expect(payload).to_contain_text("4111-s3cret")
            expect(page.locator("body")).to_contain_text("rcpt-s3cret")
            expect(page.locator("pre.sealed")).to_have_count(0)
        else:
            expect(payload).to_have_text("encrypted")
            # payload, metadata and result
            expect(page.locator("pre.sealed")).to_have_count(3)
            body = page.locator("body").inner_text()
            assert "s3cret" not in body and "~c1:" not in body
        page.screenshot(path=str(tmp_path / "sealed.png"))
        assert problems == []
    finally:
        proc.terminate()
        proc.communicate(timeout=10)  # and its stderr pipe closed
