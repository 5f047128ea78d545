"""Hostile input, on both backends (SPEC §3.5): names, keys, groups and partitions
with quotes, ``%``, ``:``, NUL, lone surrogates, 10 kB strings and any unicode;
payloads with deep nesting, huge ints, NaN and Infinity, bytes, sets, tuples and
cycles. Each value either reads back exactly (tuples as lists: JSON has no
tuples) or raises :class:`InvalidArgument` having written nothing; never a raw
driver exception. Payloads and results over the size limit are refused up front.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import conveyor
from conveyor import InvalidArgument, SyncStore

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)

NASTY = [
    "'",
    '"',
    "''; DROP TABLE conveyor_tasks; --",
    "%",
    "%s",
    "%(name)s",
    ":",
    ":name",
    "a:b",
    "\\",
    "\x00",
    "a\x00b",
    "\ud800",
    "x\udfff",
    "\n\t\r",
    " ",
    "名前",
    "🙂" * 3,
    "ǅ\u0301\u200d",
    "x" * 10_240,
    "é" * 255,
    "🙂" * 255,
]
# Any code point, surrogates and NUL included.
ANY_TEXT = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40)
NAMES = st.one_of(st.sampled_from(NASTY), ANY_TEXT, st.text(min_size=250, max_size=300))


def _nest(depth: int) -> Any:
    value: Any = "core"
    for _ in range(depth):
        value = [value]
    return value


def _cycle() -> Any:
    loop: list[Any] = [1]
    loop.append({"again": loop})
    return loop


LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    # Huge ints, up to past Python's 4300-digit conversion limit.
    st.sampled_from([19, 20, 300, 4299, 4300, 5000]).map(lambda digits: -(10**digits)),
    st.floats(allow_nan=True, allow_infinity=True),
    ANY_TEXT,
    st.binary(max_size=8),
)
PAYLOADS = st.one_of(
    st.recursive(
        LEAVES,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.tuples(inner, inner),
            st.dictionaries(ANY_TEXT, inner, max_size=4),
            st.dictionaries(st.integers(), inner, min_size=1, max_size=2),
            st.frozensets(st.integers(), max_size=3),
            st.sets(st.integers(), max_size=3),
        ),
        max_leaves=12,
    ),
    st.sampled_from([50, 99, 100, 101, 5000, 100_000]).map(_nest),
    st.builds(_cycle),
)
# Values JSON holds natively: these must all be accepted.
JSON_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=20).filter(lambda s: "\x00" not in s or True),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)


def same(sent: Any, got: Any) -> bool:
    """Exactly equal, types included (a tuple sent reads back as a list)."""
    if isinstance(sent, tuple):
        sent = list(sent)
    if type(sent) is not type(got):
        return False
    if isinstance(sent, float):
        return sent == got and math.copysign(1, sent) == math.copysign(1, got)
    if isinstance(sent, list):
        return len(sent) == len(got) and all(same(a, b) for a, b in zip(sent, got, strict=True))
    if isinstance(sent, dict):
        return sent.keys() == got.keys() and all(same(sent[k], got[k]) for k in sent)
    return bool(sent == got)


def _footprint(store: SyncStore) -> tuple[int, int]:
    """How many tasks and groups exist: a refused call must change neither."""
    tasks = sum(sum(s.counts.values()) for s in store.stats())
    return tasks, len(store.groups())


def _refused_cleanly(call: Any) -> Any:
    """Run ``call``: its result, or None when it raised an InvalidArgument naming its
    field. (Each test keeps a tally of what its accepted calls wrote and compares
    it with the store's footprint, so a refused call that wrote shows up.)"""
    try:
        return call()
    except InvalidArgument as exc:
        assert exc.field and exc.field in str(exc)
        return None


@pytest.fixture
def fuzz_store(store_url: str) -> Any:
    with conveyor.connect_sync(store_url) as store:
        yield store


@pytest.mark.timeout(300)
def test_names_keys_groups_partitions(fuzz_store: SyncStore) -> None:
    store = fuzz_store
    counter = iter(range(10**9))
    tally = list(_footprint(store))  # tasks and groups the accepted calls made

    @settings(SETTINGS, max_examples=25)  # each example makes ~30 calls
    @given(NAMES)
    def check(text: str) -> None:
        n = next(counter)
        for field in ("name", "queue", "key", "partition", "correlation_id"):
            args: dict[str, Any] = {"name": "job", "queue": f"q{n}"}
            args[field] = text
            task = _refused_cleanly(lambda a=args: store.submit(**a))
            if task is None:
                continue
            if task.queue == f"q{n}" or field == "queue":  # not an earlier task reused by key
                tally[0] += 1
            again = store.get(task.id)
            assert again is not None and getattr(again, field) == text
            if field == "key":
                found = store.get_by_key(text)
                assert found is not None and found.key == text
            if field == "name":
                assert [t.id for t in store.list(name=text, queue=f"q{n}").items] == [task.id]
            if field == "queue":
                [claimed] = store.claim(text, worker_id="w")
                assert claimed.id == task.id and claimed.queue == text
            if field == "partition":
                [claimed] = store.claim(f"q{n}", worker_id="w", partition=text)
                assert claimed.partition == text
        # As a group: subscribe, claim, read back the group's view.
        group = _refused_cleanly(lambda: store.subscribe(f"g{n}", text))
        if group is not None:
            assert group.name == text
            task = store.submit("job", queue=f"g{n}")
            tally[0] += 1
            tally[1] += 1
            [claimed] = store.claim(f"g{n}", worker_id="w", group=text)
            assert claimed.id == task.id and claimed.group == text
            done = store.succeed(task.id, worker_id="w", group=text, result={"g": text})
            assert done.result == {"g": text}
        # As an id, a worker id, a cursor: None/NotFound or InvalidArgument, never a crash.
        for call in (
            lambda: store.get(text),
            lambda: store.cancel(text),
            lambda: store.list(cursor=text),
            lambda: store.claim(f"q{n}", worker_id=text),
        ):
            try:
                _refused_cleanly(call)
            except conveyor.NotFound:
                pass
        assert _footprint(store) == tuple(tally), "a refused call wrote something"

    check()


@pytest.mark.timeout(300)
def test_payloads_results_and_metadata(fuzz_store: SyncStore) -> None:
    store = fuzz_store
    counter = iter(range(10**9))
    tally = list(_footprint(store))

    @SETTINGS
    @given(PAYLOADS)
    def check(value: Any) -> None:
        n = next(counter)
        queue = f"p{n}"
        task = _refused_cleanly(lambda: store.submit("job", value, queue=queue))
        if task is not None:
            tally[0] += 1
            got = store.get(task.id)
            assert got is not None and same(value, got.payload), (value, got.payload)
        if isinstance(value, dict):
            meta = _refused_cleanly(lambda: store.submit("job", queue=queue, metadata=value))
            if meta is not None:
                tally[0] += 1
                again = store.get(meta.id)
                assert again is not None and same(value, again.metadata)
        # As a result: refused without touching the task, or read back exactly.
        holder = store.submit("job", queue=f"r{n}")
        tally[0] += 1
        [claimed] = store.claim(f"r{n}", worker_id="w")
        try:
            done = store.succeed(claimed.id, worker_id="w", result=value)
        except InvalidArgument:
            still = store.get(holder.id)
            assert still is not None and still.status is conveyor.Status.RUNNING
            store.succeed(claimed.id, worker_id="w")
        else:
            assert same(value, done.result)
            again = store.get(holder.id)
            assert again is not None and same(value, again.result)
        assert _footprint(store) == tuple(tally), "a refused call wrote something"

    check()


@pytest.mark.timeout(300)
def test_json_values_are_accepted(fuzz_store: SyncStore) -> None:
    store = fuzz_store

    @SETTINGS
    @given(JSON_VALUES)
    def check(value: Any) -> None:
        task = store.submit("job", value, queue="json")
        got = store.get(task.id)
        assert got is not None and same(value, got.payload)

    check()


@pytest.mark.parametrize("where", ["payload", "metadata", "result"])
def test_size_limits(store_url: str, where: str) -> None:
    limit = 4096
    big = {"blob": "x" * limit}
    with conveyor.connect_sync(store_url, max_payload_size=limit, max_result_size=limit) as store:
        store.submit("fits", {"blob": "x" * (limit - 20)}, queue="limits")
        before = _footprint(store)
        if where == "result":
            task = store.submit("job", queue="limits-r")
            [claimed] = store.claim("limits-r", worker_id="w")
            with pytest.raises(InvalidArgument, match=r"result: is \d+ bytes as JSON"):
                store.succeed(claimed.id, worker_id="w", result=big)
            [outcome] = store.succeed_many([{"task_id": task.id, "worker_id": "w", "result": big}])
            assert isinstance(outcome, InvalidArgument) and outcome.field == "result"
            after = store.get(task.id)
            assert after is not None and after.status is conveyor.Status.RUNNING
            return
        with pytest.raises(InvalidArgument, match=rf"{where}: is \d+ bytes as JSON") as caught:
            if where == "payload":
                store.submit("job", big, queue="limits")
            else:
                store.submit("job", queue="limits", metadata=big)
        assert "limit of 4096 bytes" in str(caught.value)
        with pytest.raises(InvalidArgument):  # the batch is refused as a whole
            store.submit_many([{"name": "ok"}, {"name": "job", where: big}])
        assert _footprint(store) == before


def test_default_limit_is_one_mebibyte(store_url: str) -> None:
    with conveyor.connect_sync(store_url) as store:
        assert store.store.max_payload_size == store.store.max_result_size == 1 << 20
        store.submit("fits", "x" * ((1 << 20) - 100), queue="mib")
        with pytest.raises(InvalidArgument, match="over the limit of 1048576 bytes"):
            store.submit("big", "x" * (1 << 20), queue="mib")
    with conveyor.connect_sync(store_url, max_payload_size=None) as store:
        store.submit("unlimited", "x" * (2 << 20), queue="mib")
