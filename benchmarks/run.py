"""Run the benchmark suite and print the tables with the same-run ratios.

    python -m benchmarks                 # everything, N = 5,000, 3 repetitions
    python -m benchmarks --quick         # N = 1,000 (200 enqueued one call each), 1 repetition
                                         # (CI: keeps every workload working)
    python -m benchmarks --only sqlite   # sections or workloads whose name contains a word

See benchmarks/README.md for what each workload does and how it is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import inspect
import json
import os
import platform
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any

from benchmarks import conveyor_side as cv
from benchmarks import flow
from benchmarks import pg_peers as pgp
from benchmarks import sqlite_peers as slp
from benchmarks.harness import (
    BenchError,
    Databases,
    Outcome,
    check_exactly_once,
    combine,
    median,
    percentile,
    pg_dsn,
    run_consumers,
)

CONCURRENCY = 10
GAP = 0.020  # seconds between tasks in the latency workloads
WARMUP = 5  # latency samples dropped at the start (connections, caches)


@dataclasses.dataclass(frozen=True)
class System:
    """One column of a table: a queue implementation on one backend."""

    label: str
    backend: str  # "pg" or "sqlite"
    template: tuple[str, Callable[[str], None]] | None = None  # Postgres schema set-up
    enqueue_single: Callable[..., Any] | None = None
    enqueue_batch: Callable[..., Any] | None = None
    prefill: Callable[..., Any] | None = None
    worker: str | None = None  # consumer "module:function" for worker processing
    claim_loop: str | None = None  # consumer for store-level claim(k) + ack
    latency_worker: str | None = None
    latency_spec: tuple[tuple[str, Any], ...] = ()
    produce_latency: Callable[..., Any] | None = None
    table: str | None = None  # where its enqueued tasks are counted


RAW_PG = System(
    "raw psycopg",
    "pg",
    ("raw", pgp.raw_setup),
    pgp.raw_enqueue_single,
    pgp.raw_enqueue_batch,
    pgp.raw_prefill,
    claim_loop="benchmarks.pg_peers:raw_consume",
    latency_worker="benchmarks.pg_peers:raw_latency_consume",
    produce_latency=pgp.raw_produce_latency,
    table="raw_jobs",
)
PGQUEUER = System(
    "pgqueuer",
    "pg",
    ("pgqueuer", pgp.pgq_setup),
    pgp.pgq_enqueue_single,
    pgp.pgq_enqueue_batch,
    pgp.pgq_prefill,
    worker="benchmarks.pg_peers:pgq_consume",
    latency_worker="benchmarks.pg_peers:pgq_consume",
    produce_latency=pgp.pgq_produce_latency,
    table="pgqueuer",
)
PROCRASTINATE = System(
    "procrastinate",
    "pg",
    ("procrastinate", pgp.proc_setup),
    pgp.proc_enqueue_single,
    pgp.proc_enqueue_batch,
    pgp.proc_prefill,
    worker="benchmarks.pg_peers:proc_consume",
    latency_worker="benchmarks.pg_peers:proc_consume",
    produce_latency=pgp.proc_produce_latency,
    table="procrastinate_jobs",
)
CONVEYOR_STORE_PG = System(
    "conveyor store",
    "pg",
    ("conveyor", cv.setup),
    cv.store_enqueue_single,
    cv.store_enqueue_batch,
    cv.prefill,
    claim_loop="benchmarks.conveyor_side:store_consume",
    table="conveyor_tasks",
)
CONVEYOR_APP_PG = System(
    "conveyor App+Worker",
    "pg",
    ("conveyor", cv.setup),
    cv.app_enqueue_single,
    cv.app_enqueue_batch,
    cv.prefill,
    worker="benchmarks.conveyor_side:worker_consume",
    latency_worker="benchmarks.conveyor_side:worker_consume",
    produce_latency=cv.app_produce_latency,
    table="conveyor_tasks",
)
RAW_SQLITE = System(
    "raw sqlite3",
    "sqlite",
    None,
    slp.raw_enqueue_single,
    slp.raw_enqueue_batch,
    slp.raw_prefill,
    worker="benchmarks.sqlite_peers:raw_consume",
    latency_worker="benchmarks.sqlite_peers:raw_consume",
    latency_spec=(("poll", 0.01),),
    produce_latency=slp.raw_produce_latency,
    table="raw_jobs",
)
HUEY = System(
    "huey SqliteHuey",
    "sqlite",
    None,
    slp.huey_enqueue_single,
    None,
    slp.huey_prefill,
    worker="benchmarks.sqlite_peers:huey_consume",
    latency_worker="benchmarks.sqlite_peers:huey_consume",
    produce_latency=slp.huey_produce_latency,
    table="task",
)
CONVEYOR_STORE_SQLITE = dataclasses.replace(CONVEYOR_STORE_PG, backend="sqlite", template=None)
# The worker keeps its default poll interval: another process's submit wakes it
# through the store's wake channel (PRAGMA data_version on SQLite), not by polling.
CONVEYOR_APP_SQLITE = dataclasses.replace(CONVEYOR_APP_PG, backend="sqlite", template=None)

PG_SYSTEMS = [RAW_PG, PGQUEUER, PROCRASTINATE, CONVEYOR_STORE_PG, CONVEYOR_APP_PG]
SQLITE_SYSTEMS = [RAW_SQLITE, HUEY, CONVEYOR_STORE_SQLITE, CONVEYOR_APP_SQLITE]


@dataclasses.dataclass
class Config:
    n: int
    n_single: int  # tasks of the one-call-each enqueue workload
    reps: int
    history: int
    latency_samples: int
    dbs: Databases
    timeout: float
    #: Measure a case that two tables show (the store's claim(1) + ack is also the
    #: claim-history table's "empty" column) once, and show it twice. Only in a
    #: one-repetition quick run, where no median is taken.
    reuse: bool = False
    measured: dict[tuple[Any, ...], Outcome] = dataclasses.field(default_factory=dict)


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if inspect.iscoroutinefunction(fn):
        return asyncio.run(fn(*args, **kwargs))
    return fn(*args, **kwargs)


@contextlib.contextmanager
def fresh(system: System, cfg: Config) -> Iterator[str]:
    """An empty database with the system's schema: a Postgres URL or a SQLite path."""
    if system.backend == "pg":
        assert system.template is not None
        kind, setup = system.template
        with cfg.dbs.postgres(cfg.dbs.template(kind, setup)) as url:
            yield url
    else:
        with cfg.dbs.sqlite() as path:
            yield path


