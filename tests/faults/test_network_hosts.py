"""Many hosts on a real network: PostgreSQL, a producer and three workers, each in
a network namespace of its own, joined by veth pairs to a bridge (issue 30 §4).

The workers' links carry ``netem`` delay, jitter and 1 % loss both ways. Two faults:

* **partition**: one worker host's link drops everything (``netem loss 100%``)
  for longer than the lease. Its tasks are recovered by the others; when the link
  heals its late writes are fenced (``LostLease``, in its log) and it carries on.
* **clock skew**: one worker host runs under ``faketime`` an hour ahead; the
  database's clock rules the leases, so nothing changes.

Each checks: no acknowledged submit lost; a task run twice only when a lease
expired under it (and then no more than the partitioned worker held); order in
partitioned streams; nothing unhandled in the logs. Needs root (CAP_NET_ADMIN)
and ``iproute2``; skipped without them outside CI, failed under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import random
import re
import shutil
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _faultkit import (
    QUEUE,
    Figures,
    check_delivery,
    drained,
    read_jsonl,
    spawn,
    statuses,
    stop_all,
    unhandled_output,
    until,
)
from _pgcluster import Cluster, ClusterUnavailable

import conveyor

# With the other private-cluster scenarios, in one xdist process: one at a time,
# never beside another heavy fault test (a loaded machine stretches the timings).
pytestmark = [pytest.mark.netns, pytest.mark.xdist_group("pg_cluster")]

WORKERS = 3
CONCURRENCY = 4
LEASE = 3.0
POLL = 1.0
FAULT_AT = 3.0  # seconds into the load
PARTITION_S = 8.0  # longer than the lease: the partitioned worker's leases expire
PRODUCE_S = 14.0  # and then until the cut worker works again after the heal
SKEW_PRODUCE_S = 12.0
RATE = 40.0
PARTITIONS = 6
MIN_TASKS = 150
HOLD_S = 1.5  # a task the partition catches in flight runs this long
HOLD_SEQ = 10_000_000  # its sequence numbers, apart from the producer's
SKEW = "+1h"
SKEW_S = 3600.0
NETEM = ["delay", "2ms", "1ms", "loss", "1%"]
LOSS = ["-m", "statistic", "--mode", "random", "--probability", "0.01"]
LISTENER = "conveyor-listener"
# Lines of a worker's log that say a write of its own was fenced or a lease gone.
FENCED = ("dropped at completion", "dropped at failure", "lease lost", "dropped:")


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"the network-hosts tests need network namespaces: {reason}")
    pytest.skip(reason)


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")


@dataclass
class Network:
    """A bridge in this namespace and one namespace ("host") per name, each with a
    veth pair to the bridge and its own address; ``close()`` deletes only these."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:5])
    subnet: str = ""
    namespaces: dict[str, str] = field(default_factory=dict)  # host -> namespace
    addresses: dict[str, str] = field(default_factory=dict)  # host -> IPv4
    links: dict[str, tuple[str, str]] = field(default_factory=dict)  # host -> (outer, inner)
    bridge: str = ""
    impaired: dict[str, str] = field(default_factory=dict)  # host -> "netem"/"iptables"
    link: str = ""  # the workers' links' impairment, as applied
    iptables: str = "iptables"

    def open(self, hosts: list[str]) -> None:
        """Create the bridge, then each host; raises if the kernel refuses."""
        taken = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
        rng = random.SystemRandom()
        while True:
            self.subnet = f"10.{rng.randrange(100, 250)}.{rng.randrange(0, 256)}"
            if f" {self.subnet}." not in taken:
                break
        self.bridge = f"cvb{self.tag}"
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for n, host in enumerate(hosts):
            ns = f"conveyor-{self.tag}-{host}"
            outer, inner = f"cv{self.tag}h{n}", f"cv{self.tag}n{n}"
            _ip("netns", "add", ns)
            self.namespaces[host] = ns
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner, "netns", ns)
            self.links[host] = (outer, inner)
            _ip("link", "set", outer, "master", self.bridge)
            _ip("link", "set", outer, "up")
            address = f"{self.subnet}.{10 + n}"
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            self.addresses[host] = address

    def exec(self, host: str) -> list[str]:
        """The command prefix that runs a program on ``host``."""
        return ["ip", "netns", "exec", self.namespaces[host]]

    def _run(self, argv: list[str]) -> bool:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if done.returncode != 0 and "qdisc kind is unknown" not in done.stderr:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done.returncode == 0

    @staticmethod
    def _works(argv: list[str]) -> bool:
        return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0

    def netem(self, host: str, *spec: str, verb: str = "add") -> bool:
        """``tc qdisc VERB ... netem SPEC`` on both ends of ``host``'s link; False if
        the kernel has no netem (a kernel built without ``sch_netem``)."""
        outer, inner = self.links[host]
        return all(
            self._run([*prefix, "tc", "qdisc", verb, "dev", dev, "root", "netem", *spec])
            for prefix, dev in (([], outer), (self.exec(host), inner))
        )

    def _drop(self, host: str, action: str, *match: str) -> None:
        """Drop what ``host`` receives from the database host and the database host
        receives from it (``match`` narrows it): a silent loss both ways, as on a
        wire (a drop on OUTPUT would fail the sender's own send instead)."""
        address = self.addresses[host]
        for where, rule in ((host, []), ("pg", ["-s", address])):
            argv = [self.iptables, "-w", action, "INPUT", *rule, *match, "-j", "DROP"]
            self._run([*self.exec(where), *argv])

    def impair(self, host: str) -> str:
        """Delay, jitter and 1 % loss on ``host``'s link with netem; on a kernel
        without netem, the 1 % loss with iptables (no delay). What was applied."""
        if self.netem(host, *NETEM):
            self.impaired[host] = "netem"
            return "netem " + " ".join(NETEM)
        # The nftables front end first, the legacy one if the kernel has only that.
        for program in ("iptables", "iptables-legacy"):
            if shutil.which(program) and self._works([*self.exec(host), program, "-w", "-S"]):
                self.iptables = program
                break
        else:
            raise RuntimeError("the kernel has no netem and there is no working iptables")
        self._drop(host, "-A", *LOSS)
        self.impaired[host] = "iptables"
        return "iptables statistic loss 1% both ways (the kernel has no netem: no delay)"

    def cut(self, host: str) -> None:
        """Partition ``host``: everything between it and the others is dropped."""
        if self.impaired.get(host) == "netem":
            self.netem(host, "loss", "100%", verb="change")
        else:
            self._drop(host, "-I")

    def heal(self, host: str) -> None:
        """Undo :meth:`cut` (the link's usual impairment stays)."""
        if self.impaired.get(host) == "netem":
            self.netem(host, *NETEM, verb="change")
        else:
            self._drop(host, "-D")

    def close(self) -> None:
        """Delete the namespaces (their veth pairs go with them) and the bridge."""
        for host, ns in self.namespaces.items():
            with contextlib.suppress(RuntimeError):
                _ip("netns", "del", ns)
            with contextlib.suppress(RuntimeError):  # gone with the namespace, normally
                _ip("link", "del", self.links[host][0])
        if self.bridge:
            with contextlib.suppress(RuntimeError):
                _ip("link", "del", self.bridge)


