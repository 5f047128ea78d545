"""The dashboard on an encrypted queue (both backends, in-process): a store
without the key shows "encrypted" where the payload, metadata, result, error and
progress message would be; one with the key shows them."""

from __future__ import annotations

import base64
from typing import Any

import httpx

import conveyor
from conveyor.web import dashboard

KEYS = conveyor.Encryption(keys={"k": base64.b64encode(b"k" * 32).decode()}, current="k")


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dash")


async def _seed(st: conveyor.TaskStore) -> tuple[str, str, str]:
    await st.configure_queue("vault", encrypt=True)
    done = await st.submit(
        "t", {"card": "4111-s3cret"}, queue="vault", metadata={"m": "meta-s3cret"}
    )
    failed = await st.submit("t", {"card": "pay2-s3cret"}, queue="vault")
    running = await st.submit("t", {"card": "pay3-s3cret"}, queue="vault")
    [a] = await st.claim("vault", worker_id="w")
    await st.succeed(a.id, worker_id="w", result={"r": "res-s3cret"})
    [b] = await st.claim("vault", worker_id="w")
    await st.fail(b.id, worker_id="w", error=ValueError("err-s3cret"), retryable=False)
    [c] = await st.claim("vault", worker_id="w")
    await st.progress(c.id, worker_id="w", message="prog-s3cret", progress=0.5)
    assert [a.id, b.id, c.id] == [done.id, failed.id, running.id]
    return done.id, failed.id, running.id


async def test_without_the_key_the_pages_say_encrypted(store_url: str) -> None:
    async with conveyor.connect(store_url, encryption=KEYS) as keyed:
        done, failed, running = await _seed(keyed)
    async with conveyor.connect(store_url) as keyless, client(dashboard(keyless)) as http:
        pages = {
            task_id: (await http.get(f"/tasks/{task_id}")).text
            for task_id in (done, failed, running)
        }
        listing = (await http.get("/tasks?queue=vault&status=failed")).text
        workers = (await http.get("/workers")).text
    everything = "\n".join([*pages.values(), listing, workers])
    for secret in ("4111-s3cret", "meta-s3cret", "res-s3cret", "err-s3cret", "prog-s3cret"):
        assert secret not in everything
    for page in pages.values():
        assert '<pre class="json sealed">encrypted</pre>' in page
    assert pages[failed].count("encrypted") >= 3  # payload, error, the view's error
    assert "encrypted" in listing
    assert "~c1:" not in everything  # no ciphertext shown either


async def test_with_the_key_the_pages_show_the_values(store_url: str) -> None:
    async with conveyor.connect(store_url, encryption=KEYS) as keyed:
        done, failed, running = await _seed(keyed)
        async with client(dashboard(keyed)) as http:
            page = (await http.get(f"/tasks/{done}")).text
            assert "4111-s3cret" in page and "meta-s3cret" in page and "res-s3cret" in page
            assert "err-s3cret" in (await http.get(f"/tasks/{failed}")).text
            assert "prog-s3cret" in (await http.get(f"/tasks/{running}")).text
            assert "encrypted" not in page
