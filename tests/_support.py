"""Helpers shared by the conformance tests, and the child processes they start.

Imported by tests as ``_support`` (pytest puts ``tests/`` on ``sys.path``), and run
as a script by multi-process tests::

    python tests/_support.py claim URL QUEUE WORKER LEASE ABANDON_EVERY
    python tests/_support.py submit_key URL KEY COUNT
    python tests/_support.py submit_keys URL SEED KEYS
    python tests/_support.py open URL

Each child opens its own store, prints ``ready``, waits for a line on stdin (so
all children start working at the same moment), does its work and prints one
JSON line with what it saw.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import conveyor
from conveyor.models import Task
from conveyor.store.base import TaskStore
from conveyor.worker import Worker

HELPER = str(Path(__file__).resolve())
#: The test server's administration URL (each test run makes its own databases there).
ADMIN_URL = os.environ.get("CONVEYOR_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
ENVELOPE_KEYS = {"type", "code", "message", "retryable", "traceback"}


def utcnow() -> datetime:
    return datetime.now(UTC)


def is_utc(moment: datetime | None) -> bool:
    """An aware datetime in UTC."""
    return moment is not None and moment.tzinfo is not None and moment.utcoffset() == timedelta(0)


def seconds(delta: timedelta) -> float:
    return delta.total_seconds()


async def assert_empty(store: TaskStore) -> None:
    """Nothing at all was written: no task in any listing, no queue in the stats."""
    page = await store.list()
    assert page.items == [] and page.next_cursor is None
    assert await store.stats() == []


def abandons(task_id: str, every: int) -> bool:
    """Deterministic choice of the tasks a child process walks away from (attempt 1)."""
    if every <= 0:
        return False
    return int(hashlib.sha256(task_id.encode()).hexdigest(), 16) % every == 0


async def mixed_acks(store: TaskStore) -> tuple[list[Task], list[dict[str, Any]]]:
    """Five claimed tasks (the third then cancelled) and six acknowledgements that
    meet every outcome in turn: ok, a stale attempt, cancelled, a result that is
    not JSON, another worker's, and a task that does not exist."""
    tasks = await store.submit_many([{"name": "t", "queue": "q"} for _ in range(5)])
    held = await store.claim("q", worker_id="w", limit=5)
    assert [t.id for t in held] == [t.id for t in tasks]
    ok, stale, cancelled, bad_result, other_worker = held
    await store.cancel(cancelled.id)
    items = [
        {"task_id": ok.id, "worker_id": "w", "result": {"n": 1}, "attempt": ok.attempt},
        {"task_id": stale.id, "worker_id": "w", "attempt": stale.attempt + 1},
        {"task_id": cancelled.id, "worker_id": "w"},
        {"task_id": bad_result.id, "worker_id": "w", "result": object()},
        {"task_id": other_worker.id, "worker_id": "intruder"},
        {"task_id": "no-such-task", "worker_id": "w"},
    ]
    return held, items


@contextmanager
def scratch_pg_database(prefix: str, options: str = "") -> Iterator[str]:
    """A new, empty database on the test server, dropped afterwards; yields its URL
    (with the driver of ``ADMIN_URL``). The name is unique, so parallel runs never
    share one. ``options``: more of ``CREATE DATABASE`` (a template, a locale)."""
    import psycopg
    from sqlalchemy.engine import make_url

    admin_dsn = make_url(ADMIN_URL).set(drivername="postgresql").render_as_string(False)
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" {options}')
    try:
        yield make_url(ADMIN_URL).set(database=name).render_as_string(False)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pg_deadlocks(url: str, settle: bool = False) -> int:
    """Deadlocks the server has broken in the database of ``url`` so far (each one
    rolled back a transaction, which the store then retried unseen). ``settle``:
    first give backends that exited time to report theirs."""
    import time

    import psycopg
    from sqlalchemy.engine import make_url

    if settle:
        time.sleep(1.5)
    dsn = make_url(url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row: Any = conn.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0])


@asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[Worker]:
    """Run ``worker`` in the background for the block; stop it and wait at the end."""
    job = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(job, 15)


@contextmanager
def pg_round_trips(store: TaskStore) -> Iterator[tuple[list[int], list[str]]]:
    """While inside: the statement count of each steps run of a Postgres store (its
    pipelined transactions), and every statement it runs through SQLAlchemy."""
    from sqlalchemy import event

    runs: list[int] = []
    seen: list[str] = []
    real = store._run_steps  # type: ignore[attr-defined]

    async def counted(steps: Any, rows_of: int = -1) -> Any:
        runs.append(len(steps))
        return await real(steps, rows_of)

    def count(*args: Any) -> None:
        seen.append(args[2])

    assert store._engine is not None
    engine = store._engine.sync_engine
    store._run_steps = counted  # type: ignore[attr-defined]
    event.listen(engine, "before_cursor_execute", count)
    try:
        yield runs, seen
    finally:
        event.remove(engine, "before_cursor_execute", count)
        store._run_steps = real  # type: ignore[attr-defined]


