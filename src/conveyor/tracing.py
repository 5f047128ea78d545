"""OpenTelemetry traces: a producer span per submit, a consumer span per attempt.

Active when ``opentelemetry-api`` is installed (``pip install 'conveyor[otel]'``)
and the application has configured a tracer provider; otherwise every function
here costs one check and does nothing.

* ``submit`` / ``submit_many`` open a ``PRODUCER`` span ``"<queue> publish"``
  (one per call) and write its context into each task's metadata under
  :data:`METADATA_KEY` (W3C ``traceparent``/``tracestate``).
* the worker opens a ``CONSUMER`` span ``"<queue> process"`` per attempt,
  linked to the producer span (a link, not a parent: the attempt may run long
  after, and several attempts share one producer), current while the handler
  runs, so the handler's own spans nest under it. Attributes: task id, name,
  queue, attempt, group and the outcome (``succeeded``, ``failed``, ``retry``,
  ``snoozed``, ``lost``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

# OpenTelemetry's names, set by _load() on first need: importing it costs more
# than a command of the CLI should, and nothing is traced before an application
# has imported it to configure a provider.
trace: Any = None
propagate: Any = None
Link: Any = None
NoOpTracerProvider: Any = None
ProxyTracerProvider: Any = None
SpanKind: Any = None
StatusCode: Any = None
_loaded: bool | None = None  # None: not tried yet; False: the otel extra is not installed

#: The metadata key holding the producer's trace context.
METADATA_KEY = "trace_context"
TRACER = "conveyor"
SYSTEM = "conveyor"

_provider: Any = None
#: Whether the environment names a global tracer provider (OpenTelemetry loads it
#: on the first get_tracer_provider() call).
_PROVIDER_IN_ENVIRONMENT = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
_UNKNOWN = object()


def _load() -> bool:
    """Import OpenTelemetry's API once; whether it is installed."""
    global _loaded, trace, propagate, Link, NoOpTracerProvider, ProxyTracerProvider
    global SpanKind, StatusCode
    if _loaded is None:
        try:
            from opentelemetry import propagate as _propagate
            from opentelemetry import trace as _trace
        except ImportError:  # the otel extra is not installed
            _loaded = False
        else:
            trace, propagate = _trace, _propagate
            Link, SpanKind, StatusCode = _trace.Link, _trace.SpanKind, _trace.StatusCode
            NoOpTracerProvider = _trace.NoOpTracerProvider
            ProxyTracerProvider = _trace.ProxyTracerProvider
            _loaded = True
    return bool(_loaded)


def set_tracer_provider(provider: Any) -> None:
    """Make conveyor's spans with ``provider`` rather than the global tracer
    provider (``None``: the global one again). For tests, and for applications
    that keep a provider of their own."""
    global _provider
    _provider = provider


def _tracer() -> Any:
    loaded = _load()
    assert loaded, "OpenTelemetry is not installed"
    if _provider is not None:
        return _provider.get_tracer(TRACER)
    return trace.get_tracer(TRACER)


def _recording() -> bool:
    """Whether a span made now could be recorded: a provider is set here or
    globally. Without one, OpenTelemetry would hand out non-recording spans, and
    making them (attributes, links, context switches) was about a tenth of a
    worker's CPU per task; checked per call, so a provider set later counts."""
    if _provider is not None:
        return _load()
    # A global provider is set through opentelemetry.trace (or named in the
    # environment): while nobody imported it, none is set.
    if "opentelemetry.trace" not in sys.modules and not _PROVIDER_IN_ENVIRONMENT:
        return False
    if not _load():
        return False
    # Until a global provider is set, get_tracer_provider() looks the environment up
    # for one on every call (about 1 us, a few per cent of a worker's CPU per task).
    # OpenTelemetry's module global says "none set" for free; the environment is
    # read once, when this module is imported.
    if getattr(trace, "_TRACER_PROVIDER", _UNKNOWN) is None and not _PROVIDER_IN_ENVIRONMENT:
        return False
    return not isinstance(trace.get_tracer_provider(), (ProxyTracerProvider, NoOpTracerProvider))


def recording() -> bool:
    """Whether a span made now would be recorded (a tracer provider is configured)."""
    return _recording()


def enabled() -> bool:
    """Whether OpenTelemetry is installed (spans are then made; they are recorded
    only if the application configured a tracer provider)."""
    return _load()


@contextmanager
def producer_span(requests: Sequence[Any]) -> Iterator[None]:
    """Around a submit of prepared ``requests`` (objects with ``id``, ``name``,
    ``queue`` and ``metadata`` as a JSON text): a producer span whose context is
    written into each request's metadata."""
    if not requests or not _recording():
        yield
        return
    queues = sorted({r.queue for r in requests})
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.destination.name": queues[0] if len(queues) == 1 else ",".join(queues),
        "messaging.batch.message_count": len(requests),
    }
    if len(requests) == 1:
        attributes.update(
            {
                "messaging.message.id": requests[0].id,
                "conveyor.task.id": requests[0].id,
                "conveyor.task.name": requests[0].name,
            }
        )
    tracer = _tracer()
    name = f"{queues[0]} publish" if len(queues) == 1 else "conveyor publish"
    with tracer.start_as_current_span(name, kind=SpanKind.PRODUCER, attributes=attributes) as span:
        if span.get_span_context().is_valid:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            if carrier:
                for r in requests:
                    metadata = json.loads(r.metadata)
                    metadata[METADATA_KEY] = carrier
                    r.metadata = json.dumps(metadata, separators=(",", ":"))
        yield


class Attempt:
    """The consumer span of one attempt; the worker records the outcome on it."""

    __slots__ = ("span",)

    def __init__(self, span: Any) -> None:
        self.span = span

    def outcome(self, outcome: str, error: BaseException | None = None) -> None:
        """Record how the attempt ended (and the error, for failures)."""
        if self.span is None:
            return
        self.span.set_attribute("conveyor.task.outcome", outcome)
        if outcome in ("failed", "retry"):
            if error is not None:
                self.span.record_exception(error)
            self.span.set_status(StatusCode.ERROR, outcome)


@contextmanager
def consumer_span(task: Any, group: str | None = None) -> Iterator[Attempt]:
    """A consumer span for one attempt of ``task`` (a :class:`~conveyor.Task`),
    linked to the producer span found in its metadata, current inside the block."""
    if not _recording():
        yield Attempt(None)
        return
    links = []
    carrier = task.metadata.get(METADATA_KEY) if isinstance(task.metadata, dict) else None
    if isinstance(carrier, dict):
        producer = trace.get_current_span(propagate.extract(carrier)).get_span_context()
        if producer.is_valid:
            links.append(Link(producer))
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.destination.name": task.queue,
        "messaging.message.id": task.id,
        "conveyor.task.id": task.id,
        "conveyor.task.name": task.name,
        "conveyor.task.queue": task.queue,
        "conveyor.task.attempt": task.attempt,
    }
    if group is not None:
        attributes["messaging.consumer.group.name"] = group
    if task.partition is not None:
        attributes["conveyor.task.partition"] = task.partition
    tracer = _tracer()
    with tracer.start_as_current_span(
        f"{task.queue} process",
        kind=SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield Attempt(span)
