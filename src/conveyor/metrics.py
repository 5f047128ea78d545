"""Prometheus metrics: the store's numbers and the worker's.

Needs ``prometheus_client`` (``pip install 'conveyor[metrics]'``; the ``web``
extra includes it). Two sources:

* **the store** — read at scrape time from the cheap roll-ups (``stats()`` and
  ``finished_totals()``), never from the finished history:

  ``conveyor_queue_tasks{queue,group,status}``, ``conveyor_queue_lag{queue,group}``,
  ``conveyor_queue_oldest_claimable_age_seconds{queue,group}`` (gauges; ``group``
  is empty for queue mode, which a queue consumed by groups only does not
  report) and ``conveyor_tasks_finished_total{queue,group,name,
  status}`` (a counter of terminal outcomes — succeeded, failed, cancelled,
  evicted, skipped — per task name, across every process; it is exact up to the rows
  finished since the last ``maintain()``, which are counted live); and from
  ``groups()``, per subscribed consumer group: ``conveyor_group_lag{queue,group}``,
  ``conveyor_group_oldest_age_seconds{queue,group}`` (absent when nothing is
  claimable), ``conveyor_group_last_claim_timestamp_seconds{queue,group}``
  (absent before its first claim; to about a second),
  ``conveyor_group_state{queue,group,state}`` (1 for the state it is in, 0 for
  the other two of ``ok``, ``lagging``, ``stalled``) and
  ``conveyor_group_stalled{queue,group}`` (1 when stalled: the one to alert on).

* **a worker process** — counted as it works, per task name:
  ``conveyor_worker_claims_total``, ``conveyor_worker_succeeded_total``,
  ``conveyor_worker_failed_total`` (failed for good), ``conveyor_worker_retries_total``
  (failed, will run again), ``conveyor_worker_snoozed_total``,
  ``conveyor_worker_lost_total`` (lease lost or task cancelled), the
  ``conveyor_worker_run_seconds`` histogram (from start to the recorded outcome),
  and ``conveyor_worker_in_flight``, ``conveyor_worker_capacity``, the
  ``conveyor_worker_claim_seconds`` and ``conveyor_worker_ack_batch_size`` histograms.

The dashboard serves the store's metrics at ``/metrics``; ``conveyor worker
--metrics-port 9100`` serves both from the worker process.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conveyor.errors import ConfigurationError

if TYPE_CHECKING:
    from conveyor.models import ConsumerGroup, QueueStats
    from conveyor.store.base import TaskStore

METRICS_INSTALL = "pip install 'conveyor[metrics]'"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Buckets of the run-duration histogram, in seconds.
RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def available() -> bool:
    """Whether ``prometheus_client`` is installed."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


def _require() -> None:
    if not available():
        raise ConfigurationError(f"metrics need prometheus_client: run `{METRICS_INSTALL}`")


# ------------------------------------------------------------------ store side
@dataclass(frozen=True, slots=True)
class StoreSnapshot:
    """The store's numbers at one moment, as the metrics report them."""

    stats: Sequence[QueueStats]
    totals: Sequence[tuple[str, str | None, str, str, int]]
    groups: Sequence[ConsumerGroup] = ()


#: The states of ``conveyor_group_state``, each a series of its own.
GROUP_STATES = ("ok", "lagging", "stalled")


async def snapshot(store: TaskStore) -> StoreSnapshot:
    """Read the store's roll-ups for one scrape (three cheap reads)."""
    return StoreSnapshot(
        stats=await store.stats(),
        totals=await store.finished_totals(),
        groups=await store.groups(),
    )