@contextmanager
def released(
    argvs: Sequence[Sequence[str]], timeout: float = 90.0
) -> Iterator[list[subprocess.Popen[str]]]:
    """Start one Python child per argv (each prints ``ready`` once set up, then waits
    for a line on stdin), release them all at once, and yield them; afterwards end
    any still running and close every pipe."""
    procs = [
        subprocess.Popen(
            [sys.executable, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for argv in argvs
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != "ready":
                _, err = proc.communicate(timeout=timeout)
                raise AssertionError(f"child did not start: {line!r} {err}")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            # When one child failed, the others' pipes are still open: close them
            # here, or their collection warns (an error) inside some later test.
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()


def finished(procs: Sequence[subprocess.Popen[str]], timeout: float = 90.0) -> list[str]:
    """Wait for every child to exit successfully; their standard outputs."""
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"child failed ({proc.returncode}): {err}"
        outputs.append(out)
    return outputs


def run_together(argvs: Sequence[Sequence[str]], timeout: float = 90.0) -> list[str]:
    """Start one helper child per argv, release them at once, return their last lines."""
    with released([[HELPER, *argv] for argv in argvs], timeout) as procs:
        outputs = finished(procs, timeout)
    return [lines[-1] if (lines := out.strip().splitlines()) else "" for out in outputs]


# ------------------------------------------------------------------ children
def _handshake() -> None:
    print("ready", flush=True)
    sys.stdin.readline()


async def _claim(url: str, queue: str, worker: str, lease: float, abandon_every: int) -> None:
    claims: list[dict[str, Any]] = []
    async with conveyor.connect(url) as store:
        _handshake()
        while True:
            got = await store.claim(queue, worker_id=worker, lease=lease, limit=2)
            if not got:
                stats = await store.stats(queue)
                counts = stats[0].counts if stats else {}
                if counts.get("queued", 0) + counts.get("running", 0) == 0:
                    break
                await asyncio.sleep(0.02)
                continue
            for task in got:
                assert task.lease_expires_at is not None
                record: dict[str, Any] = {
                    "id": task.id,
                    "attempt": task.attempt,
                    "worker": worker,
                    "lease_expires_at": task.lease_expires_at.isoformat(),
                    "lost": False,
                }
                claims.append(record)
                if task.attempt == 1 and abandons(task.id, abandon_every):
                    continue  # walk away: the lease must expire before anyone else runs it
                try:
                    await store.succeed(task.id, worker_id=worker, attempt=task.attempt)
                except conveyor.LostLease:
                    record["lost"] = True
    print(json.dumps(claims), flush=True)


async def _submit_key(url: str, key: str, count: int) -> None:
    async with conveyor.connect(url) as store:
        _handshake()
        tasks = await asyncio.gather(
            *(store.submit("keyed", {"n": i}, key=key) for i in range(count))
        )
    print(json.dumps([t.id for t in tasks]), flush=True)


async def _submit_keys(url: str, seed: int, keys: int) -> None:
    """Batches of keyed submits over the same ``keys`` keys, each batch in its own
    shuffled order (half of them in a partition), all at once: key -> task id."""
    import random

    rng = random.Random(seed)
    names = [f"k{i}" for i in range(keys)]
    batches = []
    for _ in range(4):
        rng.shuffle(names)
        batches.append(
            [
                {"name": "keyed", "key": key, **({"partition": "p"} if i % 2 else {})}
                for i, key in enumerate(names)
            ]
        )
    async with conveyor.connect(url) as store:
        _handshake()
        answers = await asyncio.gather(*(store.submit_many(batch) for batch in batches))
    held: dict[str, str] = {}
    for batch in answers:
        for task in batch:
            assert task.key is not None
            assert held.setdefault(task.key, task.id) == task.id, task.key
    print(json.dumps(held), flush=True)


async def _submit_mixed(url: str, seed: int, keys: int, rounds: int) -> None:
    """Submits over the same ``keys`` keys, all at once, in four kinds per key and
    round: with a partition (conflict "reuse"), with a parent ("reuse"), with a
    partition replacing the holder, and a batch of three keys from there on (two
    of them partitioned, "reuse"). Prints ``[key, task id, kind]`` for each
    answer."""
    import random

    rng = random.Random(seed)
    async with conveyor.connect(url) as store:
        root = await store.submit("root", queue="mixed")
        calls: list[tuple[list[str], str, Any]] = []
        for n in range(rounds):
            for i in rng.sample(range(keys), keys):
                key, partition = f"k{i}", f"p{i % 3}"
                kinds = ("partition", "parent", "replace", "batch", "batch replace")
                kind = kinds[(i + n + seed) % len(kinds)]
                if kind.startswith("batch"):
                    names = [f"k{(i + j) % keys}" for j in (0, 2, 1)]
                    conflict = "replace" if kind == "batch replace" else "reuse"
                    call = store.submit_many(
                        [
                            {"name": "mixed", "queue": "mixed", "key": name, "conflict": conflict}
                            | ({"partition": f"p{j}"} if j else {})
                            for j, name in enumerate(names)
                        ]
                    )
                    calls.append((names, kind, call))
                    continue
                if kind == "partition":
                    call = store.submit("mixed", queue="mixed", key=key, partition=partition)
                elif kind == "parent":
                    call = store.submit("mixed", queue="mixed", key=key, parent=root)
                else:
                    call = store.submit(
                        "mixed", queue="mixed", key=key, partition=partition, conflict="replace"
                    )
                calls.append(([key], kind, call))
        _handshake()
        answers = await asyncio.gather(*(call for _, _, call in calls))
    out = []
    for (names, kind, _), answer in zip(calls, answers, strict=True):
        tasks = answer if isinstance(answer, list) else [answer]
        out += [[name, task.id, kind] for name, task in zip(names, tasks, strict=True)]
    print(json.dumps(out), flush=True)


async def _chaos(url: str, role: str, seed: int, seconds: float) -> None:
    """One process of a mixed workload on queue "c" (group "g" subscribed first), four
    calls at a time for ``seconds``: ``produce`` (keyed and partitioned submits,
    reusing or replacing, batches, partitioned children, plain replaces),
    ``consume`` (claims in queue mode or the group, acknowledgements, some
    failures) or ``operate`` (cancels and retries of listed tasks). Prints the calls
    made and every ConveyorError met, by type."""
    import random
    import time

    rng = random.Random(seed)
    errors: dict[str, int] = {}
    calls = 0
    async with conveyor.connect(url) as store:
        root = await store.submit("root", queue="c")
        _handshake()
        end = time.monotonic() + seconds

        async def produce() -> None:
            k, p = rng.randrange(20), rng.randrange(6)
            conflict = rng.choice(["reuse", "replace"])
            roll = rng.random()
            if roll < 0.3:
                await store.submit(
                    "t", queue="c", key=f"k{k}", partition=f"p{p}", conflict=conflict
                )
            elif roll < 0.5:
                await store.submit_many(
                    [
                        {
                            "name": "t",
                            "queue": "c",
                            "key": f"k{(k + j) % 20}",
                            "partition": f"p{(p + j) % 6}",
                            "conflict": conflict,
                        }
                        for j in range(3)
                    ]
                )
            elif roll < 0.7:
                await store.submit_many(
                    [{"name": "t", "queue": "c", "partition": f"p{(p + j) % 6}"} for j in range(4)]
                )
            elif roll < 0.85:
                await store.submit("t", queue="c", partition=f"p{p}", parent=root)
            else:
                await store.submit("t", queue="c", key=f"k{k}", conflict="replace")

        async def consume() -> None:
            group = rng.choice([None, "g"])
            worker = f"w{seed}"
            got = await store.claim(
                "c",
                worker_id=worker,
                group=group,
                limit=rng.randrange(1, 10),
                per_stream=rng.randrange(1, 3),
            )
            items = [
                {"task_id": t.id, "worker_id": worker, "attempt": t.attempt, "group": group}
                for t in got
            ]
            if got and rng.random() < 0.2:
                try:
                    await store.fail(
                        got[0].id,
                        worker_id=worker,
                        error="x",
                        attempt=got[0].attempt,
                        group=group,
                    )
                except conveyor.TaskCancelled:
                    pass  # cancelled while held: the fail is refused, as it should be
                items = items[1:]
            if items:
                await store.ack_many(items)

        async def operate() -> None:
            page = await store.list(queue="c", limit=20)
            if page.items:
                task = rng.choice(page.items)
                if rng.random() < 0.5:
                    await store.cancel(task.id)
                else:
                    try:
                        await store.retry(task.id)
                    except conveyor.InvalidArgument:
                        pass  # not failed, cancelled or evicted: nothing to retry

        act = {"produce": produce, "consume": consume, "operate": operate}[role]

        async def one() -> None:
            nonlocal calls
            try:
                await act()
                calls += 1
            except conveyor.ConveyorError as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1

        while time.monotonic() < end:
            await asyncio.gather(*(one() for _ in range(4)))
    print(json.dumps({"calls": calls, "errors": errors}), flush=True)


async def _open(url: str) -> None:
    _handshake()
    store = conveyor.connect(url)
    async with store:
        pass
    print(json.dumps("ok"), flush=True)


def main(argv: list[str]) -> None:
    mode, url, *rest = argv
    if mode == "claim":
        queue, worker, lease, every = rest
        asyncio.run(_claim(url, queue, worker, float(lease), int(every)))
    elif mode == "submit_key":
        key, count = rest
        asyncio.run(_submit_key(url, key, int(count)))
    elif mode == "submit_keys":
        seed, keys = rest
        asyncio.run(_submit_keys(url, int(seed), int(keys)))
    elif mode == "submit_mixed":
        seed, keys, rounds = rest
        asyncio.run(_submit_mixed(url, int(seed), int(keys), int(rounds)))
    elif mode == "chaos":
        role, seed, seconds = rest
        asyncio.run(_chaos(url, role, int(seed), float(seconds)))
    elif mode == "open":
        asyncio.run(_open(url))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])


async def plan(store: TaskStore, stmt: Any) -> str:
    """The plan the database chooses for ``stmt`` with its parameters bound (SQLite's
    ``EXPLAIN QUERY PLAN`` details, Postgres's ``EXPLAIN`` lines)."""
    from sqlalchemy.ext.asyncio import AsyncConnection

    async def work(conn: AsyncConnection) -> str:
        compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
        if conn.dialect.name == "sqlite":
            params: Any = tuple(compiled.params[name] for name in compiled.positiontup or [])
            rows = await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}", params)
            return "\n".join(str(row[-1]) for row in rows)
        rows = await conn.exec_driver_sql(f"EXPLAIN {compiled}", compiled.params)
        return "\n".join(str(row[0]) for row in rows)

    return await store._run(work)


