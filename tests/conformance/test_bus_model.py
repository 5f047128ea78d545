"""A hypothesis state machine: the store against a small pure-Python model of bus mode.

The model knows queue mode and two consumer groups (``ga`` subscribed up front,
``gb`` subscribed by its first claim, given ``subscribe="all"``), partitions
(strict FIFO streams per view), delays, retries, cancels and stale lease
holders. After every step the store's view of every task, for every view, must
equal the model's; every claim must be one the model allows.

Runs on both backends through the blocking facade (hypothesis rules are sync).
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import conveyor
from conveyor import LostLease, SyncStore, TaskCancelled
from conveyor.models import Task

QM = ""  # queue mode's key in the model
GROUPS = ("ga", "gb")
VIEWS = (QM, *GROUPS)
PARTITIONS = (None, "p", "q")
FAR = 3600  # seconds: a delay that never runs out during one example


def group_arg(view: str) -> str | None:
    return view or None


@dataclass
class Delivery:
    """One task as one view sees it."""

    status: str = "queued"
    attempt: int = 0
    budget: int = 0  # extra attempts granted by retry(reset_attempts=True)
    tick: int = 0  # order of run_at among this view's deliveries
    future: bool = False  # run_at far ahead: not claimable in this example
    worker: str | None = None


@dataclass
class ModelTask:
    id: str
    seq: int
    partition: str | None
    max_attempts: int
    delayed: bool
    tick: int
    views: dict[str, Delivery] = field(default_factory=dict)


@dataclass
class Stale:
    """A holder whose lease was taken away by a cancel."""

    view: str
    task_id: str
    worker: str
    attempt: int


class BusModel(RuleBasedStateMachine):
    """Subclassed per test with ``store`` bound (one open SyncStore per backend)."""

    store: SyncStore

    def __init__(self) -> None:
        super().__init__()
        self.queue = f"model-{uuid.uuid4().hex[:12]}"  # a fresh queue per example
        self.tasks: list[ModelTask] = []
        self.subscribed = {QM: True, "ga": False, "gb": False}
        self.ticks = itertools.count(1)
        self.workers = itertools.count(1)
        self.stale: list[Stale] = []

    # ------------------------------------------------------------ helpers
    def deliveries(self, view: str) -> list[tuple[ModelTask, Delivery]]:
        return [(t, t.views[view]) for t in self.tasks if view in t.views]

    def by_id(self, task_id: str) -> ModelTask:
        return next(t for t in self.tasks if t.id == task_id)

    def running(self, view: str) -> list[tuple[ModelTask, Delivery]]:
        return [(t, d) for t, d in self.deliveries(view) if d.status == "running"]

    def ready_plain(self, view: str) -> list[ModelTask]:
        ready = [
            (d.tick, t.seq, t)
            for t, d in self.deliveries(view)
            if t.partition is None and d.status == "queued" and not d.future
        ]
        return [t for _, _, t in sorted(ready, key=lambda x: (x[0], x[1]))]

    def ready_stream(self, view: str, partition: str) -> list[ModelTask]:
        """The consecutive ready tasks from the head of a free stream (else empty)."""
        active = [
            (t, d)
            for t, d in self.deliveries(view)
            if t.partition == partition and d.status in ("queued", "running")
        ]
        out = []
        for t, d in active:  # in submit order
            if d.status != "queued" or d.future:
                break
            out.append(t)
        if any(d.status == "running" for _, d in active):
            return []
        return out

    def subscribe_gb(self) -> None:
        """What a first claim by ``gb`` (with ``subscribe="all"``) does."""
        self.subscribed["gb"] = True
        for t in self.tasks:
            cancelled = t.views[QM].status == "cancelled"
            t.views["gb"] = Delivery(
                status="cancelled" if cancelled else "queued",
                tick=t.tick,
                future=t.delayed,
            )

    # -------------------------------------------------------------- rules
    @initialize()
    def subscribe_ga(self) -> None:
        group = self.store.subscribe(self.queue, "ga", start="all")
        assert group.active and group.name == "ga"
        self.subscribed["ga"] = True

    @rule(
        partition=st.sampled_from(PARTITIONS),
        delayed=st.booleans(),
        max_attempts=st.integers(1, 3),
    )
    def submit(self, partition: str | None, delayed: bool, max_attempts: int) -> None:
        task = self.store.submit(
            "step",
            {"n": len(self.tasks)},
            queue=self.queue,
            partition=partition,
            delay=FAR if delayed else None,
            max_attempts=max_attempts,
        )
        tick = next(self.ticks)
        mt = ModelTask(task.id, len(self.tasks), partition, max_attempts, delayed, tick)
        for view in VIEWS:
            if self.subscribed[view]:
                mt.views[view] = Delivery(tick=tick, future=delayed)
        self.tasks.append(mt)

    @rule(
        view=st.sampled_from(VIEWS),
        partition=st.sampled_from(PARTITIONS),
        limit=st.integers(1, 3),
    )
    def claim(self, view: str, partition: str | None, limit: int) -> None:
        first = not self.subscribed[view]
        if first:
            self.subscribe_gb()
        worker = f"w{next(self.workers)}"
        got = self.store.claim(
            self.queue,
            worker_id=worker,
            group=group_arg(view),
            partition=partition,
            limit=limit,
            subscribe="all" if first else None,
        )
        streams = [partition] if partition is not None else ["p", "q"]
        options = {p: self.ready_stream(view, p) for p in streams}
        plain = self.ready_plain(view) if partition is None else []
        if not got:
            assert plain == [] and all(v == [] for v in options.values()), (
                "claim returned nothing although the model has claimable work",
                plain,
                options,
            )
            return
        assert len(got) <= limit
        parts = {t.partition for t in got}
        assert len(parts) == 1, f"one claim mixed streams: {parts}"
        (part,) = parts
        got_ids = [t.id for t in got]
        if part is None:
            assert partition is None
            expected = [t.id for t in plain[:limit]]
            assert got_ids == expected, "unpartitioned tasks out of claim order"
        else:
            assert part in streams
            ready = [t.id for t in options[part]]
            assert ready, f"stream {part!r} was not free"
            assert got_ids == ready[: len(got_ids)], "not the head of the stream, in order"
        for t in got:
            d = self.by_id(t.id).views[view]
            d.status, d.attempt, d.worker = "running", d.attempt + 1, worker
            assert (t.status, t.attempt, t.group) == ("running", d.attempt, group_arg(view))

    @precondition(lambda self: any(self.running(v) for v in VIEWS))
    @rule(data=st.data(), result=st.integers(0, 9))
    def succeed(self, data: st.DataObject, result: int) -> None:
        view = data.draw(st.sampled_from([v for v in VIEWS if self.running(v)]))
        t, d = data.draw(st.sampled_from(self.running(view)))
        assert d.worker is not None
        done = self.store.succeed(
            t.id, worker_id=d.worker, group=group_arg(view), result=result, attempt=d.attempt
        )
        d.status, d.worker = "succeeded", None
        assert (done.status, done.result) == ("succeeded", result)

    @precondition(lambda self: any(self.running(v) for v in VIEWS))
    @rule(data=st.data(), retryable=st.booleans(), delayed=st.booleans())
    def fail(self, data: st.DataObject, retryable: bool, delayed: bool) -> None:
        view = data.draw(st.sampled_from([v for v in VIEWS if self.running(v)]))
        t, d = data.draw(st.sampled_from(self.running(view)))
        assert d.worker is not None
        got = self.store.fail(
            t.id,
            worker_id=d.worker,
            group=group_arg(view),
            error="model says no",
            retryable=retryable,
            delay=FAR if delayed else 0,
            attempt=d.attempt,
        )
        d.worker = None
        if retryable and d.attempt < t.max_attempts + d.budget:
            d.status, d.tick, d.future = "queued", next(self.ticks), delayed
        else:
            d.status = "failed"
        assert got.status == d.status

    @precondition(lambda self: bool(self.tasks))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        t = data.draw(st.sampled_from(self.tasks))
        self.store.cancel(t.id)
        for view, d in t.views.items():
            if d.status == "running":
                assert d.worker is not None
                self.stale.append(Stale(view, t.id, d.worker, d.attempt))
            if d.status in ("queued", "running"):
                d.status, d.worker = "cancelled", None
        view = data.draw(st.sampled_from(sorted(t.views)))
        seen = self.store.get(t.id, group=group_arg(view))
        assert seen is not None and seen.status == t.views[view].status

    @precondition(lambda self: bool(self.stale))
    @rule(data=st.data())
    def stale_holder_writes(self, data: st.DataObject) -> None:
        s = data.draw(st.sampled_from(self.stale))
        self.stale.remove(s)
        still_cancelled = self.by_id(s.task_id).views[s.view].status == "cancelled"
        with pytest.raises(LostLease) as caught:
            self.store.succeed(s.task_id, worker_id=s.worker, group=group_arg(s.view))
        assert isinstance(caught.value, TaskCancelled) == still_cancelled

    @precondition(
        lambda self: any(
            d.status in ("failed", "cancelled") for t in self.tasks for d in t.views.values()
        )
    )
    @rule(data=st.data(), reset=st.booleans())
    def retry(self, data: st.DataObject, reset: bool) -> None:
        candidates = [
            (view, t)
            for t in self.tasks
            for view, d in t.views.items()
            if d.status in ("failed", "cancelled")
        ]
        view, t = data.draw(st.sampled_from(candidates))
        got = self.store.retry(t.id, group=group_arg(view), reset_attempts=reset)
        d = t.views[view]
        d.status, d.tick, d.future = "queued", next(self.ticks), False
        if reset:
            d.budget = d.attempt
        assert got is not None and (got.status, got.attempt) == ("queued", d.attempt)
        assert got.max_attempts == t.max_attempts + d.budget

    # ---------------------------------------------------------- invariant
    @invariant()
    def store_agrees_with_model(self) -> None:
        for view in VIEWS:
            if self.subscribed[view]:
                self.check_view(view)

    def teardown(self) -> None:
        if not self.subscribed["gb"]:
            self.check_view("gb")  # nothing was delivered to a group that never claimed

    def check_view(self, view: str) -> None:
        page = self.store.list(queue=self.queue, group=group_arg(view), limit=1000)
        seen: dict[str, Task] = {t.id: t for t in page.items}
        expected = {t.id: t.views[view] for t in self.tasks if view in t.views}
        assert set(seen) == set(expected), (view, "tasks delivered to the view differ")
        for task_id, d in expected.items():
            t = seen[task_id]
            assert (t.status, t.attempt) == (d.status, d.attempt), (view, task_id)
            assert t.group == group_arg(view)


def test_bus_model(store_url: str) -> None:
    with conveyor.connect_sync(store_url) as store:

        class Machine(BusModel):
            pass

        Machine.store = store
        # No shrinking: replaying a failing run of up to 20 steps against a real
        # database many times over would outlast the per-test timeout; the
        # unshrunk steps are printed and short enough to read.
        Machine.TestCase.settings = settings(
            max_examples=25,
            stateful_step_count=20,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.reuse, Phase.generate],
        )
        Machine.TestCase().runTest()
