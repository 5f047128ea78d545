"""What the fault scenarios share: the worker app, child processes, and the checks.

Run as a script, this file is one of the child processes::

    python _faultkit.py worker URL LOGDIR NAME LEASE POLL CONCURRENCY
    python _faultkit.py producer URL LOGDIR DURATION RATE PARTITIONS [FIRST]
    python _faultkit.py batch URL QUEUE COUNT
    python _faultkit.py txbatch URL QUEUE COUNT
    python _faultkit.py hammer URL LOGDIR NAME DURATION
    python _faultkit.py soakworker URL LOGDIR NAME GROUP     (GROUP "-": queue mode)
    python _faultkit.py table REPORT      (the fault figures table of docs/operations.md)

* a **worker** runs :data:`app` (task ``step``) and appends one JSON line per
  handler run to ``LOGDIR/exec-NAME.jsonl``; its log (stderr) shows each
  record's ``task_id`` and ``attempt``;
* a **producer** submits for ``DURATION`` seconds, each task under its own
  idempotency key, and retries a submit that met a database error until it
  returns; every task whose submit returned is a line in ``LOGDIR/acked.jsonl``;
* a **batch** producer prints ``begin``, submits ``COUNT`` tasks in one
  ``submit_many`` and prints ``done`` (the test kills it in between);
* a **txbatch** producer submits ``COUNT`` tasks in its own transaction
  (``connection=``) beside a row of its own, prints ``submitted``, and commits
  when a line arrives on stdin (the test kills it before);
* a **hammer** submits, claims and acknowledges on one SQLite file for
  ``DURATION`` seconds, logging each write that returned to ``LOGDIR/ops-NAME.jsonl``.

Imported by the tests, it starts those children and checks what they leave behind.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

import conveyor

KIT = str(Path(__file__).resolve())
QUEUE = "faults"
BATCH = 10  # tasks per submit_many of the producer
PRODUCER = "faults-producer"  # its application_name on Postgres
# What must never appear in a worker's log, whatever the fault.
UNHANDLED = (
    "never retrieved",
    "Traceback",
    "was destroyed but it is pending",
    "Exception in callback",
    "Unhandled",
    "garbage collector",
)

app = conveyor.App(os.environ.get("CONVEYOR_URL", "sqlite:///faults.db"))


def _record(line: dict[str, Any]) -> None:
    path = os.environ["FAULTS_EXEC_LOG"]
    data = (json.dumps(line) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)  # one write of one short line: appends never interleave
    finally:
        os.close(fd)


@app.task(name="step", queue=QUEUE)
async def step(
    ctx: Any, seq: int, part: str | None, fail_first: bool = False, hold: float = 0.0
) -> int:
    """A short task that records its run; ``fail_first`` fails attempt 1; ``hold``
    seconds longer (a task a fault must catch in flight)."""
    t0 = time.time()
    await asyncio.sleep(0.01 + hold)
    ok = not (fail_first and ctx.task.attempt == 1)
    _record(
        {
            "id": ctx.task.id,
            "seq": seq,
            "part": part,
            "attempt": ctx.task.attempt,
            "ok": ok,
            "pid": os.getpid(),
            "t0": t0,
            "t1": time.time(),
        }
    )
    if not ok:
        raise RuntimeError(f"planned failure of step {seq}")
    return seq


SOAK_QUEUE = "soak"


@app.task(name="soak", queue=SOAK_QUEUE)
async def soak(ctx: Any, n: int, flaky: bool, doomed: bool) -> int:
    """The soak test's task: ``flaky`` fails its first attempt, ``doomed`` every one."""
    if doomed or (flaky and ctx.task.attempt == 1):
        raise RuntimeError(f"planned failure of soak task {n}")
    return n


