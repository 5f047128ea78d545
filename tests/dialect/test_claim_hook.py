"""The claim hook (``Seam._claim``) on both backends against the claim order stated
once in Python (:mod:`conveyor.store.protocol.claim_order`).

Hypothesis builds small random queue states — one or two queues, priorities,
delays (tasks due at the same instants, so claim order meets its ties; the
store's ``clock_offset`` moves time on), partitions, streams held by leased or
released tasks, queue mode or a consumer group — and random claims (``limit``,
``partition``, ``per_stream``, one queue or both). Before each claim the test
reads the group's delivery rows and stream rows, asks
:func:`~conveyor.store.protocol.claim_order.claim_order` which tasks the claim
must take and in which order, and checks that the store's claim took exactly
those, in that order. Explicit cases pin each rule of the order, so that a
broken rule fails every run, not only the runs whose random cases meet it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

import conveyor
from conveyor import _values as v
from conveyor.schema import deliveries as d
from conveyor.schema import streams as s
from conveyor.schema import tasks as t
from conveyor.store import seam
from conveyor.store.base import TaskStore
from conveyor.store.protocol import claim_order
from conveyor.store.protocol.codec import group_key

QUEUES = ("a", "b")
PARTITIONS = (None, "p0", "p1")
#: Delays and the clock's step, in seconds: far apart, so whether a row is due
#: never depends on how long the example has run. Mostly delayed: a stream whose
#: head was due later than its submit waits since that instant, so rows and
#: streams due at one instant meet in claim order (the ties it breaks).
DELAYS = (0, 100, 100, 200)
STEP = 150.0
#: No lease runs out while an example runs, however far the clock moves.
LEASE = 1_000_000.0

_namespaces = itertools.count()


@dataclass(frozen=True)
class Claim:
    queues: tuple[str, ...]
    limit: int
    partition: str | None
    per_stream: int | None


TASK = st.tuples(
    st.sampled_from(QUEUES),
    # Mostly unpartitioned or one stream: more rows than a claim takes, and runs.
    st.sampled_from((None, None, "p0", "p0", "p1")),
    st.integers(0, 1),  # priority
    st.sampled_from(DELAYS),
)
CLAIM = st.builds(
    Claim,
    queues=st.sampled_from([("a",), ("b",), ("a", "b"), ("b", "a")]),
    limit=st.integers(1, 4),
    partition=st.sampled_from(PARTITIONS),
    per_stream=st.sampled_from([None, 1, 2]),
)
CLAIMING = st.tuples(st.just("claim"), CLAIM)
ADVANCE = st.tuples(st.just("advance"), st.just(STEP))
STEPS = st.lists(
    st.one_of(
        CLAIMING,
        CLAIMING,
        CLAIMING,
        ADVANCE,
        ADVANCE,
        st.tuples(st.just("succeed"), st.integers(0, 20)),
        st.tuples(st.just("release"), st.integers(0, 20)),
        st.tuples(st.just("submit"), st.lists(TASK, min_size=1, max_size=4)),
        st.tuples(st.just("submit one"), TASK),
    ),
    min_size=2,
    max_size=10,
)
CASE = st.fixed_dictionaries(
    {
        "group": st.sampled_from([None, None, "g"]),
        "tasks": st.lists(TASK, min_size=3, max_size=14),
        # Most examples start with the clock moved on, so that the rows due at one
        # instant are claimable from the first claim.
        "steps": st.tuples(st.sampled_from([0, 1, 1]), STEPS).map(
            lambda parts: [("advance", STEP)] * parts[0] + parts[1]
        ),
    }
)


CLAIM_ALL = Claim(("a", "b"), 6, None, 2)

#: The ties of claim order, each in a case of its own (random cases meet them
#: too, but not in every run): a row and a stream's head due at one instant, the
#: row first; so one claim takes rows only, a claim across streams both in that
#: order; two streams due at one instant, by queue then partition name.
_TIED = [("a", None, 0, 100), ("a", "p1", 0, 100), ("a", "p1", 0, 100), ("a", None, 0, 100)]
TIES_PLAIN_FIRST = {
    "group": None,
    "tasks": _TIED,
    "steps": [("advance", STEP), ("claim", Claim(("a",), 5, None, None))],
}
TIES_MIXED = {
    "group": "g",
    "tasks": _TIED,
    "steps": [("advance", STEP), ("claim", Claim(("a",), 3, None, 2))],
}
TIES_BY_NAME = {
    "group": None,
    "tasks": [("b", "p1", 1, 100), ("b", "p0", 1, 100), ("a", "p1", 1, 100), ("a", None, 0, 0)],
    "steps": [
        ("advance", STEP),
        ("claim", Claim(("b", "a"), 1, None, None)),
        ("claim", Claim(("b", "a"), 5, None, 1)),
    ],
}

#: Priority before waiting time, among more ready rows than the claim takes.
PRIORITY_FIRST = {
    "group": None,
    "tasks": [("a", None, 0, 0), ("a", None, 0, 0), ("a", None, 1, 0), ("a", "p0", 1, 0)],
    "steps": [("claim", Claim(("a",), 1, None, None)), ("claim", Claim(("a",), 1, None, 1))],
}
#: A stream's run stops at its first row not due; a stream whose head was
#: released while a later row is leased stays held.
RUN_STOPS = {
    "group": None,
    "tasks": [("a", "p0", 0, 0), ("a", "p0", 0, 200), ("a", "p0", 0, 0), ("a", None, 1, 0)],
    "steps": [("claim", Claim(("a",), 5, None, 3)), ("advance", STEP), ("claim", CLAIM_ALL)],
}
HELD_BEHIND_A_LEASE = {
    "group": None,
    "tasks": [("a", "p0", 0, 0)] * 3,
    "steps": [
        ("claim", Claim(("a",), 2, "p0", None)),
        ("release", 0),
        ("claim", CLAIM_ALL),
        ("succeed", 0),
        ("claim", CLAIM_ALL),
    ],
}


@dataclass
class State:
    """One group's rows in the example's queues, as the claim order reads them."""

    rows: list[claim_order.Row]
    since: dict[tuple[str, str], int]
    ids: dict[int, str]  # task seq -> id
    now: int


async def _read(store: TaskStore, grp: str, queues: Sequence[str]) -> State:
    async def read(conn: AsyncConnection) -> tuple[list[Any], list[Any]]:
        rows = await conn.execute(
            select(
                d.c.task_seq, t.c.id, d.c.queue, d.c.partition, d.c.priority, d.c.run_at, d.c.status
            )
            .select_from(d.join(t, t.c.seq == d.c.task_seq))
            .where(d.c.grp == grp, d.c.queue.in_(queues))
        )
        streams = await conn.execute(
            select(s.c.queue, s.c.partition, s.c.available_at).where(
                s.c.grp == grp, s.c.queue.in_(queues)
            )
        )
        return list(rows), list(streams)

    rows, streams = await store._run(read, write=False)
    now = v.now_us() + round(store.clock_offset * v.US)
    state = State(
        rows=[
            claim_order.Row(r.task_seq, r.queue, r.partition, r.priority, r.run_at, r.status)
            for r in rows
        ],
        since={},
        ids={r.task_seq: r.id for r in rows},
        now=now,
    )
    free = claim_order.free_streams(state.rows, now)
    available = {(r.queue, r.partition): r.available_at for r in streams}
    # What the claim reads of a stream is its row: it must agree with the rows.
    for key in {(r.queue, r.partition) for r in state.rows if r.partition is not None}:
        at = available.get(key)
        assert (key in free) == (at is not None and at <= now), (key, at, now, state.rows)
        if key in free:
            assert at is not None
            state.since[key] = at
    return state


async def _example(store: TaskStore, case: dict[str, Any]) -> None:
    ns = f"ch{next(_namespaces)}"
    queue = {name: f"{ns}-{name}" for name in QUEUES}
    group: str | None = case["group"]
    grp = group_key(group)
    store.clock_offset = 0.0
    base = v.now_us()
    if group is not None:
        for name in queue.values():
            await store.subscribe(name, group)

    def item(spec: tuple[str, str | None, int, int]) -> dict[str, Any]:
        name, partition, priority, delay = spec
        out: dict[str, Any] = {"name": "t", "queue": queue[name], "priority": priority}
        if partition is not None:
            out["partition"] = partition
        if delay:
            # The same instant for every task given this delay, whenever it is
            # submitted: ties in claim order between rows and streams' heads.
            out["run_at"] = v.from_us(base + delay * v.US)
        return out

    if case["tasks"]:
        await store.submit_many([item(spec) for spec in case["tasks"]])
    for kind, arg in case["steps"]:
        if kind == "advance":
            store.clock_offset += arg
        elif kind == "submit":
            await store.submit_many([item(spec) for spec in arg])
        elif kind == "submit one":
            await store.submit(**item(arg))
        elif kind in ("succeed", "release"):
            state = await _read(store, grp, list(queue.values()))
            running = sorted(r.seq for r in state.rows if r.status == claim_order.RUNNING)
            if running:
                task_id = state.ids[running[arg % len(running)]]
                if kind == "succeed":
                    await store.succeed(task_id, worker_id="w", group=group)
                else:
                    await store.release(task_id, worker_id="w", group=group)
        else:
            claim: Claim = arg
            names = [queue[name] for name in claim.queues]
            state = await _read(store, grp, names)
            expected = claim_order.claim_order(
                state.rows,
                state.since,
                queues=names,
                now=state.now,
                limit=claim.limit,
                partition=claim.partition,
                per_stream=claim.per_stream,
            )
            got = await store.claim(
                names,
                worker_id="w",
                group=group,
                lease=LEASE,
                limit=claim.limit,
                partition=claim.partition,
                per_stream=claim.per_stream,
            )
            by_id = {task_id: seq for seq, task_id in state.ids.items()}
            taken = [by_id[task.id] for task in got]
            assert taken == expected, (claim, state.rows, state.since)


def test_every_claim_takes_what_the_claim_order_says(store_url: str) -> None:
    with asyncio.Runner() as runner:
        store = conveyor.connect(store_url)
        runner.run(store.open())
        try:

            @settings(
                max_examples=100,
                deadline=None,
                database=None,
                suppress_health_check=[HealthCheck.too_slow],
            )
            @given(case=CASE)
            @example(case=PRIORITY_FIRST)
            @example(case=TIES_PLAIN_FIRST)
            @example(case=TIES_MIXED)
            @example(case=TIES_BY_NAME)
            @example(case=RUN_STOPS)
            @example(case=HELD_BEHIND_A_LEASE)
            def check(case: dict[str, Any]) -> None:
                runner.run(_example(store, case))

            check()
        finally:
            runner.run(store.close())


@pytest.mark.parametrize(
    ("claim", "expected"),
    [
        # Priority first; then who waited longest; plain before a stream on a tie.
        (Claim(("a",), 10, None, 1), [3, 1, 2, 4]),
        # Without per_stream: the first unit is plain, so plain rows only.
        (Claim(("a",), 10, None, None), [3, 1, 2]),
        # One partition: that stream alone, its run in submit order.
        (Claim(("a",), 10, "p0", None), [4, 5]),
    ],
)
def test_the_claim_order_by_example(claim: Claim, expected: list[int]) -> None:
    rows = [
        claim_order.Row(1, "a", None, 0, 10, "queued"),
        claim_order.Row(2, "a", None, 0, 20, "queued"),
        claim_order.Row(3, "a", None, 1, 30, "queued"),
        claim_order.Row(4, "a", "p0", 0, 20, "queued"),
        claim_order.Row(5, "a", "p0", 0, 20, "queued"),
        claim_order.Row(6, "a", "p1", 5, 20, "queued"),  # held back by 7
        claim_order.Row(7, "a", "p1", 5, 20, "running"),
        claim_order.Row(8, "a", None, 9, 99, "queued"),  # not due
    ]
    since = {("a", "p0"): 20}
    got = claim_order.claim_order(
        rows,
        since,
        queues=claim.queues,
        now=50,
        limit=claim.limit,
        partition=claim.partition,
        per_stream=claim.per_stream,
    )
    assert got == expected


async def test_the_hook_leases_nothing_while_a_lease_of_its_queues_has_expired(
    store: TaskStore,
) -> None:
    """The hook reports an expired lease instead of claiming, and writes nothing;
    the claim then recovers the lease and takes the task again with the rest."""
    first = await store.submit("t", queue="q")
    second = await store.submit("t", queue="q")
    [leased] = await store.claim("q", worker_id="w", lease=1)
    assert leased.id == first.id
    store.clock_offset = 10.0
    for queues in (["q"], ["other", "q"]):
        assert await store._claim(seam.Claim("", queues, "w2", None, 5, None, None)) is None
    assert (await store.get(first.id)).worker_id == "w"  # type: ignore[union-attr]
    assert (await store.get(second.id)).status is conveyor.Status.QUEUED  # type: ignore[union-attr]
    got = await store.claim(["other", "q"], worker_id="w2", limit=5)
    assert [task.id for task in got] == [first.id, second.id]
    assert [task.attempt for task in got] == [2, 1]


async def test_the_hook_passes_over_a_paused_queue_or_group(store: TaskStore) -> None:
    """A paused queue's work (whole, or for the claiming group) is not leased by
    the hook, alone or among other queues, streams and plain rows alike; another
    group's and another queue's work is."""
    await store.subscribe("q", "g")
    await store.subscribe("q", "h")
    made = [
        await store.submit("t", queue="q"),
        await store.submit("t", queue="q", partition="p"),
    ]
    other = await store.submit("t", queue="other")

    def ask(grp: str, queues: list[str]) -> seam.Claim:
        return seam.Claim(grp, queues, "w", None, 5, None, 5)

    await store.pause("q", group="g")
    assert await store._claim(ask("g", ["q"])) == []
    got = await store._claim(ask("h", ["q"]))
    assert got is not None and {r.id for r in got} == {t.id for t in made}
    await store.pause("q")
    for grp in ("", "g"):
        assert await store._claim(ask(grp, ["q"])) == []
    both = await store._claim(ask("", ["q", "other"]))
    assert both is not None and [r.id for r in both] == [other.id]


async def test_a_claim_that_finds_work_is_one_transaction_of_one_hop(
    store: TaskStore, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hot path: on Postgres one statement on a kept autocommit connection (one
    round trip), on SQLite one function on the connection thread (one hop), for one
    queue or several."""
    from conveyor.store.protocol import transactions

    await store.submit_many([{"name": "t", "queue": q} for q in ("q", "r") for _ in range(4)])
    assert await store.claim("q", worker_id="w")  # the probe is skipped from now on
    assert await store.claim(["q", "r"], worker_id="w")
    runs: list[str] = []
    run = transactions.run

    async def counted(*args: Any, **kwargs: Any) -> Any:
        runs.append("alone" if kwargs.get("alone") is not None else "transaction")
        return await run(*args, **kwargs)

    monkeypatch.setattr(transactions, "run", counted)
    hops: list[str] = []
    if backend == "sqlite":
        thread: Any = store._connection_runner()
        call = thread.call

        async def hop(*args: Any, **kwargs: Any) -> Any:
            hops.append("hop")
            return await call(*args, **kwargs)

        monkeypatch.setattr(thread, "call", hop)
    else:
        direct = store._run_direct  # type: ignore[attr-defined]

        async def sent(*args: Any) -> Any:
            hops.append("statement")
            return await direct(*args)

        monkeypatch.setattr(store, "_run_direct", sent)
    for queues in (["q"], ["q", "r"]):
        runs.clear()
        hops.clear()
        assert len(await store.claim(queues, worker_id="w", limit=2)) == 2
        assert len(runs) == 1, runs
        assert hops == ["statement" if backend == "postgres" else "hop"]
