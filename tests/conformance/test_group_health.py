"""Consumer-group health: ``groups()``' lag, oldest_age, last_claim_at and state.

Every test runs on SQLite and PostgreSQL (the ``store`` fixture). Time moves by
the store's ``clock_offset``, never by sleeping.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import conveyor
from conveyor import ConsumerGroup, InvalidArgument
from conveyor.store.base import TaskStore

Q = "events"
#: Slack for readings of the clock a statement or two apart (Postgres reads the
#: server's clock, the test the process's).
SLACK = 3.0


async def _group(store: TaskStore, name: str = "g", **kwargs: float) -> ConsumerGroup:
    [found] = [g for g in await store.groups(Q, **kwargs) if g.name == name]
    return found


def _store_now(store: TaskStore) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=store.clock_offset)


def _close(at: datetime | None, expected: datetime) -> bool:
    return at is not None and abs((at - expected).total_seconds()) < SLACK


async def test_a_new_group_with_no_work_reads_ok(store: TaskStore) -> None:
    await store.subscribe(Q, "g", start="new")
    group = await _group(store)
    assert (group.lag, group.oldest_age, group.last_claim_at, group.state) == (0, None, None, "ok")


async def test_lag_counts_queued_and_running_tasks_as_stats_does(store: TaskStore) -> None:
    await store.subscribe(Q, "g", start="new")
    ids = [(await store.submit("e", {"n": n}, queue=Q)).id for n in range(4)]
    assert (await _group(store)).lag == 4
    [first] = await store.claim(Q, worker_id="w", group="g")
    assert first.id == ids[0]
    assert (await _group(store)).lag == 4  # running is not done
    await store.succeed(first.id, worker_id="w", group="g")
    group = await _group(store)
    [stats] = await store.stats(Q)
    assert group.lag == stats.groups["g"].lag == 3
    # Queue mode's claims are not the group's.
    await store.claim(Q, worker_id="w", limit=4)
    assert (await _group(store)).lag == 3


async def test_oldest_age_is_the_time_since_the_oldest_due_task_became_claimable(
    store: TaskStore,
) -> None:
    await store.subscribe(Q, "g", start="new")
    await store.submit("e", {}, queue=Q, delay=100, priority=-10)
    assert (await _group(store)).oldest_age is None  # queued, not due: nothing claimable
    await store.submit("e", {}, queue=Q, priority=5)
    await store.submit("e", {}, queue=Q, priority=-5)
    store.clock_offset = 40
    age = (await _group(store)).oldest_age
    assert age is not None and 40 <= age < 40 + SLACK
    store.clock_offset = 130  # the delayed task is due since 30 s: the others are older
    age = (await _group(store)).oldest_age
    assert age is not None and 130 <= age < 130 + SLACK
    # Claim the two oldest (priority first): the delayed one is left, due 30 s ago.
    taken = await store.claim(Q, worker_id="w", group="g", limit=2)
    assert [t.priority for t in taken] == [5, -5]
    age = (await _group(store)).oldest_age
    assert age is not None and 30 <= age < 30 + SLACK


async def test_a_task_older_than_the_group_is_claimable_since_the_group_subscribed(
    store: TaskStore,
) -> None:
    await store.submit("e", {}, queue=Q)
    store.clock_offset = 1000
    await store.subscribe(Q, "g", start="all")
    store.clock_offset = 1010
    group = await _group(store)
    assert group.lag == 1
    assert group.oldest_age is not None and 10 <= group.oldest_age < 10 + SLACK


async def test_a_partitioned_task_is_claimable_from_when_it_heads_a_free_stream(
    store: TaskStore,
) -> None:
    await store.subscribe(Q, "g", start="new")
    first = await store.submit("e", {}, queue=Q, partition="p")
    await store.submit("e", {}, queue=Q, partition="p")
    store.clock_offset = 5
    age = (await _group(store)).oldest_age
    assert age is not None and 5 <= age < 5 + SLACK
    [taken] = await store.claim(Q, worker_id="w", group="g")
    assert taken.id == first.id
    # The second waits behind its stream's leased head: not claimable.
    assert (await _group(store)).oldest_age is None
    store.clock_offset = 60
    await store.succeed(first.id, worker_id="w", group="g")
    store.clock_offset = 70
    age = (await _group(store)).oldest_age
    assert age is not None and 10 <= age < 10 + SLACK  # since the head was freed


async def test_the_states_by_the_queues_lease(store: TaskStore) -> None:
    """Ten leases of 2 s: the threshold is 20 s. Never claimed with work waiting
    longer: stalled; claimed within it but the oldest task still older: lagging;
    no claim for longer either: stalled again; the backlog gone: ok."""
    await store.configure_queue(Q, lease=2)
    await store.subscribe(Q, "g", start="new")
    for n in range(3):
        await store.submit("e", {"n": n}, queue=Q)
    store.clock_offset = 15
    assert (await _group(store)).state == "ok"
    store.clock_offset = 25
    group = await _group(store)
    assert (group.state, group.last_claim_at) == ("stalled", None)
    [taken] = await store.claim(Q, worker_id="w", group="g")
    group = await _group(store)
    assert _close(group.last_claim_at, _store_now(store))
    assert group.state == "lagging"  # claims, but its oldest task waited 25 s
    store.clock_offset = 50
    assert (await _group(store)).state == "stalled"  # no claim for 25 s
    # The two left, and the first again: its 2 s lease ran out long ago.
    rest = await store.claim(Q, worker_id="w", group="g", limit=10)
    assert sorted(t.payload["n"] for t in rest) == [0, 1, 2]
    assert taken.payload["n"] == 0
    group = await _group(store)
    assert (group.state, group.oldest_age, group.lag) == ("ok", None, 3)
    store.clock_offset = 500  # idle long after its last claim, with no work: ok
    assert (await _group(store)).state == "ok"


async def test_lagging_after_sets_the_threshold(store: TaskStore) -> None:
    await store.subscribe(Q, "g", start="new")
    await store.submit("e", {}, queue=Q)
    await store.submit("e", {}, queue=Q)
    store.clock_offset = 10
    assert (await _group(store)).state == "ok"  # default: 10 x the 30 s default lease
    assert (await _group(store, lagging_after=5)).state == "stalled"
    assert (await _group(store, lagging_after=60)).state == "ok"
    await store.claim(Q, worker_id="w", group="g")
    [group] = await store.groups(Q, lagging_after=timedelta(seconds=5))
    assert group.state == "lagging"


@pytest.mark.parametrize("bad", [0, -1, "soon", True, float("nan")])
async def test_a_bad_threshold_is_refused(store: TaskStore, bad: object) -> None:
    with pytest.raises(InvalidArgument) as caught:
        await store.groups(lagging_after=bad)  # type: ignore[arg-type]
    assert caught.value.field == "lagging_after"


async def test_claims_record_their_time_about_once_a_second(store: TaskStore) -> None:
    await store.subscribe(Q, "g", start="new")
    for n in range(4):
        await store.submit("e", {"n": n}, queue=Q)
    assert await store.claim(Q, worker_id="w", group="g", limit=1)
    first = (await _group(store)).last_claim_at
    assert _close(first, _store_now(store))
    store.clock_offset = 0.5
    assert await store.claim(Q, worker_id="w", group="g", limit=1)
    assert (await _group(store)).last_claim_at == first  # within the second: not written
    store.clock_offset = 30
    assert await store.claim(Q, worker_id="w", group="g", limit=1)
    later = (await _group(store)).last_claim_at
    assert first is not None and later is not None
    assert 29 < (later - first).total_seconds() < 30 + SLACK


async def test_a_claim_that_leases_nothing_and_queue_mode_record_no_claim(
    store: TaskStore,
) -> None:
    await store.subscribe(Q, "g", start="new")
    assert await store.claim(Q, worker_id="w", group="g") == []
    await store.submit("e", {}, queue=Q)
    assert len(await store.claim(Q, worker_id="w")) == 1  # queue mode
    assert (await _group(store)).last_claim_at is None


async def test_a_claim_over_several_queues_records_each_queue_it_leased_from(
    store: TaskStore,
) -> None:
    for queue in ("a", "b", "c"):
        await store.subscribe(queue, "g", start="new")
    await store.submit("e", {}, queue="a")
    await store.submit("e", {}, queue="c")
    assert len(await store.claim(["a", "b", "c"], worker_id="w", group="g", limit=10)) == 2
    claimed = {g.queue: g.last_claim_at for g in await store.groups()}
    assert claimed["b"] is None
    assert _close(claimed["a"], _store_now(store)) and _close(claimed["c"], _store_now(store))


async def test_an_unsubscribed_group_reads_ok_and_starts_over_unclaimed(
    store: TaskStore,
) -> None:
    await store.subscribe(Q, "g", start="new")
    await store.submit("e", {}, queue=Q)
    await store.submit("e", {}, queue=Q)
    await store.claim(Q, worker_id="w", group="g")
    store.clock_offset = 1000
    assert (await _group(store)).state == "stalled"
    await store.unsubscribe(Q, "g")
    group = await _group(store)
    assert not group.active
    assert (group.lag, group.oldest_age, group.last_claim_at, group.state) == (0, None, None, "ok")
    await store.subscribe(Q, "g", start="all")
    group = await _group(store)
    assert group.active and group.lag == 2 and group.last_claim_at is None
    assert group.oldest_age is not None and group.oldest_age < SLACK  # since it subscribed
    assert group.state == "ok"


async def test_a_claims_note_landing_after_the_unsubscribe_is_dropped_on_resubscribe(
    store: TaskStore,
) -> None:
    """A claim's note is written after its claim committed: one of a claim that
    raced the unsubscribe may land after it. Subscribing again starts without it."""
    from conveyor.store.protocol import groups

    await store.subscribe(Q, "g", start="new")
    await store.submit("e", {}, queue=Q)
    claimed = await store.claim(Q, worker_id="w", group="g")
    await store.unsubscribe(Q, "g")
    store.clock_offset = 5  # past the once-a-second throttle
    await groups.note_claims(store, "g", claimed)  # the late note
    await store.subscribe(Q, "g", start="all")
    assert (await _group(store)).last_claim_at is None


async def test_another_store_reads_the_claim_time_and_it_never_moves_back(
    store: TaskStore, store_url: str
) -> None:
    """One store claims, a second one (its own connections) reads when; a third
    whose clock is behind claims later and leaves the time where it was."""
    async with conveyor.connect(store_url) as claimer, conveyor.connect(store_url) as behind:
        behind.clock_offset = -600
        await behind.subscribe(Q, "g", start="new")
        for n in range(3):  # due by the clock that is behind too
            await behind.submit("e", {"n": n}, queue=Q)
        assert await claimer.claim(Q, worker_id="w1", group="g")
        seen = (await _group(store)).last_claim_at
        assert _close(seen, _store_now(store))
        assert await behind.claim(Q, worker_id="w2", group="g")
        assert (await _group(store)).last_claim_at == seen


async def test_groups_of_one_queue_read_only_their_own(store: TaskStore) -> None:
    await store.subscribe(Q, "g", start="new")
    await store.subscribe("other", "g", start="new")
    await store.submit("e", {}, queue="other")
    await store.claim("other", worker_id="w", group="g")
    group = await _group(store)
    assert (group.lag, group.last_claim_at) == (0, None)
    [other] = await store.groups("other")
    assert other.lag == 1 and other.last_claim_at is not None


def test_the_blocking_store_reads_health_too(sync_store: conveyor.SyncStore) -> None:
    sync_store.subscribe(Q, "g", start="new")
    sync_store.submit("e", {}, queue=Q)
    sync_store.store.clock_offset = 100
    [group] = sync_store.groups(Q, lagging_after=50)
    assert (group.lag, group.state) == (1, "stalled")
