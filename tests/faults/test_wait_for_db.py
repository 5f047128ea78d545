"""``conveyor worker --wait-for-db SECONDS``: a worker started while its database is
down waits for it (with backoff, saying so in its log) and then works; past the
limit, or with 0, it exits 4 with one line on stderr."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _faultkit import QUEUE, Figures, child_env, executions, unhandled_output
from _pgcluster import Cluster, ClusterUnavailable

import conveyor

# Under pytest-xdist (--dist loadgroup) both tests run in one process and share
# the module's stopped cluster.
pytestmark = pytest.mark.xdist_group("down_cluster")


@pytest.fixture(scope="module")
def down_cluster() -> Iterator[tuple[Cluster, str]]:
    """A private server with a migrated database, stopped."""
    try:
        cluster = Cluster()
    except ClusterUnavailable as exc:  # pragma: no cover - depends on the machine
        pytest.skip(str(exc))
    try:
        cluster.start()
        url = cluster.create_database("waiting")
        with conveyor.connect_sync(url, listen=False):
            pass
        cluster.stop("fast")
        yield cluster, url
    finally:
        cluster.destroy()


def _worker(url: str, logdir: Path, wait: float, log: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "conveyor.cli", "worker", "_faultkit:app"]
    argv += ["--queues", QUEUE, "--url", url, "--wait-for-db", str(wait), "--grace", "2"]
    with (logdir / log).open("w") as sink:
        return subprocess.Popen(
            argv, env=child_env(logdir), stdout=subprocess.DEVNULL, stderr=sink, text=True
        )


@pytest.mark.timeout(120)
def test_gives_up_at_once_or_after_the_limit(
    down_cluster: tuple[Cluster, str], tmp_path: Path
) -> None:
    _, url = down_cluster
    began = time.monotonic()
    now = _worker(url, tmp_path, 0, "now.log")
    assert now.wait(60) == 4
    at_once = time.monotonic() - began
    began = time.monotonic()
    later = _worker(url, tmp_path, 4, "later.log")
    assert later.wait(60) == 4
    after_wait = time.monotonic() - began
    quick, patient = (tmp_path / "now.log").read_text(), (tmp_path / "later.log").read_text()
    assert "waiting for the database" not in quick
    assert patient.count("waiting for the database") >= 3  # 0.5, 1, 2 s, ...
    assert "did not answer within 4 s" in patient and "--wait-for-db" in patient
    assert "Traceback" not in quick + patient
    # Not "after_wait > at_once": on a loaded machine starting the process alone has
    # taken 8 s. That the first gave up without waiting is what its log shows above.
    assert after_wait >= 4
    Figures(
        scenario="wait_for_db_gives_up",
        injected="worker started with the database down",
        extra={"exit_at_once_s": round(at_once, 2), "exit_after_4s_limit_s": round(after_wait, 2)},
    ).show()


@pytest.mark.timeout(120)
def test_waits_for_the_database_then_works(
    down_cluster: tuple[Cluster, str], tmp_path: Path
) -> None:
    cluster, url = down_cluster
    proc = _worker(url, tmp_path, 60, "patient.log")
    try:
        log = tmp_path / "patient.log"
        deadline = time.monotonic() + 60
        while log.read_text().count("waiting for the database") < 2:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        up_at = time.time()
        cluster.start()
        with conveyor.connect_sync(url, listen=False) as store:
            task = store.submit("step", {"kwargs": {"seq": 1, "part": None}}, queue=QUEUE)
            done = store.wait(task.id, timeout=60)
        assert done.status is conveyor.Status.SUCCEEDED
        [run] = [r for r in executions(tmp_path) if r["id"] == task.id]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if cluster.running():
            cluster.stop("fast")
    assert not unhandled_output(tmp_path, "patient.log")
    Figures(
        scenario="wait_for_db_recovers",
        injected="worker started with the database down, database started later",
        tasks=1,
        processed=1,
        recovery_s=round(run["t1"] - up_at, 2),
    ).show()
