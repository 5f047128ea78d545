"""A seek in the middle of live traffic, across processes: two producer processes
submit partitioned and unpartitioned tasks, a claimer process claims and
acknowledges them for the group, and this process seeks the group back to a
point while they run (in batches of a few rows, so claims and submits fall
between its transactions).

Afterwards: nothing is lost; every task from the point on was delivered at or
after the seek (or was in flight across it and left running); nothing was
delivered twice except the replayed tasks, once more each; and each partition's
deliveries after the seek go in submit order."""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import conveyor
from _support import released
from conveyor import Status
from conveyor.store.protocol import seek

Q = "feed"
GROUP = "replayer"
PER_PRODUCER = 120
SCRIPT = str(Path(__file__).with_name("_seek_procs.py"))
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def us(moment: datetime) -> int:
    return (moment - EPOCH) // timedelta(microseconds=1)


def deliveries(log: Path) -> list[dict[str, object]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.endswith("}")]


async def test_a_seek_amid_producers_and_a_claimer_process(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seek, "BATCH", 8)  # many transactions, claims between them
    log, stop = tmp_path / "claims.jsonl", tmp_path / "stop"
    async with conveyor.connect(store_url) as store:
        await store.subscribe(Q, GROUP, start="all")
        argvs = [
            [SCRIPT, "producer", store_url, Q, "a", str(PER_PRODUCER)],
            [SCRIPT, "producer", store_url, Q, "b", str(PER_PRODUCER)],
            [SCRIPT, "claimer", store_url, Q, GROUP, str(log), str(stop)],
        ]
        with released(argvs, timeout=100) as procs:
            # Let a history build up: some tasks delivered, producers still going.
            for _ in range(3000):
                if len(deliveries(log)) >= 80:
                    break
                await asyncio.sleep(0.01)
            page = await store.list(queue=Q, limit=500, order="oldest")
            # Near the claimer's progress: finished tasks after the point to
            # replay, queued ones before it to skip.
            point = page.items[len(deliveries(log)) - 40].created_at
            t0 = us(datetime.now(UTC))
            got = await store.seek(Q, GROUP, to=point)
            t1 = us(datetime.now(UTC))
            producing = [p for p in procs if "producer" in p.args]
            for proc in producing:
                assert await asyncio.to_thread(proc.wait, 100) == 0
            for _ in range(6000):
                [report] = await store.stats(Q)
                counts = report.groups[GROUP].counts
                if counts["queued"] == 0 and counts["running"] == 0:
                    break
                await asyncio.sleep(0.02)
            stop.touch()
            claimer = procs[-1]
            assert await asyncio.to_thread(claimer.wait, 100) == 0, claimer.stderr
        everything = []
        cursor = None
        while True:
            page = await store.list(queue=Q, limit=500, order="oldest", cursor=cursor)
            everything += page.items
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        finals = {t.id: await store.get(t.id, group=GROUP) for t in everything}
        [report] = await store.stats(Q)

    assert len(everything) == 2 * PER_PRODUCER
    assert got.requeued > seek.BATCH  # the replay took several transactions
    assert got.skipped > 0  # p2's late backlog before the point
    order = {t.id: n for n, t in enumerate(everything)}
    created = {t.id: us(t.created_at) for t in everything}
    cut = us(point)
    seen = deliveries(log)
    times: Counter[str] = Counter(str(d["id"]) for d in seen)
    assert set(times) <= set(order)

    in_flight = 0
    for task in everything:
        final = finals[task.id]
        assert final is not None
        mine = [d for d in seen if d["id"] == task.id]
        if created[task.id] < cut:
            # Before the point: delivered once before the seek reached it, or skipped.
            assert times[task.id] <= 1, task.id
            expected = Status.SUCCEEDED if times[task.id] else Status.SKIPPED
            assert final.status is expected, task.id
            continue
        # From the point on: nothing lost, at most once more than before.
        assert final.status is Status.SUCCEEDED, task.id
        assert 1 <= times[task.id] <= 2, task.id
        if not any(int(d["claimed_at"]) >= t0 for d in mine):  # type: ignore[call-overload]
            # Not delivered since the seek began: it was held across it.
            [only] = mine
            assert int(only["claimed_at"]) < t0 <= int(only["finished_at"]), task.id  # type: ignore[call-overload]
            in_flight += 1
    assert in_flight <= got.left_running

    # Each partition after the seek: in submit order, from its first replayed
    # delivery on (deliveries in the seek's midst before it reached a partition
    # aside), and after the seek returned in any case.
    by_part: dict[object, list[dict[str, object]]] = defaultdict(list)
    for d in seen:
        if d["partition"] is not None:
            by_part[d["partition"]].append(d)
    replayed_parts = 0
    for part, mine in by_part.items():
        first = next((n for n, d in enumerate(mine) if int(d["attempt"]) >= 2), None)  # type: ignore[call-overload]
        late = [n for n, d in enumerate(mine) if int(d["claimed_at"]) >= t1]  # type: ignore[call-overload]
        starts = [n for n in (first, late[0] if late else None) if n is not None]
        start = min(starts, default=len(mine))
        replayed_parts += first is not None
        tail = [order[str(d["id"])] for d in mine[start:]]
        assert tail == sorted(tail) and len(set(tail)) == len(tail), (part, tail)
    assert replayed_parts >= 2, "partitions replayed"

    # The counts add up: every task once in the group's view, queue mode untouched.
    counts = {k: n for k, n in report.groups[GROUP].counts.items() if n}
    assert sum(counts.values()) == len(everything)
    assert set(counts) <= {"succeeded", "skipped"}
    assert counts.get("skipped", 0) == got.skipped
    assert report.counts["queued"] == len(everything)