def store_families(snap: StoreSnapshot) -> Iterator[Any]:
    """The store's metric families for ``snap``."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    tasks = GaugeMetricFamily(
        "conveyor_queue_tasks",
        "Tasks by status, per queue and consumer group (group empty: queue mode).",
        labels=["queue", "group", "status"],
    )
    lag = GaugeMetricFamily(
        "conveyor_queue_lag",
        "Tasks not yet terminal, per queue and consumer group.",
        labels=["queue", "group"],
    )
    oldest = GaugeMetricFamily(
        "conveyor_queue_oldest_claimable_age_seconds",
        "Age of the oldest claimable task (absent when nothing is claimable).",
        labels=["queue", "group"],
    )
    paused = GaugeMetricFamily(
        "conveyor_queue_paused",
        "1 while claims of the queue (group empty: queue mode) or group lease nothing.",
        labels=["queue", "group"],
    )
    for qs in snap.stats:
        # A groups-only queue has no queue-mode series: its queue-mode rows are
        # never claimed, and a lag that never falls would page someone forever.
        views: list[tuple[str, dict[str, int], float | None, bool]] = (
            [("", qs.counts, qs.oldest_claimable_age, qs.paused)] if qs.queue_mode else []
        )
        views += [(g, gs.counts, gs.oldest_claimable_age, gs.paused) for g, gs in qs.groups.items()]
        for group, counts, age, stopped in views:
            paused.add_metric([qs.queue, group], 1.0 if stopped else 0.0)
            for status, n in counts.items():
                tasks.add_metric([qs.queue, group, status], n)
            lag.add_metric([qs.queue, group], counts.get("queued", 0) + counts.get("running", 0))
            if age is not None:
                oldest.add_metric([qs.queue, group], age)
    finished = CounterMetricFamily(
        "conveyor_tasks_finished",
        "Terminal outcomes per task name (evicted included), across all processes.",
        labels=["queue", "group", "name", "status"],
    )
    for queue, grp, name, status, n in snap.totals:
        finished.add_metric([queue, grp or "", name, status], n)
    yield from (tasks, lag, oldest, paused, finished)
    yield from group_families(snap.groups)


def group_families(groups: Iterable[ConsumerGroup]) -> Iterator[Any]:
    """The health of each subscribed group (an unsubscribed one has none)."""
    from prometheus_client.core import GaugeMetricFamily

    labels = ["queue", "group"]
    lag = GaugeMetricFamily(
        "conveyor_group_lag", "Tasks not yet terminal for the consumer group.", labels=labels
    )
    oldest = GaugeMetricFamily(
        "conveyor_group_oldest_age_seconds",
        "Seconds since the group's oldest claimable task became claimable.",
        labels=labels,
    )
    last = GaugeMetricFamily(
        "conveyor_group_last_claim_timestamp_seconds",
        "When a claim of the group last leased a task (Unix time, to about a second).",
        labels=labels,
    )
    state = GaugeMetricFamily(
        "conveyor_group_state",
        "1 for the group's health state (ok, lagging, stalled), 0 for the others.",
        labels=[*labels, "state"],
    )
    stalled = GaugeMetricFamily(
        "conveyor_group_stalled",
        "1 when the group's work waits and it has not claimed for as long, else 0.",
        labels=labels,
    )
    for g in groups:
        if not g.active:
            continue
        key = [g.queue, g.name]
        lag.add_metric(key, g.lag)
        if g.oldest_age is not None:
            oldest.add_metric(key, g.oldest_age)
        if g.last_claim_at is not None:
            last.add_metric(key, g.last_claim_at.timestamp())
        for name in GROUP_STATES:
            state.add_metric([*key, name], 1 if g.state == name else 0)
        stalled.add_metric(key, 1 if g.state == "stalled" else 0)
    yield from (lag, oldest, last, state, stalled)


class _Families:
    """A collector that yields what a callable returns, at each scrape."""

    def __init__(self, produce: Callable[[], Iterable[Any]]) -> None:
        self.produce = produce

    def collect(self) -> Iterable[Any]:
        return self.produce()


def render(families: Iterable[Any]) -> bytes:
    """The Prometheus text exposition of ``families``."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    collected = list(families)
    registry.register(_Families(lambda: collected))
    return bytes(generate_latest(registry))


async def store_exposition(store: TaskStore) -> bytes:
    """The store's metrics as Prometheus text (what the dashboard's ``/metrics`` serves)."""
    _require()
    return render(store_families(await snapshot(store)))