# ------------------------------------------------------------------ children
class _Fields(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        for name in ("task_id", "attempt"):
            if not hasattr(record, name):
                setattr(record, name, "-")
        return True


class _OneLine(logging.Formatter):
    """One record, one line (driver messages span several), so the checks can
    find the task a line is about."""

    def format(self, record: logging.LogRecord) -> str:
        return " | ".join(super().format(record).splitlines())


def _worker(
    url: str,
    logdir: str,
    name: str,
    lease: float,
    poll: float,
    concurrency: int,
    queue: str = QUEUE,
    group: str | None = None,
    level: int = logging.INFO,
) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_Fields())
    handler.setFormatter(
        _OneLine(
            "%(asctime)s %(levelname)s %(name)s: %(message)s [task=%(task_id)s attempt=%(attempt)s]"
        )
    )
    logging.basicConfig(level=level, handlers=[handler])
    os.environ["FAULTS_EXEC_LOG"] = str(Path(logdir) / f"exec-{name}.jsonl")
    app.run_worker(
        [queue],
        group=group,
        concurrency=concurrency,
        lease=lease,
        poll_interval=poll,
        grace=5.0,
        maintain_interval=2.0,
        url=url,
        worker_id=name,
    )


def producer_options(url: str) -> dict[str, Any]:
    """Store options of a producer: on Postgres no LISTEN connection, and an
    ``application_name`` the connection-kill scenario spares."""
    if not url.startswith("postgresql"):
        return {}
    return {"listen": False, "engine_options": {"connect_args": {"application_name": PRODUCER}}}


async def _producer(
    url: str, logdir: str, duration: float, rate: float, partitions: int, first: int = 0
) -> None:
    """Submit for ``duration`` seconds, in batches of :data:`BATCH` (at most ``rate``
    tasks a second); a batch that meets a database error is submitted again under
    the same keys until it returns, so each task exists once whatever happened.

    ``first`` is the first sequence number; a producer beside the first one gives
    another (its tasks, keys and partitions are then its own, and its
    acknowledgements go to ``acked-FIRST.jsonl``). While a file ``produce.hold``
    is in ``logdir`` it goes on past ``duration`` (a scenario whose fault takes
    long to inject keeps load on until it has measured the recovery)."""
    hold = Path(logdir) / "produce.hold"
    acked = Path(logdir) / ("acked.jsonl" if first == 0 else f"acked-{first}.jsonl")
    prefix = "p" if first == 0 else f"p{first}-"
    errors: Counter[str] = Counter()
    store = conveyor.connect(url, **producer_options(url))
    while True:
        try:
            await store.open()
            break
        except conveyor.StoreUnavailable:
            await asyncio.sleep(0.2)
    print("ready", flush=True)
    seq = first
    async with store:
        with acked.open("a") as sink:
            began = time.monotonic()
            while time.monotonic() - began < duration or hold.exists():
                batch = []
                for n in range(seq, seq + BATCH):
                    part = f"{prefix}{n % partitions}" if n % (partitions + 1) else None
                    # Some unpartitioned tasks fail their first attempt: retries in the mix.
                    kwargs = {"seq": n, "part": part, "fail_first": part is None and n % 2 == 0}
                    batch.append(
                        {
                            "name": "step",
                            "payload": {"kwargs": kwargs},
                            "queue": QUEUE,
                            "partition": part,
                            "key": f"step-{n}",
                            "backoff": 0.2,
                        }
                    )
                seq += BATCH
                while True:
                    try:
                        tasks = await store.submit_many(batch)
                        break
                    except conveyor.StoreUnavailable as exc:
                        errors[type(exc).__name__] += 1
                        await asyncio.sleep(0.2)
                now = time.time()
                for request, task in zip(batch, tasks, strict=True):
                    seq_of = request["payload"]["kwargs"]["seq"]
                    sink.write(json.dumps({"seq": seq_of, "id": task.id, "t": now}) + "\n")
                sink.flush()
                pause = began + (seq - first) / rate - time.monotonic()
                if pause > 0:
                    await asyncio.sleep(pause)
    print(json.dumps({"submitted": seq - first, "errors": dict(errors)}), flush=True)


async def _batch(url: str, queue: str, count: int) -> None:
    requests = [
        {"name": "bulk", "payload": {"i": i, "pad": "x" * 200}, "queue": queue}
        for i in range(count)
    ]
    async with conveyor.connect(url, **producer_options(url)) as store:
        await store.stats(queue)  # connected and warm before the clock starts
        print("begin", flush=True)
        began = time.monotonic()
        await store.submit_many(requests)
        print(f"done {time.monotonic() - began:.3f}", flush=True)


