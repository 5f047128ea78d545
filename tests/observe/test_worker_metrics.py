"""The worker's Prometheus metrics: what it counts, and the endpoint that serves them."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import conveyor
from conveyor import ConfigurationError, metrics
from conveyor.worker import Worker
from conveyor.worker.context import Context

pytest.importorskip("prometheus_client")


def _value(metric: str, **labels: str) -> float:
    m = metrics.worker_metrics()
    assert m is not None
    return m.registry.get_sample_value(metric, labels) or 0.0


async def test_the_worker_counts_claims_outcomes_and_timings(app: conveyor.App) -> None:
    attempts: dict[str, int] = {}

    @app.task(name="obs.ok", queue="obs")
    async def ok(ctx: Context) -> int:
        return 1

    @app.task(name="obs.flaky", queue="obs", max_attempts=2, backoff=0.01)
    async def flaky(ctx: Context) -> int:
        attempts[ctx.task.id] = attempts.get(ctx.task.id, 0) + 1
        raise ValueError("always")

    names = ("obs.ok", "obs.flaky")
    before = {
        (metric, name): _value(metric, queue="obs", name=name)
        for metric in (
            "conveyor_worker_claims_total",
            "conveyor_worker_succeeded_total",
            "conveyor_worker_failed_total",
            "conveyor_worker_retries_total",
            "conveyor_worker_run_seconds_count",
        )
        for name in names
    }
    acks_before = _value("conveyor_worker_ack_batch_size_count")
    claims_before = _value("conveyor_worker_claim_seconds_count")

    submitted = [await ok.submit() for _ in range(3)] + [await flaky.submit()]
    worker = Worker(app, "obs", concurrency=4, poll_interval=0.05, maintain_interval=None)
    job = asyncio.create_task(worker.run())
    try:
        assert _value("conveyor_worker_capacity") >= 4
        for task in submitted:
            await app.store.wait(task.id, timeout=30)
    finally:
        worker.stop()
        await asyncio.wait_for(job, 15)

    def grew(metric: str, name: str) -> float:
        return _value(metric, queue="obs", name=name) - before[(metric, name)]

    assert grew("conveyor_worker_claims_total", "obs.ok") == 3
    assert grew("conveyor_worker_claims_total", "obs.flaky") == 2
    assert grew("conveyor_worker_succeeded_total", "obs.ok") == 3
    assert grew("conveyor_worker_retries_total", "obs.flaky") == 1
    assert grew("conveyor_worker_failed_total", "obs.flaky") == 1
    assert grew("conveyor_worker_failed_total", "obs.ok") == 0
    assert grew("conveyor_worker_run_seconds_count", "obs.ok") == 3
    assert grew("conveyor_worker_run_seconds_count", "obs.flaky") == 2
    assert 1 <= _value("conveyor_worker_ack_batch_size_count") - acks_before <= 3
    assert _value("conveyor_worker_claim_seconds_count") - claims_before >= 2
    assert _value("conveyor_worker_in_flight") == 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_the_metrics_endpoint_serves_worker_and_store_numbers(store_url: str) -> None:
    async with conveyor.connect(store_url) as store:
        await store.submit("t", queue="scraped")
    port = _free_port()
    server = metrics.serve_worker_metrics(f"127.0.0.1:{port}", store_url)
    try:

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                return str(r.read().decode())

        text = await asyncio.to_thread(scrape)
    finally:
        server.close()
    assert "conveyor_store_up 1.0" in text
    assert 'conveyor_queue_tasks{group="",queue="scraped",status="queued"} 1.0' in text
    assert "conveyor_worker_in_flight" in text
    assert "# TYPE conveyor_worker_claims_total counter" in text


def test_the_metrics_address_is_checked() -> None:
    assert metrics.parse_address("9100") == ("0.0.0.0", 9100)
    assert metrics.parse_address("127.0.0.1:9100") == ("127.0.0.1", 9100)
    assert metrics.parse_address("[::1]:9100") == ("::1", 9100)
    for bad in ("http", "0", "70000", "host:"):
        with pytest.raises(ConfigurationError, match="metrics port"):
            metrics.parse_address(bad)


def test_the_worker_command_serves_metrics(tmp_path: Path) -> None:
    (tmp_path / "scraped_app.py").write_text(
        "import conveyor\napp = conveyor.App()\n\n@app.task(name='noop')\nasync def noop(ctx):\n"
        "    return None\n"
    )
    port = _free_port()
    url = f"sqlite:///{tmp_path / 'worker.db'}"
    command = [sys.executable, "-m", "conveyor.cli", "worker", "scraped_app:app", "--url", url]
    proc = subprocess.Popen(
        [*command, "--concurrency", "3", "--metrics-port", f"127.0.0.1:{port}"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        # The endpoint opens before the worker starts: wait for the worker's numbers.
        deadline = time.monotonic() + 60
        text = ""
        while "conveyor_worker_capacity 3.0" not in text:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, f"no worker metrics within 60 s:\n{text}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                pass
            time.sleep(0.2)
        assert "conveyor_store_up 1.0" in text
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        if proc.stderr:
            proc.stderr.close()
