"""OpenTelemetry spans: producer on submit, consumer per attempt, checked with the
SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

import conveyor
from conveyor import tracing
from conveyor.worker import Worker
from conveyor.worker.context import Context

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The finished spans of this test, from a provider of its own (the global
    provider stays untouched, so no other test sees trace context in metadata)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        tracing.set_tracer_provider(None)
        provider.shutdown()


def _named(exporter: InMemorySpanExporter, kind: SpanKind) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.kind == kind]


async def test_without_a_configured_provider_nothing_is_added(store_url: str) -> None:
    async with conveyor.connect(store_url) as store:
        task = await store.submit("plain", metadata={"a": 1})
    assert task.metadata == {"a": 1}


async def test_submit_makes_a_producer_span_and_carries_its_context(
    store_url: str, spans: InMemorySpanExporter
) -> None:
    async with conveyor.connect(store_url) as store:
        task = await store.submit("mail", {"to": "x"}, queue="emails", metadata={"who": "me"})
        batch = await store.submit_many([{"name": "a", "queue": "q"}, {"name": "b", "queue": "q"}])
        stored = await store.get(task.id)
    [one, many] = _named(spans, SpanKind.PRODUCER)
    assert one.name == "emails publish"
    assert one.attributes["conveyor.task.id"] == task.id
    assert one.attributes["conveyor.task.name"] == "mail"
    assert one.attributes["messaging.destination.name"] == "emails"
    assert many.attributes["messaging.batch.message_count"] == 2
    assert stored is not None and stored.metadata["who"] == "me"
    carried = stored.metadata[tracing.METADATA_KEY]
    context = trace.get_current_span(propagate.extract(carried)).get_span_context()
    assert context.span_id == one.context.span_id
    assert context.trace_id == one.context.trace_id
    for t in batch:
        assert tracing.METADATA_KEY in t.metadata


async def test_each_attempt_gets_a_consumer_span_linked_to_the_producer(
    app: conveyor.App, spans: InMemorySpanExporter
) -> None:
    tracer = tracing._tracer()  # the test's provider: its spans land in the exporter too

    @app.task(name="trace.flaky", queue="traced", max_attempts=3, backoff=0.01)
    async def flaky(ctx: Context) -> str:
        with tracer.start_as_current_span("inside the handler"):
            pass
        if ctx.task.attempt == 1:
            raise RuntimeError("first attempt fails")
        return "ok"

    task = await flaky.submit()
    worker = Worker(app, "traced", poll_interval=0.05, maintain_interval=None)
    job = asyncio.create_task(worker.run())
    try:
        done = await app.store.wait(task.id, timeout=30)
    finally:
        worker.stop()
        await asyncio.wait_for(job, 15)
    assert done.status == "succeeded"

    [producer] = _named(spans, SpanKind.PRODUCER)
    consumers = sorted(
        _named(spans, SpanKind.CONSUMER), key=lambda s: s.attributes["conveyor.task.attempt"]
    )
    assert [
        (s.attributes["conveyor.task.attempt"], s.attributes["conveyor.task.outcome"])
        for s in consumers
    ] == [(1, "retry"), (2, "succeeded")]
    for span in consumers:
        assert span.name == "traced process"
        assert span.attributes["conveyor.task.id"] == task.id
        assert span.attributes["conveyor.task.name"] == "trace.flaky"
        assert span.attributes["conveyor.task.queue"] == "traced"
        assert [link.context.span_id for link in span.links] == [producer.context.span_id]
    assert consumers[0].status.status_code == trace.StatusCode.ERROR
    assert any(e.name == "exception" for e in consumers[0].events)
    # The handler's own spans nest under the attempt's span.
    inner = [s for s in spans.get_finished_spans() if s.name == "inside the handler"]
    assert sorted(s.parent.span_id for s in inner) == sorted(s.context.span_id for s in consumers)


def test_a_global_provider_set_later_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """recording() skips OpenTelemetry's environment lookup while no global provider
    is set; one set afterwards (OpenTelemetry keeps it in its module global, as
    ``trace.set_tracer_provider`` does) must count from the next call. The global is
    patched rather than set, since OpenTelemetry allows setting it once per process."""
    from opentelemetry import trace

    assert not tracing.recording()
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", TracerProvider())
    assert tracing.recording()
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    assert not tracing.recording()