async def _hammer(url: str, logdir: str, name: str, duration: float) -> None:
    """Submit, claim and acknowledge on one SQLite file with others doing the same;
    every write that returned is a line in ``LOGDIR/ops-NAME.jsonl`` (appended at
    once, so a kill -9 loses at most the line of a write in flight)."""
    errors: Counter[str] = Counter()
    path = str(Path(logdir) / f"ops-{name}.jsonl")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    began = time.monotonic()
    n = 0
    async with conveyor.connect(url) as store:
        print("ready", flush=True)
        while time.monotonic() - began < duration:
            try:
                tasks = await store.submit_many(
                    [
                        {"name": "h", "payload": {"by": name, "n": n + i}, "queue": "hammer"}
                        for i in range(5)
                    ]
                )
                n += 5
                os.write(
                    fd,
                    "".join(
                        json.dumps({"op": "submit", "id": t.id}) + "\n" for t in tasks
                    ).encode(),
                )
                for task in await store.claim("hammer", worker_id=name, lease=2.0, limit=5):
                    try:
                        await store.succeed(task.id, worker_id=name, attempt=task.attempt)
                    except conveyor.LostLease:
                        errors["LostLease"] += 1
                        continue
                    os.write(fd, (json.dumps({"op": "done", "id": task.id}) + "\n").encode())
                if n % 100 == 0:
                    await store.maintain()
            except conveyor.ConveyorError as exc:
                errors[f"{type(exc).__name__}: {exc}"] += 1
    os.close(fd)
    print(json.dumps({"submitted": n, "errors": dict(errors)}), flush=True)


async def _txbatch(url: str, queue: str, count: int) -> None:
    """Submit ``count`` tasks in the caller's own transaction, beside a row of the
    caller's own; print ``submitted`` and commit only when told to on stdin."""
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    from conveyor.connect import resolve_url

    requests = [{"name": "bulk", "payload": {"i": i}, "queue": queue} for i in range(count)]
    engine = create_async_engine(resolve_url(url)[1])
    async with conveyor.connect(url, **producer_options(url)) as store:
        async with engine.connect() as conn:
            await conn.execute(text("CREATE TABLE IF NOT EXISTS caller_rows (queue TEXT)"))
            await conn.commit()
            print("begin", flush=True)
            async with conn.begin():
                await conn.execute(text("INSERT INTO caller_rows VALUES (:q)"), {"q": queue})
                await store.submit_many(requests, connection=conn)
                print("submitted", flush=True)
                await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            print("committed", flush=True)
    await engine.dispose()


