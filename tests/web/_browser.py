"""What the real-browser tests share: the system's Chromium, which Playwright
drives (``CONVEYOR_CHROMIUM`` names another binary), a dashboard served by
uvicorn on a thread of its own, and a page that fails its test on any script
error."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import conveyor
from conveyor.web import dashboard

CHROMIUM = os.environ.get("CONVEYOR_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WAIT_MS = 10_000


def chromium() -> str:
    """The Chromium binary; the test skips without one (fails under ``CI=true``)."""
    path = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the browser tests need Chromium in CI: apt-get install chromium")
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    return path


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def served_dashboard(db_url: str, *, allow_actions: bool = True) -> Iterator[str]:
    """The dashboard of ``db_url`` served by uvicorn on a thread, refreshing every
    second; yields its address, and stops it (and closes its store) after."""
    import uvicorn

    store = conveyor.connect(db_url)
    app = dashboard(store, allow_actions=allow_actions, refresh=1.0)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )

    async def main() -> None:
        try:
            await server.serve()
        finally:
            await store.close()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert time.monotonic() < deadline, "the dashboard did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


@contextmanager
def browser_page(playwright_api: Any) -> Iterator[Any]:
    """A page of a fresh headless Chromium, 1280×800; the test fails if a script
    of the page raised."""
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), args=ARGS)
        try:
            tab = browser.new_page(viewport={"width": 1280, "height": 800})
            tab.set_default_timeout(WAIT_MS)
            problems: list[str] = []
            tab.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            yield tab
            assert problems == []
        finally:
            browser.close()