# ----------------------------------------------------------------- worker side
class WorkerMetrics:
    """The worker counters and histograms of this process (one set, shared by
    every worker in it; in-flight and capacity add up over them)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        labels = ["queue", "name"]
        self.claims = Counter("conveyor_worker_claims", "Tasks claimed.", labels, registry=r)
        self.succeeded = Counter(
            "conveyor_worker_succeeded", "Attempts that succeeded.", labels, registry=r
        )
        self.failed = Counter(
            "conveyor_worker_failed", "Attempts that failed for good.", labels, registry=r
        )
        self.retries = Counter(
            "conveyor_worker_retries",
            "Attempts that failed and will run again.",
            labels,
            registry=r,
        )
        self.snoozed = Counter(
            "conveyor_worker_snoozed",
            "Attempts that snoozed (run again later, no attempt spent).",
            labels,
            registry=r,
        )
        self.lost = Counter(
            "conveyor_worker_lost",
            "Attempts dropped: the lease was lost or the task cancelled.",
            labels,
            registry=r,
        )
        self.run_seconds = Histogram(
            "conveyor_worker_run_seconds",
            "Time from an attempt's start to its recorded outcome.",
            labels,
            buckets=RUN_BUCKETS,
            registry=r,
        )
        self.claim_seconds = Histogram(
            "conveyor_worker_claim_seconds",
            "Latency of claim calls (empty claims included).",
            buckets=CLAIM_BUCKETS,
            registry=r,
        )
        self.ack_batch = Histogram(
            "conveyor_worker_ack_batch_size",
            "Successes acknowledged per commit.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self._workers: weakref.WeakSet[Any] = weakref.WeakSet()
        in_flight = Gauge(
            "conveyor_worker_in_flight", "Tasks held by this process's workers.", registry=r
        )
        capacity = Gauge(
            "conveyor_worker_capacity", "Concurrency of this process's workers.", registry=r
        )
        in_flight.set_function(lambda: float(sum(w.held for w in list(self._workers))))
        capacity.set_function(lambda: float(sum(w.concurrency for w in list(self._workers))))

    def track(self, worker: Any) -> None:
        """Count ``worker`` (anything with ``held`` and ``concurrency``) in the gauges."""
        self._workers.add(worker)


_worker_metrics: WorkerMetrics | None = None
_lock = threading.Lock()


def worker_metrics() -> WorkerMetrics | None:
    """This process's worker metrics; ``None`` without prometheus_client."""
    global _worker_metrics
    if _worker_metrics is None and available():
        with _lock:
            if _worker_metrics is None:
                _worker_metrics = WorkerMetrics()
    return _worker_metrics


def parse_address(value: str) -> tuple[str, int]:
    """``PORT`` (all interfaces) or ``HOST:PORT`` -> (host, port)."""
    host, sep, port_text = value.rpartition(":")
    if not sep:
        host, port_text = "0.0.0.0", value
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise ConfigurationError(
            f"metrics port must be PORT or HOST:PORT with a port in 1-65535, got {value!r}"
        )
    return host.strip("[]") or "0.0.0.0", port


class MetricsServer:
    """A running metrics endpoint; :meth:`close` stops it."""

    def __init__(self, server: Any, reader: _StoreReader | None) -> None:
        self.server = server
        self.reader = reader
        self.port = int(server.server_address[1])

    def close(self) -> None:
        """Stop serving and let go of the port and the store connection."""
        self.server.shutdown()
        self.server.server_close()
        if self.reader is not None:
            self.reader.close()


def serve_worker_metrics(address: str, url: str | None = None) -> MetricsServer:
    """Serve this process's worker metrics, plus the store's numbers read from
    ``url`` at each scrape (on a connection and thread of their own, so a scrape
    never waits on the worker's event loop), at ``http://address/metrics``."""
    _require()
    from prometheus_client import CollectorRegistry, start_http_server

    host, port = parse_address(address)
    mine = worker_metrics()
    assert mine is not None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(lambda: mine.registry.collect()))
    reader = None
    if url is not None:
        reader = _StoreReader(url)
        registry.register(_Families(reader.families))
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}; "
            "pick another --metrics-port"
        ) from None
    return MetricsServer(server, reader)


class _StoreReader:
    """Reads the store's numbers for the worker's metrics endpoint, lazily connected."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._store: Any = None
        self._lock = threading.Lock()

    def families(self) -> Iterable[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from conveyor.connect import connect_sync
        from conveyor.errors import ConveyorError

        up = GaugeMetricFamily(
            "conveyor_store_up", "1 when the store answered this scrape, else 0."
        )
        with self._lock:
            try:
                if self._store is None:
                    self._store = connect_sync(self.url)
                sync = self._store
                snap = StoreSnapshot(
                    stats=sync.stats(), totals=sync.finished_totals(), groups=sync.groups()
                )
            except (ConveyorError, OSError):
                up.add_metric([], 0)
                return [up]
        up.add_metric([], 1)
        return [up, *store_families(snap)]

    def close(self) -> None:
        """Close the store connection, if one was opened."""
        with self._lock:
            store, self._store = self._store, None
        if store is not None:
            store.close()