def figures_table(report: str) -> str:
    """The fault figures table of docs/operations.md (Markdown) from a
    ``CONVEYOR_FAULTS_REPORT`` file; the last line of each scenario wins."""
    latest: dict[str, dict[str, Any]] = {}
    for line in read_jsonl(Path(report)):
        latest[line["scenario"]] = line

    def secs(value: float | None) -> str:
        return "–" if value is None else f"{value:.2f} s"

    rows = [
        "| scenario | injected | tasks | lost | duplicates (from lost acks) "
        "| order violations | recovery | LISTEN back | wake-up after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, f in latest.items():
        if name.startswith("soak"):
            continue
        rows.append(
            f"| {name} | {f['injected']} | {f['tasks']} | {f['lost']} "
            f"| {f['duplicates']} ({f['duplicates_from_lost_acks']}) "
            f"| {f['order_violations']} | {secs(f['recovery_s'])} "
            f"| {secs(f['listener_recovery_s'])} | {secs(f['wakeup_s'])} |"
        )
    return "\n".join(rows)


def main(argv: list[str]) -> None:
    if argv[:1] == ["table"]:
        print(figures_table(argv[1]))
        return
    role, url, *rest = argv
    if role == "worker":
        logdir, name, lease, poll, concurrency = rest
        _worker(url, logdir, name, float(lease), float(poll), int(concurrency))
    elif role == "producer":
        logdir, duration, rate, partitions, *first = rest
        start = int(first[0]) if first else 0
        asyncio.run(_producer(url, logdir, float(duration), float(rate), int(partitions), start))
    elif role == "soakworker":
        logdir, name, group = rest
        # Quiet (a line per task is most of the work otherwise); a short poll, as
        # partitioned streams that wait for a retry are rechecked at each poll.
        group_name = None if group == "-" else group
        _worker(url, logdir, name, 30.0, 0.2, 20, SOAK_QUEUE, group_name, logging.WARNING)
    elif role == "hammer":
        logdir, name, duration = rest
        asyncio.run(_hammer(url, logdir, name, float(duration)))
    elif role == "txbatch":
        queue, count = rest
        asyncio.run(_txbatch(url, queue, int(count)))
    elif role == "batch":
        queue, count = rest
        asyncio.run(_batch(url, queue, int(count)))
    else:
        raise SystemExit(f"unknown role {role!r}")


# -------------------------------------------------------------------- parent
def child_env(logdir: Path) -> dict[str, str]:
    """The environment of a child: this folder importable, unbuffered output."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(KIT).parent), os.environ.get("PYTHONPATH", "")]),
        "PYTHONUNBUFFERED": "1",
        "FAULTS_EXEC_LOG": str(logdir / "exec-other.jsonl"),
    }


def spawn(
    role: str,
    url: str,
    *args: object,
    logdir: Path,
    log: str,
    wrap: Sequence[str] = (),
) -> subprocess.Popen[str]:
    """Start a child of ``role`` with stderr going to ``logdir/log`` (and stdout to a
    pipe, except for workers); ``wrap`` goes before the interpreter (``ip netns
    exec NS``, ``faketime``: the child on another host, or its clock skewed)."""
    with (logdir / log).open("w") as sink:
        return subprocess.Popen(
            [*wrap, sys.executable, KIT, role, url, *map(str, args)],
            env=child_env(logdir),
            stdout=subprocess.DEVNULL if role == "worker" else subprocess.PIPE,
            stderr=sink,
            stdin=subprocess.PIPE if role == "txbatch" else subprocess.DEVNULL,
            text=True,
        )


def stop_all(procs: Iterable[subprocess.Popen[str]], timeout: float = 30) -> list[int]:
    """SIGTERM each child, wait for it (kill -9 after ``timeout``); their exit codes."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    codes = []
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            codes.append(proc.wait(max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
        for pipe in (proc.stdout, proc.stdin):
            if pipe is not None:
                pipe.close()
    return codes


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` (a torn last line, from a kill, is skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def executions(logdir: Path) -> list[dict[str, Any]]:
    """Every handler run the workers recorded, in start order."""
    runs = [r for path in logdir.glob("exec-*.jsonl") for r in read_jsonl(path)]
    return sorted(runs, key=lambda r: r["t0"])


def unhandled_output(logdir: Path, pattern: str = "worker-*.log") -> list[str]:
    """Lines of the workers' logs that show an unhandled error."""
    bad = []
    for path in sorted(logdir.glob(pattern)):
        for line in path.read_text().splitlines():
            if any(marker in line for marker in UNHANDLED):
                bad.append(f"{path.name}: {line}")
    return bad


def lost_ack_evidence(logdir: Path) -> set[tuple[str, str]]:
    """(task id, attempt) pairs whose success a worker could not record."""
    found = set()
    for path in logdir.glob("worker-*.log"):
        for line in path.read_text().splitlines():
            if "could not record success" in line or "dropped at completion" in line:
                marker = line.rsplit("[task=", 1)
                if len(marker) == 2:
                    task_id, _, attempt = marker[1].rstrip("]").partition(" attempt=")
                    found.add((task_id, attempt))
    return found


@dataclass
class Figures:
    """What one scenario measured; printed and asserted by the tests."""

    scenario: str
    injected: str
    tasks: int = 0
    processed: int = 0
    lost: int = 0
    duplicates: int = 0
    duplicates_from_lost_acks: int = 0
    order_violations: int = 0
    recovery_s: float | None = None
    listener_recovery_s: float | None = None
    wakeup_s: float | None = None
    unhandled_log_lines: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def show(self) -> None:
        """Print the figures as one line (pytest -s shows it; CI logs keep it)."""
        line = json.dumps(asdict(self), sort_keys=True)
        print(f"\nFAULT FIGURES {line}", flush=True)
        report = os.environ.get("CONVEYOR_FAULTS_REPORT")
        if report:
            with open(report, "a") as sink:
                sink.write(line + "\n")


def check_delivery(
    figures: Figures,
    acked: list[dict[str, Any]],
    runs: list[dict[str, Any]],
    final: dict[str, str],
    logdir: Path,
) -> None:
    """Fill in lost, duplicates (and their cause), order violations and log health.

    ``final`` maps each task id in the database to its status for queue mode.
    """
    figures.tasks = len(acked)
    done = [r for r in runs if r["ok"]]
    successes = Counter(r["id"] for r in done)
    figures.processed = sum(1 for a in acked if successes[a["id"]] > 0)
    figures.lost = sum(
        1 for a in acked if successes[a["id"]] == 0 or final.get(a["id"]) != "succeeded"
    )
    evidence = lost_ack_evidence(logdir)
    dup_ids = [task_id for task_id, n in successes.items() if n > 1]
    figures.duplicates = sum(successes[i] - 1 for i in dup_ids)
    explained = 0
    for task_id in dup_ids:
        attempts = sorted(r["attempt"] for r in done if r["id"] == task_id)
        # Every run but the last succeeded in its handler and was not acknowledged.
        if all((task_id, str(a)) in evidence for a in attempts[:-1]):
            explained += len(attempts) - 1
    figures.duplicates_from_lost_acks = explained
    by_part: dict[str, list[int]] = defaultdict(list)
    for run in runs:  # sorted by start time
        if run["part"] is not None:
            by_part[run["part"]].append(run["seq"])
    figures.order_violations = sum(
        1 for seqs in by_part.values() for a, b in itertools.pairwise(seqs) if b < a
    )
    figures.unhandled_log_lines = len(unhandled_output(logdir))


def until(check: Callable[[], bool], timeout: float, what: str) -> float:
    """Wait for ``check`` (tolerating database errors); seconds it took."""
    began = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - began
        except psycopg.Error:
            pass
        assert time.monotonic() - began < timeout, f"timed out after {timeout} s: {what}"
        time.sleep(0.1)


def statuses(url: str) -> dict[str, str]:
    """Each task of :data:`QUEUE` by id: its status."""
    found: dict[str, str] = {}
    with conveyor.connect_sync(url, listen=False) as store:
        cursor = None
        while True:
            page = store.list(queue=QUEUE, limit=1000, cursor=cursor)
            found.update({t.id: t.status.value for t in page.items})
            cursor = page.next_cursor
            if cursor is None:
                return found


def drained(url: str) -> bool:
    """Whether :data:`QUEUE` has nothing queued or running."""
    with conveyor.connect_sync(url, listen=False) as store:
        stats = store.stats(QUEUE)
    counts = stats[0].counts if stats else {}
    return counts.get("queued", 0) + counts.get("running", 0) == 0


def wakeups(url: str, logdir: Path, poll: float, count: int = 5) -> float:
    """Submit probe tasks one at a time into idle workers (polling every ``poll``
    seconds); the slowest pickup (s)."""
    worst = 0.0
    with conveyor.connect_sync(url, listen=False) as store:
        for i in range(count):
            began = time.time()
            task = store.submit("step", {"kwargs": {"seq": -1 - i, "part": None}}, queue=QUEUE)
            until(
                lambda task_id=task.id: any(r["id"] == task_id for r in executions(logdir)),
                timeout=3 * poll,
                what="probe task picked up",
            )
            [run] = [r for r in executions(logdir) if r["id"] == task.id]
            worst = max(worst, run["t0"] - began)
    return worst


def first_completion_after(runs: list[dict[str, Any]], moment: float) -> float | None:
    """Seconds from ``moment`` (wall clock) to the first handler run finishing after it."""
    later = [r["t1"] for r in runs if r["t1"] > moment]
    return None if not later else min(later) - moment


if __name__ == "__main__":
    main(sys.argv[1:])