def count_rows(db: str, table: str) -> int:
    if db.startswith("postgresql"):
        import psycopg

        with psycopg.connect(pg_dsn(db)) as conn:
            row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
            return int(row[0]) if row else 0
    with contextlib.closing(sqlite3.connect(db)) as lite:
        return int(lite.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


# ---------------------------------------------------------------- the cases
Case = tuple[str, Callable[[Config], Outcome]]  # (system label, run one repetition)


def enqueue_case(system: System, batch: bool) -> Case:
    fn = system.enqueue_batch if batch else system.enqueue_single
    assert fn is not None

    def run(cfg: Config) -> Outcome:
        n = cfg.n if batch else cfg.n_single
        with fresh(system, cfg) as db:
            out: Outcome = call(fn, db, n)
            assert system.table is not None
            got = count_rows(db, system.table)
            if got != n:
                raise BenchError(f"{system.label}: enqueued {n}, the database holds {got}")
            return out

    return system.label, run


def process_case(
    system: System, procs: int, k: int | None = None, label: str | None = None, **prefill: Any
) -> Case:
    target = system.claim_loop if k is not None else system.worker
    assert target is not None and system.prefill is not None
    name = label or (system.label if k is None else f"{system.label}")

    key = (system, procs, k, tuple(sorted(prefill.items())))

    def run(cfg: Config) -> Outcome:
        if cfg.reuse and key in cfg.measured:
            return cfg.measured[key]
        with fresh(system, cfg) as db:
            call(system.prefill, db, cfg.n, **prefill)
            specs = [
                {"db": db, "concurrency": CONCURRENCY, "k": k, "index": i} for i in range(procs)
            ]
            what = f"{name} ({procs} process{'es' if procs > 1 else ''}, k={k})"
            reports = run_consumers(target, specs, total=cfg.n, timeout=cfg.timeout, what=what)
            out = combine(reports, cfg.n, what)
        if cfg.reuse:
            cfg.measured[key] = out
        return out

    return name, run


def latency_case(system: System) -> Case:
    assert system.latency_worker and system.produce_latency

    def run(cfg: Config) -> Outcome:
        m = cfg.latency_samples + WARMUP
        with fresh(system, cfg) as db:
            spec = {"db": db, "concurrency": 1, "k": 1, "index": 0, **dict(system.latency_spec)}

            def produce() -> None:
                time.sleep(1.0)  # let the idle worker settle into waiting
                assert system.produce_latency is not None
                call(system.produce_latency, db, m, GAP)

            reports = run_consumers(
                system.latency_worker,
                [spec],
                total=m,
                timeout=m * GAP + 120,
                produce=produce,
                what=f"{system.label} latency",
            )
            out = combine(reports, m, f"{system.label} latency")
            # Drop the warm-up samples (by task number, not arrival order).
            lat = reports[0]["latencies"]
            ids = reports[0]["ids"]
            out.latencies = [x for i, x in zip(ids, lat, strict=True) if i >= WARMUP]
            return out

    return system.label, run


def history_case(system: System, with_history: bool) -> Case:
    """Store-level claim(1) + ack at concurrency 10, empty store vs a finished history."""
    target = system.claim_loop
    assert target is not None
    label = "with finished history" if with_history else "empty"

    def run(cfg: Config) -> Outcome:
        if not with_history:
            return process_case(system, 1, k=1)[1](cfg)
        with history_db(system, cfg) as db:
            call(cv.prefill, db, cfg.n)
            specs = [{"db": db, "concurrency": CONCURRENCY, "k": 1, "index": 0}]
            what = f"{system.label} with history"
            reports = run_consumers(target, specs, total=cfg.n, timeout=cfg.timeout, what=what)
            return combine(reports, cfg.n, what)

    return label, run


@contextlib.contextmanager
def history_db(system: System, cfg: Config) -> Iterator[str]:
    if system.backend == "pg":

        def setup(url: str) -> None:
            cv.setup(url)
            cv.seed_history(url, cfg.history)

        with cfg.dbs.postgres(cfg.dbs.template("history", setup), big=True) as url:
            yield url
    else:
        path = cfg.dbs.sqlite_path("history.sqlite")
        if not os.path.exists(path):
            cv.setup(path)
            cv.seed_history(path, cfg.history)
        with cfg.dbs.sqlite(copy_of=path) as copy:
            yield copy


def bus_case(system: System, groups: int) -> Case:
    """App+Worker at concurrency 10: queue mode (1 process) or ``groups`` consumer
    groups (one worker process each, running together); tasks/s per group."""
    assert system.worker is not None and system.prefill is not None
    label = "queue mode" if groups == 0 else f"bus mode, {groups} groups (per group)"

    def run(cfg: Config) -> Outcome:
        with fresh(system, cfg) as db:
            call(system.prefill, db, cfg.n, groups=groups)
            if groups == 0:
                specs = [{"db": db, "concurrency": CONCURRENCY, "index": 0}]
            else:
                specs = [
                    {"db": db, "concurrency": CONCURRENCY, "index": g, "group": f"g{g}"}
                    for g in range(groups)
                ]
            what = f"{system.label} {label}"
            assert system.worker is not None
            reports = run_consumers(
                system.worker, specs, total=cfg.n * len(specs), timeout=cfg.timeout, what=what
            )
            # Per group: its N tasks over the time from the first start in any group to
            # its own last task, so a group that had to wait for the others pays for it.
            start = min(r["t0"] for r in reports)
            rates = []
            for r in reports:
                check_exactly_once(r["ids"], cfg.n, f"{what}, group {r['index']}")
                rates.append(cfg.n / (r["t1"] - start))
            cpu = sum(float(r["cpu"]) for r in reports) / len(reports)
            out = Outcome(n=cfg.n, seconds=cfg.n / median(rates), cpu=cpu, per_group=rates)
            return out

    return label, run


def partition_case(system: System, partitions: int | None) -> Case:
    label = "unpartitioned" if partitions is None else f"{partitions} partitions"
    return process_case(system, 1, label=label, partitions=partitions)


# ----------------------------------------------------------------- workloads
@dataclasses.dataclass
class Workload:
    section: str  # "PostgreSQL", "SQLite"
    name: str  # the row
    cases: list[Case]
    kind: str = "rate"  # "rate" or "latency"
    base: str | None = None  # the column the others are shown as a ratio of
    results: dict[str, list[Outcome]] = dataclasses.field(default_factory=dict)
    error: str | None = None


def workloads(pg: bool, sqlite: bool, quick: bool = False) -> list[Workload]:
    out: list[Workload] = []
    if pg:
        s = "PostgreSQL"
        systems = PG_SYSTEMS
        out += [
            Workload(s, "enqueue, one call each", [enqueue_case(x, False) for x in systems]),
            Workload(s, "enqueue, batches of 1,000", [enqueue_case(x, True) for x in systems]),
        ]
        for procs in (1, 2):
            where = f"{procs} process{'es' if procs > 1 else ''}"
            out.append(
                Workload(
                    s,
                    f"process, concurrency 10, {where}: worker",
                    [process_case(x, procs) for x in systems if x.worker],
                )
            )
            for k in (1, 10, 100):
                if quick and (k == 10 or (k == 1 and procs == 2)):
                    continue  # --quick: the same code paths as the rows it keeps
                out.append(
                    Workload(
                        s,
                        f"process, concurrency 10, {where}: claim({k}) + ack",
                        [process_case(x, procs, k=k) for x in systems if x.claim_loop],
                    )
                )
        out.append(
            Workload(
                s,
                "latency enqueue → start, concurrency 1, 20 ms apart",
                [latency_case(x) for x in systems if x.latency_worker],
                kind="latency",
            )
        )
        out += both_backend_workloads(s, CONVEYOR_STORE_PG, CONVEYOR_APP_PG)
        out += flow_workloads(s, "pg", quick)
    if sqlite:
        s = "SQLite"
        systems = SQLITE_SYSTEMS
        out += [
            Workload(s, "enqueue, one call each", [enqueue_case(x, False) for x in systems]),
            Workload(
                s,
                "enqueue, batches of 1,000",
                [enqueue_case(x, True) for x in systems if x.enqueue_batch],
            ),
            Workload(
                s,
                "process, concurrency 10, 1 process: worker",
                [process_case(x, 1) for x in systems if x.worker],
            ),
        ]
        for k in (1, 10, 100):
            if quick and k == 10:
                continue
            out.append(
                Workload(
                    s,
                    f"process, concurrency 10, 1 process: claim({k}) + ack",
                    [process_case(x, 1, k=k) for x in systems if x.claim_loop],
                )
            )
        out.append(
            Workload(
                s,
                "latency enqueue → start, concurrency 1, 20 ms apart",
                [latency_case(x) for x in systems if x.latency_worker],
                kind="latency",
            )
        )
        out += both_backend_workloads(s, CONVEYOR_STORE_SQLITE, CONVEYOR_APP_SQLITE)
        out += flow_workloads(s, "sqlite", quick)
    return out


def flow_workloads(section: str, backend: str, quick: bool) -> list[Workload]:
    """Flow control's rows (benchmarks/flow.py)."""
    return [
        Workload(section, name, cases, base=base)
        for name, cases, base in flow.workloads(backend, quick)
    ]


def both_backend_workloads(section: str, store: System, app: System) -> list[Workload]:
    return [
        Workload(
            section,
            "claim history: store claim(1) + ack, concurrency 10",
            [history_case(store, False), history_case(store, True)],
        ),
        Workload(
            section,
            "bus vs queue mode: App+Worker, concurrency 10",
            [bus_case(app, 0), bus_case(app, 3)],
        ),
        Workload(
            section,
            "partitions: App+Worker, concurrency 10",
            [partition_case(app, None), partition_case(app, 100)],
        ),
    ]


# ------------------------------------------------------------------ running
def run_all(selected: list[Workload], cfg: Config) -> bool:
    """Run every workload (a failed one is reported and skipped); True if none failed."""
    ok = True
    for wl in selected:
        for rep in range(cfg.reps):
            if wl.error:
                break
            # Interleave: every system once per repetition, starting one further each time.
            shift = rep % len(wl.cases)
            for label, run in wl.cases[shift:] + wl.cases[:shift]:
                started = time.perf_counter()
                try:
                    out = run(cfg)
                except BenchError as exc:
                    wl.error = f"{label}: {exc}"
                    ok = False
                    print(f"FAILED {wl.section} / {wl.name} / {label}: {exc}", flush=True)
                    break
                wl.results.setdefault(label, []).append(out)
                took = time.perf_counter() - started
                print(
                    f"  [{wl.section}] {wl.name} | {label} | rep {rep + 1}: "
                    f"{describe(out, wl.kind)} ({took:.1f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    return ok


def describe(out: Outcome, kind: str) -> str:
    if kind == "latency":
        p50 = percentile(out.latencies, 50) * 1000
        p99 = percentile(out.latencies, 99) * 1000
        return f"{p50:.1f} / {p99:.1f} ms"
    return f"{out.rate:,.0f}/s, {out.cpu_us:,.0f} µs CPU/task"


@dataclasses.dataclass
class Cell:
    rate: float | None = None
    cpu_us: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    per_group: list[float] | None = None
    extra: dict[str, float] = dataclasses.field(default_factory=dict)
    of_base: float | None = None  # rate ÷ the row's base column (same run)

    def text(self) -> str:
        if self.p50_ms is not None and self.p99_ms is not None:
            return f"{self.p50_ms:.1f} / {self.p99_ms:.1f} ms ({self.cpu_us:,.0f} µs)"
        if self.rate is None:
            return "—"
        shown = f"{self.rate:,.0f} ({self.cpu_us:,.0f} µs)"
        if self.of_base is not None:
            shown += f" ×{self.of_base:.2f}"
        for name, value in self.extra.items():
            counted = name.startswith("max") or name == "samples"
            shown += f"; {name} {value:,.0f}" if counted else f"; {name} {value:.3f}"
        return shown


def summarise(wl: Workload) -> dict[str, Cell]:
    cells: dict[str, Cell] = {}
    for label, outs in wl.results.items():
        if wl.kind == "latency":
            cells[label] = Cell(
                cpu_us=median([o.cpu_us for o in outs]),
                p50_ms=median([percentile(o.latencies, 50) for o in outs]) * 1000,
                p99_ms=median([percentile(o.latencies, 99) for o in outs]) * 1000,
            )
        else:
            groups = [o.per_group for o in outs if o.per_group]
            names = list(dict.fromkeys(name for o in outs for name in o.extra))
            cells[label] = Cell(
                rate=median([o.rate for o in outs]),
                cpu_us=median([o.cpu_us for o in outs]),
                per_group=[median(list(g)) for g in zip(*groups, strict=True)] if groups else None,
                # The most seen of a count (running per key), the median of a ratio.
                extra={
                    name: (max if name.startswith("max") else median)(
                        [o.extra[name] for o in outs if name in o.extra]
                    )
                    for name in names
                },
            )
    base = cells.get(wl.base) if wl.base else None
    if base is not None and base.rate:
        # Ratios within each repetition (the columns ran one after another), then
        # their median: steadier on a noisy machine than a ratio of medians.
        for label, outs in wl.results.items():
            pairs = zip(outs, wl.results[wl.base or ""], strict=False)
            cells[label].of_base = median([o.rate / b.rate for o, b in pairs])
    return cells


# ------------------------------------------------------------------ targets
@dataclasses.dataclass
class Target:
    text: str
    measured: str
    ratio: float | None
    goal: float | None
    upper: bool = False  # the goal is a ceiling (latency in ms), not a floor

    @property
    def gap(self) -> str:
        """How far from the goal: the factor still missing, or "" when met."""
        if self.met is not False or self.ratio is None or self.goal is None:
            return ""
        if self.upper:
            return f"{self.ratio / self.goal:.1f}× over"
        return f"needs {self.goal / self.ratio:.1f}×" if self.ratio > 0 else "needs ∞"

    @property
    def met(self) -> bool | None:
        if self.ratio is None or self.goal is None:
            return None
        return self.ratio <= self.goal if self.upper else self.ratio >= self.goal


def targets(all_cells: dict[tuple[str, str], dict[str, Cell]]) -> list[Target]:
    out: list[Target] = []

    def rate(section: str, row: str, col: str) -> float | None:
        cell = all_cells.get((section, row), {}).get(col)
        return None if cell is None else cell.rate

    def ratio(text: str, a: tuple[str, str, str], b: tuple[str, str, str], goal: float) -> None:
        x, y = rate(*a), rate(*b)
        if x is None or y is None:
            return
        out.append(Target(text, f"{x:,.0f} / {y:,.0f}", x / y, goal))

    def ceiling(text: str, section: str, row: str, col: str, field: str, goal: float) -> None:
        cell = all_cells.get((section, row), {}).get(col)
        value = None if cell is None else getattr(cell, field)
        if value is not None:
            out.append(Target(text, f"{value:.1f} ms", value, goal, upper=True))

    pg, lite = "PostgreSQL", "SQLite"
    app, store = "conveyor App+Worker", "conveyor store"
    for procs in ("1 process", "2 processes"):
        row = f"process, concurrency 10, {procs}: worker"
        ratio(
            f"PG worker, {procs}: App+Worker ≥ 2× pgqueuer",
            (pg, row, app),
            (pg, row, "pgqueuer"),
            2.0,
        )
        for k in (1, 10, 100):
            row_k = f"process, concurrency 10, {procs}: claim({k}) + ack"
            ratio(
                f"PG store claim({k}) + ack, {procs}: ≥ 50 % of raw",
                (pg, row_k, store),
                (pg, row_k, "raw psycopg"),
                0.5,
            )
    for col in (store, app):
        one, batch = "enqueue, one call each", "enqueue, batches of 1,000"
        ratio(
            f"PG enqueue one ({col}) ≥ 80 % of raw INSERT",
            (pg, one, col),
            (pg, one, "raw psycopg"),
            0.8,
        )
        ratio(f"PG enqueue one ({col}) ≥ pgqueuer", (pg, one, col), (pg, one, "pgqueuer"), 1.0)
        ratio(
            f"PG enqueue batch ({col}) ≥ 70 % of raw",
            (pg, batch, col),
            (pg, batch, "raw psycopg"),
            0.7,
        )
        ratio(
            f"PG enqueue batch ({col}) ≥ pgqueuer", (pg, batch, col), (pg, batch, "pgqueuer"), 1.0
        )
        ratio(
            f"SQLite enqueue one ({col}) ≥ 50 % of raw",
            (lite, one, col),
            (lite, one, "raw sqlite3"),
            0.5,
        )
        ratio(
            f"SQLite enqueue batch ({col}) ≥ 50 % of raw",
            (lite, batch, col),
            (lite, batch, "raw sqlite3"),
            0.5,
        )
    lat = "latency enqueue → start, concurrency 1, 20 ms apart"
    ceiling("PG latency p50 ≤ 3 ms (App+Worker)", pg, lat, app, "p50_ms", 3.0)
    ceiling("PG latency p99 ≤ 10 ms (App+Worker)", pg, lat, app, "p99_ms", 10.0)
    ceiling("SQLite latency p50 ≤ 5 ms (App+Worker)", lite, lat, app, "p50_ms", 5.0)
    row = "process, concurrency 10, 1 process: worker"
    ratio("SQLite worker ≥ 50 % of raw sqlite3", (lite, row, app), (lite, row, "raw sqlite3"), 0.5)
    ratio("SQLite worker ≥ 1.5× huey", (lite, row, app), (lite, row, "huey SqliteHuey"), 1.5)
    for section in (pg, lite):
        hist = "claim history: store claim(1) + ack, concurrency 10"
        ratio(
            f"{section}: claim with the finished history ≥ 80 % of empty",
            (section, hist, "with finished history"),
            (section, hist, "empty"),
            0.8,
        )
        bus = "bus vs queue mode: App+Worker, concurrency 10"
        ratio(
            f"{section}: bus mode per group ≥ 60 % of queue mode",
            (section, bus, "bus mode, 3 groups (per group)"),
            (section, bus, "queue mode"),
            0.6,
        )
        parts = "partitions: App+Worker, concurrency 10"
        ratio(
            f"{section}: 100 partitions ≥ 50 % of unpartitioned",
            (section, parts, "100 partitions"),
            (section, parts, "unpartitioned"),
            0.5,
        )
    return out


# ---------------------------------------------------------------- reporting
def environment(pg_url: str | None) -> dict[str, Any]:
    env: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "sqlite": sqlite3.sqlite_version,
    }
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            models = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        env["cpu"] = models[0] if models else "?"
    with contextlib.suppress(OSError):
        with open("/proc/meminfo") as f:
            env["memory"] = f.readline().split(":", 1)[1].strip()
    for dist in (
        "conveyor",
        "sqlalchemy",
        "psycopg",
        "aiosqlite",
        "asyncpg",
        "pgqueuer",
        "procrastinate",
        "huey",
    ):
        with contextlib.suppress(metadata.PackageNotFoundError):
            env[dist] = metadata.version(dist)
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        here = os.path.dirname(os.path.abspath(__file__))
        env["commit"] = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    if pg_url:
        import psycopg

        with psycopg.connect(pg_dsn(pg_url)) as conn:
            for name in ("server_version", "fsync", "synchronous_commit", "shared_buffers"):
                row = conn.execute(f"SHOW {name}").fetchone()
                env[f"postgres {name}"] = row[0] if row else "?"
    return env


def render(selected: list[Workload], env: dict[str, Any], cfg: Config, markdown: bool) -> str:
    lines: list[str] = []
    all_cells = {(wl.section, wl.name): summarise(wl) for wl in selected}
    sections = list(dict.fromkeys(wl.section for wl in selected))
    for section in sections:
        rows = [wl for wl in selected if wl.section == section]
        lines.append(f"\n## {section}" if markdown else f"\n{section}")
        lines.append(
            f"(tasks/s, median of {cfg.reps}; client CPU µs per task in brackets; N = {cfg.n:,})"
        )
        for wl in rows:
            cells = all_cells[(wl.section, wl.name)]
            if markdown:
                lines.append(f"\n**{wl.name}**\n")
                lines.append("| " + " | ".join(cells) + " |")
                lines.append("|" + "---|" * len(cells))
                lines.append("| " + " | ".join(c.text() for c in cells.values()) + " |")
            else:
                lines.append(f"  {wl.name}")
                for label, cell in cells.items():
                    extra = ""
                    if cell.per_group:
                        extra = "  groups: " + ", ".join(f"{r:,.0f}" for r in cell.per_group)
                    lines.append(f"    {label:<34}{cell.text()}{extra}")
            if wl.error:
                lines.append(f"    FAILED: {wl.error}")
    found = targets(all_cells)
    if found:
        lines.append("\n## Targets" if markdown else "\nTargets (same-run ratios)")
        if markdown:
            lines.append(
                "\n| target | measured | ratio / value | met | short by |\n|---|---|---|---|---|"
            )
        for t in found:
            value = (
                "—" if t.ratio is None else (f"{t.ratio:.1f} ms" if t.upper else f"{t.ratio:.2f}")
            )
            met = {True: "yes", False: "**no**" if markdown else "NO", None: "?"}[t.met]
            if markdown:
                lines.append(f"| {t.text} | {t.measured} | {value} | {met} | {t.gap} |")
            else:
                lines.append(f"  {t.text:<58}{t.measured:>20}  {value:>8}  {met:<4} {t.gap}")
    lines.append("\n## Environment" if markdown else "\nEnvironment")
    for key, value in env.items():
        lines.append(f"- {key}: {value}" if markdown else f"  {key}: {value}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 1,000, one repetition")
    parser.add_argument("--n", type=int, help="tasks per measurement (default 5,000)")
    parser.add_argument(
        "--n-single", type=int, help="tasks of the one-call-each enqueue workload (default N)"
    )
    parser.add_argument("--reps", type=int, help="repetitions (default 3)")
    parser.add_argument("--history", type=int, help="finished tasks (default 1,000,000)")
    parser.add_argument("--latency-samples", type=int, help="measured tasks (default 250)")
    parser.add_argument(
        "--pg",
        default=os.environ.get(
            "CONVEYOR_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
        help="a PostgreSQL URL whose server the suite may create databases on",
    )
    parser.add_argument("--no-pg", action="store_true", help="SQLite only")
    parser.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only")
    parser.add_argument("--only", action="append", default=[], help="run workloads matching")
    parser.add_argument("--skip", action="append", default=[], help="leave out workloads matching")
    parser.add_argument("--json", help="also write the raw measurements here")
    parser.add_argument("--markdown", help="also write the tables as Markdown here")
    args = parser.parse_args(argv)

    quick = args.quick
    cfg = Config(
        n=args.n or (1_000 if quick else 5_000),
        # One call per task is the slowest way in (and its cost per task is flat), so
        # the quick run checks it with fewer tasks.
        n_single=args.n_single or args.n or (200 if quick else 5_000),
        reps=args.reps or (1 if quick else 3),
        history=args.history or (10_000 if quick else 1_000_000),
        latency_samples=args.latency_samples or (30 if quick else 250),
        dbs=Databases(None if args.no_pg else args.pg),
        timeout=300.0,
        reuse=quick and not args.reps,
    )
    selected = [
        wl
        for wl in workloads(pg=not args.no_pg, sqlite=not args.no_sqlite, quick=quick)
        if not args.only or any(w.lower() in f"{wl.section} {wl.name}".lower() for w in args.only)
        if not any(w.lower() in f"{wl.section} {wl.name}".lower() for w in args.skip)
    ]
    env = environment(None if args.no_pg else args.pg)
    started = time.perf_counter()
    try:
        status = 0 if run_all(selected, cfg) else 1
    except KeyboardInterrupt:
        # Interrupted: report what was measured so far (unfinished workloads show "—").
        status = 1
        env["interrupted"] = "yes: the workloads after the last one printed did not run"
    finally:
        cfg.dbs.close()
    env["load average (end)"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    env["suite time"] = f"{time.perf_counter() - started:.0f} s"
    env["N"] = cfg.n
    env["N (enqueue, one call each)"] = cfg.n_single
    env["repetitions"] = cfg.reps
    env["history"] = cfg.history
    env["latency samples"] = cfg.latency_samples
    print(render(selected, env, cfg, markdown=False))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(render(selected, env, cfg, markdown=True) + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "env": env,
                    "results": [
                        {
                            "section": wl.section,
                            "workload": wl.name,
                            "system": label,
                            "runs": [
                                {
                                    "n": o.n,
                                    "seconds": o.seconds,
                                    "cpu": o.cpu,
                                    "latencies": o.latencies,
                                    "per_group": o.per_group,
                                }
                                for o in outs
                            ],
                        }
                        for wl in selected
                        for label, outs in wl.results.items()
                    ],
                },
                f,
            )
    if status:
        print("\nthe suite FAILED: see the FAILED lines above", file=sys.stderr)
    return status