def sqlite_statements(store: TaskStore) -> list[str]:
    """Every statement a SQLite store runs through SQLAlchemy from now on, on its
    connection thread's engine (the built texts run on the driver's cursor, by
    :meth:`~conveyor.store.protocol.transactions.InlineConnection.run_text`, unseen here)."""
    from sqlalchemy import event

    seen: list[str] = []
    thread: Any = store._connection_runner()
    assert thread is not None

    def _seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(thread._engine, "before_cursor_execute", _seen)
    return seen


def pg_texts() -> dict[str, str]:
    """The Postgres dialect's statements by name, in psycopg's parameter style."""
    from conveyor.store.protocol import texts

    return {
        name: texts.to_pyformat(sql) for name, sql in texts.load("conveyor.store.postgres").items()
    }


class IdleWaits(list[bool]):
    """How each ``wait_for_work`` on a store ended, in order (see :func:`idle_waits`);
    ``idle`` is set once one has begun (the worker went idle)."""

    def __init__(self) -> None:
        super().__init__()
        self.idle = asyncio.Event()


@contextmanager
def idle_waits(store: TaskStore) -> Iterator[IdleWaits]:
    """While inside: how each ``wait_for_work`` on ``store`` ended (a worker's idle
    sleep), in order: True when a notification woke it, False when it ran out its
    timeout, i.e. the worker polled. A wait cancelled by something else the worker
    waited for (a stream let go, stop) ends neither way and is not listed. A test
    that says "woken, not polled" asserts ``False not in waits``: an ordering of
    events, not a wall-clock bound."""
    ended = IdleWaits()
    real = store.wait_for_work

    async def watched(queues: Sequence[str], timeout: float) -> bool:
        ended.idle.set()
        woke = await real(queues, timeout)
        ended.append(woke)
        return woke

    store.wait_for_work = watched  # type: ignore[method-assign]
    try:
        yield ended
    finally:
        del store.wait_for_work  # the class's method again


@contextmanager
def naps() -> Iterator[list[tuple[Any, bool]]]:
    """While inside: each nap of a ``wait()`` or ``wait_for_work`` in this process
    (an in-process watch waiting for its wake-up), as ``(watch, woken)`` in the
    order they ended: ``woken`` True when a notification ended it, False when it
    ran out. "Woken by the announcement, not by polling" is then an assertion on
    how the nap in progress ended, not on how long anything took."""
    from conveyor.store.protocol import wake

    ended: list[tuple[Any, bool]] = []
    real = wake.Watch.wait

    async def watched(self: wake.Watch, timeout: float) -> bool:
        woken = await real(self, timeout)
        ended.append((self, woken))
        return woken

    wake.Watch.wait = watched  # type: ignore[method-assign]
    try:
        yield ended
    finally:
        wake.Watch.wait = real  # type: ignore[method-assign]