HOSTS = ["pg", "prod", *(f"w{i}" for i in range(WORKERS))]


@pytest.fixture(scope="module")
def network() -> Iterator[Network]:
    """The hosts, the workers' links impaired; deleted at teardown."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        _unavailable("no ip/tc on this machine (Debian: apt-get install iproute2)")
    net = Network()
    try:
        try:
            net.open(HOSTS)
        except (RuntimeError, OSError) as exc:
            _unavailable(f"cannot create network namespaces (CAP_NET_ADMIN?): {exc}")
        try:
            applied = {net.impair(f"w{i}") for i in range(WORKERS)}
        except RuntimeError as exc:
            _unavailable(str(exc))
        net.link = " / ".join(sorted(applied))
        yield net
    finally:
        net.close()


@pytest.fixture(scope="module")
def db_host(network: Network) -> Iterator[Cluster]:
    """A private PostgreSQL on the ``pg`` host, listening on its address only."""
    try:
        cluster = Cluster(netns=network.namespaces["pg"], host=network.addresses["pg"])
    except ClusterUnavailable as exc:  # pragma: no cover - depends on the machine
        _unavailable(str(exc))
        raise
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


def _listeners(cluster: Cluster, db: str) -> int:
    with psycopg.connect(cluster.admin_dsn, autocommit=True, connect_timeout=3) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
            (db, LISTENER),
        ).fetchone()
    return int(row[0]) if row else 0


def _log_tasks(path: Path, markers: tuple[str, ...]) -> list[str]:
    """Task ids of the log lines at ``path`` that hold one of ``markers``."""
    found = []
    for line in path.read_text().splitlines():
        if any(m in line for m in markers):
            match = re.search(r"\[task=(\S+) attempt=", line)
            if match and match.group(1) != "-":
                found.append(match.group(1))
    return found


def _runs(logdir: Path) -> list[dict[str, Any]]:
    """Every handler run, each with the name of the worker that ran it."""
    runs: list[dict[str, Any]] = []
    for path in logdir.glob("exec-*.jsonl"):
        runs.extend({**r, "worker": path.stem.removeprefix("exec-")} for r in read_jsonl(path))
    return [r for r in runs if r["seq"] >= 0]


@dataclass
class Run:
    """What one scenario left behind."""

    figures: Figures
    logdir: Path
    runs: list[dict[str, Any]]
    fault: tuple[float, float]  # wall clock: injected, ended


def _scenario(
    network: Network,
    cluster: Cluster,
    tmp_path: Path,
    name: str,
    injected: str,
    wraps: dict[str, list[str]],
    inject: Callable[[str, Path], tuple[float, float]],
    clock_offsets: dict[str, float] | None = None,
    produce_s: float = PRODUCE_S,
) -> Run:
    """Workers on their hosts, a producer on its own; ``inject(url, logdir)``
    mid-load returns the wall-clock moments the fault began and ended (tasks it
    submits itself go to ``logdir/acked-inject.jsonl``); drain, then measure."""
    db = f"netns_{name}_{uuid.uuid4().hex[:6]}"
    url = cluster.create_database(db)
    with conveyor.connect_sync(url, listen=False):
        pass  # migrated once, before the children start
    logdir = tmp_path / name
    logdir.mkdir()
    figures = Figures(scenario=name, injected=injected)
    workers = [
        spawn(
            "worker",
            url,
            logdir,
            f"w{i}",
            LEASE,
            POLL,
            CONCURRENCY,
            logdir=logdir,
            log=f"worker-w{i}.log",
            wrap=[*network.exec(f"w{i}"), *wraps.get(f"w{i}", [])],
        )
        for i in range(WORKERS)
    ]
    producer = None
    began = time.monotonic()
    # Load until the fault is over, however long it takes (the producer's own
    # duration may run out first); the partition takes it away when it may stop.
    (logdir / "produce.hold").touch()
    try:
        until(lambda: _listeners(cluster, db) == WORKERS, 60, "workers listening")
        producer = spawn(
            "producer",
            url,
            logdir,
            produce_s,
            RATE,
            PARTITIONS,
            logdir=logdir,
            log="producer.log",
            wrap=network.exec("prod"),
        )
        assert producer.stdout is not None and producer.stdout.readline().strip() == "ready"
        time.sleep(FAULT_AT)
        fault = inject(url, logdir)
        (logdir / "produce.hold").unlink(missing_ok=True)
        out, _ = producer.communicate(timeout=120)
        assert producer.returncode == 0, (logdir / "producer.log").read_text()
        figures.extra["producer"] = json.loads(out.strip().splitlines()[-1])
        figures.extra["drain_s"] = round(until(lambda: drained(url), 60, "queue drained"), 2)
    finally:
        codes = stop_all(workers)
        if producer is not None:
            stop_all([producer], timeout=0)
    figures.extra["link"] = network.link
    figures.extra["wall_s"] = round(time.monotonic() - began, 1)
    runs = _runs(logdir)
    for run in runs:  # a skewed host's clock: back to the others' time
        run["t0"] -= (clock_offsets or {}).get(run["worker"], 0.0)
        run["t1"] -= (clock_offsets or {}).get(run["worker"], 0.0)
    runs.sort(key=lambda r: r["t0"])
    acked = read_jsonl(logdir / "acked.jsonl")
    figures.extra["submitted_by_fault"] = len(read_jsonl(logdir / "acked-inject.jsonl"))
    acked += read_jsonl(logdir / "acked-inject.jsonl")
    check_delivery(figures, acked, runs, statuses(url), logdir)
    figures.extra["worker_exit_codes"] = codes
    figures.extra["runs_by_worker"] = dict(sorted(Counter(r["worker"] for r in runs).items()))
    for line in unhandled_output(logdir)[:5]:
        print(line[:400])
    assert codes == [0] * WORKERS, "workers must wind down cleanly after the fault"
    return Run(figures, logdir, runs, fault)


def _assert_delivery(figures: Figures) -> None:
    assert figures.tasks >= MIN_TASKS
    submitted = figures.extra["producer"]["submitted"] + figures.extra["submitted_by_fault"]
    assert submitted == figures.tasks
    assert figures.lost == 0
    assert figures.processed == figures.tasks
    assert figures.order_violations == 0
    assert figures.unhandled_log_lines == 0


@pytest.mark.timeout(150)
def test_partitioned_worker_host(network: Network, db_host: Cluster, tmp_path: Path) -> None:
    cut = "w0"

    def partition(url: str, logdir: Path) -> tuple[float, float]:
        # Cut while the worker surely holds a task: a few that take a while go in
        # until one runs on it (the load's own tasks take 10 ms: often none is held).
        with (
            conveyor.connect_sync(url, listen=False) as store,
            (logdir / "acked-inject.jsonl").open("a") as sink,
        ):
            holds: set[str] = set()
            for n in range(HOLD_SEQ, HOLD_SEQ + 200, 2):
                for seq in (n, n + 1):
                    kwargs = {"seq": seq, "part": None, "hold": HOLD_S}
                    task = store.submit("step", {"kwargs": kwargs}, queue=QUEUE, key=f"hold-{seq}")
                    sink.write(json.dumps({"seq": seq, "id": task.id, "t": time.time()}) + "\n")
                    holds.add(task.id)
                sink.flush()
                time.sleep(0.3)
                running = store.list(queue=QUEUE, status="running", limit=1000).items
                if any(t.worker_id == cut and t.id in holds for t in running):
                    break
        network.cut(cut)
        began = time.time()
        time.sleep(PARTITION_S)
        network.heal(cut)
        healed = time.time()
        # The load goes on until the healed worker runs tasks again (its connections
        # wait out TCP's retransmission backoff first), however long that takes.
        until(
            lambda: any(r["t0"] > healed for r in read_jsonl(logdir / f"exec-{cut}.jsonl")),
            60,
            "the healed worker runs tasks again",
        )
        (logdir / "produce.hold").unlink()
        return began, healed

    result = _scenario(
        network,
        db_host,
        tmp_path,
        "netns_partition",
        f"one worker host cut off {PARTITION_S:g} s (lease {LEASE:g} s)",
        {},
        partition,
    )
    figures, runs = result.figures, result.runs
    began, healed = result.fault
    log = result.logdir / f"worker-{cut}.log"
    # Held by the cut worker across the fault: a run of it began before the heal
    # and its outcome was not recorded by it (fenced, or failed to be written).
    fenced = set(_log_tasks(log, FENCED))
    unrecorded = set(_log_tasks(log, ("could not record",)))
    held = {r["id"] for r in runs if r["worker"] == cut and r["t0"] < healed} & (
        fenced | unrecorded
    )
    successes = Counter(r["id"] for r in runs if r["ok"])
    twice = {task_id for task_id, n in successes.items() if n > 1}
    after_heal = [r for r in runs if r["worker"] == cut and r["t0"] > healed]
    figures.duplicates_from_lost_acks = sum(successes[t] - 1 for t in twice & held)
    # Recovery: from the heal to the cut worker's first run again (TCP's
    # retransmission backoff on its connections is most of it).
    figures.recovery_s = round(min((r["t0"] for r in after_heal), default=healed) - healed, 2)
    rerun = [r["t0"] for r in runs if r["id"] in twice and r["worker"] != cut]
    figures.extra["taken_over_after_s"] = round(min(rerun) - began, 2) if rerun else None
    figures.extra.update(
        partition_s=round(healed - began, 2),
        held_by_cut_worker=len(held),
        fenced_lines=len(_log_tasks(log, FENCED)),
        cut_runs_after_heal=len(after_heal),
    )
    figures.show()
    _assert_delivery(figures)
    assert twice <= held, "a task ran twice though no lease expired under it"
    assert figures.duplicates <= len(held)
    assert fenced, "the healed worker's late writes must be fenced (LostLease in its log)"
    assert after_heal, "the healed worker must carry on"


@pytest.mark.timeout(150)
def test_worker_host_clock_an_hour_ahead(
    network: Network, db_host: Cluster, tmp_path: Path
) -> None:
    # libfaketime itself, not the faketime program: that one forks and stays the
    # parent, so a SIGTERM would stop it and not the worker's own shutdown.
    libs = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not libs:
        _unavailable("no libfaketime on this machine (Debian: apt-get install faketime)")
    skewed = "w2"

    def nothing(url: str, logdir: Path) -> tuple[float, float]:
        now = time.time()
        return now, now

    result = _scenario(
        network,
        db_host,
        tmp_path,
        "netns_clock_skew",
        f"one worker host's clock {SKEW} (faketime)",
        {skewed: ["env", f"LD_PRELOAD={libs[0]}", f"FAKETIME={SKEW}"]},
        nothing,
        clock_offsets={skewed: SKEW_S},
        produce_s=SKEW_PRODUCE_S,
    )
    figures = result.figures
    figures.show()
    _assert_delivery(figures)
    assert figures.duplicates == 0, "a clock ahead must not expire anyone's lease"
    assert figures.extra["runs_by_worker"].get(skewed, 0) > 0, "the skewed worker works"
