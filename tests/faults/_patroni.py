"""A private etcd and a three-node Patroni cluster of PostgreSQL, for failover tests.

Everything comes from the machine's Debian packages (``etcd-server``,
``patroni``, ``postgresql-15``) and listens on 127.0.0.1 only, on ports picked
like :mod:`_pgcluster`'s, with its data in one temporary folder. The shared test
server is never touched. :class:`PatroniCluster` starts etcd, then three Patroni
daemons (each runs its own postmaster), waits for a leader and two replicas
streaming from it, and on :meth:`~PatroniCluster.destroy` stops what it started
by PID (Patroni stops its own postmaster; a postmaster left behind is stopped
with ``pg_ctl`` on its own data folder).

The DCS configuration is what a failover test needs: ``synchronous_mode`` (a
commit returns only once a standby has it, and only that standby may be
promoted), ``primary_start_timeout: 0`` (a crashed primary is failed over at
once rather than restarted in place) and a one-second loop, so a failover takes
seconds. As root, Patroni (and so PostgreSQL) runs as the ``postgres`` OS user.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from _pgcluster import SERVER_USER, ClusterUnavailable, find_bindir, free_port

SCOPE = "conveyor-failover"
NODES = 3


def _bindir() -> Path:
    fifteen = Path("/usr/lib/postgresql/15/bin")
    return fifteen if (fifteen / "initdb").exists() else find_bindir()


def _executable(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ClusterUnavailable(
            f"no {name!r} on this machine (Debian: apt-get install patroni etcd-server)"
        )
    return found


@dataclass
class Node:
    """One Patroni member: its name, PostgreSQL and REST ports, folder and daemon."""

    name: str
    pg_port: int
    api_port: int
    root: Path
    config: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def data(self) -> Path:
        """The member's PostgreSQL data folder."""
        return self.root / "data"

    @property
    def dsn(self) -> str:
        """A psycopg connection string to this member's ``postgres`` database."""
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/postgres"

    def postmaster_pid(self) -> int | None:
        """The PID of the member's running postmaster (from ``postmaster.pid``)."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.data / "postmaster.pid").read_text().split()[0])
        return None


class PatroniCluster:
    """etcd plus three Patroni members; ``start()``, ``leader()``, ``destroy()``."""

    def __init__(self) -> None:
        self.bindir = _bindir()
        self.patroni = _executable("patroni")
        self.patronictl = _executable("patronictl")
        self.etcd = _executable("etcd")
        self.owner: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            try:
                self.owner = pwd.getpwnam(SERVER_USER)
            except KeyError:
                raise ClusterUnavailable(
                    f"running as root and there is no {SERVER_USER!r} OS user to run the server as"
                ) from None
        self.root = Path(tempfile.mkdtemp(prefix="conveyor-patroni-"))
        os.chmod(self.root, 0o755)
        self.etcd_client_port = free_port()
        self.etcd_peer_port = free_port()
        self.etcd_process: subprocess.Popen[bytes] | None = None
        self.nodes = [self._node(i) for i in range(NODES)]

    # ------------------------------------------------------------- config
    def _own(self, path: Path) -> None:
        if self.owner is not None:
            os.chown(path, self.owner.pw_uid, self.owner.pw_gid)

    def _node(self, i: int) -> Node:
        root = self.root / f"node{i}"
        root.mkdir(mode=0o700)
        self._own(root)
        node = Node(f"node{i}", free_port(), free_port(), root, root / "patroni.yml")
        config = {
            "scope": SCOPE,
            "name": node.name,
            "log": {"level": os.environ.get("PATRONI_TEST_LOG", "INFO")},
            "restapi": {
                "listen": f"127.0.0.1:{node.api_port}",
                "connect_address": f"127.0.0.1:{node.api_port}",
            },
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_client_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": 10,
                    "loop_wait": 1,
                    "retry_timeout": 4,
                    "maximum_lag_on_failover": 1048576,
                    "synchronous_mode": True,
                    "primary_start_timeout": 0,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "max_connections": 100,
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "wal_log_hints": "on",
                            "wal_keep_size": "64MB",
                            "shared_buffers": "32MB",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, "no-sync"],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{node.pg_port}",
                "connect_address": f"127.0.0.1:{node.pg_port}",
                "data_dir": str(node.data),
                "bin_dir": str(self.bindir),
                "pgpass": str(root / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": "postgres"},
                    "replication": {"username": "replicator", "password": "replicator"},
                    "rewind": {"username": "rewinder", "password": "rewinder"},
                },
                "pg_hba": [
                    "local all all trust",
                    "host replication replicator 127.0.0.1/32 trust",
                    "host all all 127.0.0.1/32 trust",
                ],
                "parameters": {
                    "unix_socket_directories": str(root),
                    # A throwaway cluster on one machine: the OS does not crash under
                    # test, only processes do, and the page cache outlives them.
                    "fsync": "off",
                    "log_min_messages": "warning",
                },
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False},
        }
        # JSON is YAML: no YAML writer needed.
        node.config.write_text(json.dumps(config, indent=2))
        self._own(node.config)
        return node

    @property
    def url_hosts(self) -> str:
        """The members as a libpq host list: ``127.0.0.1:p1,127.0.0.1:p2,...``."""
        return ",".join(f"127.0.0.1:{n.pg_port}" for n in self.nodes)

    def url(self, database: str) -> str:
        """The libpq multi-host URL of ``database`` that finds the primary."""
        return f"postgresql://postgres@{self.url_hosts}/{database}?target_session_attrs=read-write"

    # ------------------------------------------------------------- control
    def _spawn(self, argv: list[str], log: Path, as_owner: bool) -> subprocess.Popen[bytes]:
        with log.open("ab") as sink:
            user: dict[str, Any] = {}
            if as_owner and self.owner is not None:
                user = {"user": self.owner.pw_uid, "group": self.owner.pw_gid, "extra_groups": []}
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                env={
                    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "HOME": str(self.root),
                    "LANG": "C.UTF-8",
                },
                start_new_session=True,  # a ^C of the test run reaches it through us only
                **user,
            )

    def start(self, timeout: float = 120) -> None:
        """Start etcd and the members; wait for a leader and two streaming replicas."""
        etcd_data = self.root / "etcd"
        client = f"http://127.0.0.1:{self.etcd_client_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        self.etcd_process = self._spawn(
            [
                self.etcd,
                "--name",
                "conveyor",
                "--data-dir",
                str(etcd_data),
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"conveyor={peer}",
                "--listen-metrics-urls",
                f"http://127.0.0.1:{free_port()}",
                "--unsafe-no-fsync",
            ],
            self.root / "etcd.log",
            as_owner=False,
        )
        self._until(lambda: self._http(f"{client}/health") is not None, 30, "etcd healthy")
        for node in self.nodes:
            node.process = self._spawn(
                [self.patroni, str(node.config)], node.root / "patroni.log", as_owner=True
            )
        self.wait_healthy(timeout)

    def _http(self, url: str) -> Any:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return json.loads(resp.read() or b"null")
        except (OSError, ValueError):
            return None

    def members(self, seen_by: Node | None = None) -> list[dict[str, Any]]:
        """The members as Patroni's REST API lists them (``/cluster``, of the first
        member that answers, or of ``seen_by``), or ``[]``."""
        for node in self.nodes if seen_by is None else [seen_by]:
            found = self._http(f"http://127.0.0.1:{node.api_port}/cluster")
            if found and found.get("members"):
                return list(found["members"])
        return []

    def leader(self) -> Node:
        """The member holding the leader lock (it must be running)."""
        for member in self.members():
            if member.get("role") == "leader" and member.get("state") == "running":
                return self.node(member["name"])
        raise AssertionError(f"no running leader: {self.members()}")

    def sync_standby(self, seen_by: Node | None = None) -> Node:
        """The member Patroni keeps as the synchronous standby."""
        for member in self.members(seen_by):
            if member.get("role") == "sync_standby":
                return self.node(member["name"])
        raise AssertionError(f"no synchronous standby: {self.members(seen_by)}")

    def node(self, name: str) -> Node:
        """The member called ``name``."""
        return next(n for n in self.nodes if n.name == name)

    def healthy(self) -> bool:
        """A running leader, and every other member streaming from it (with one of
        them its synchronous standby), as the leader's ``pg_stat_replication`` says,
        and the leader's Patroni knowing which standby is the synchronous one (until
        it does, it would not fail over after a crash but restart in place)."""
        try:
            leader = self.leader()
            standby = self.sync_standby(seen_by=leader)
        except AssertionError:
            return False
        try:
            with psycopg.connect(leader.dsn, connect_timeout=2, autocommit=True) as conn:
                if conn.execute("SELECT pg_is_in_recovery()").fetchone() != (False,):
                    return False
                rows = conn.execute(
                    "SELECT application_name, sync_state FROM pg_stat_replication "
                    "WHERE state = 'streaming'"
                ).fetchall()
        except psycopg.Error:
            return False
        names = {name for name, _ in rows}
        others = {n.name for n in self.nodes if n is not leader}
        return others <= names and (standby.name, "sync") in rows

    def wait_healthy(self, timeout: float = 90) -> float:
        """Wait until :meth:`healthy`; the seconds it took."""
        return self._until(self.healthy, timeout, "a leader and two streaming replicas")

    def _until(self, check: Any, timeout: float, what: str) -> float:
        began = time.monotonic()
        while not check():
            if time.monotonic() - began > timeout:
                raise RuntimeError(
                    f"timed out after {timeout} s waiting for {what}:\n{self.logs()}"
                )
            for node in self.nodes:
                if node.process is not None and node.process.poll() is not None:
                    raise RuntimeError(f"patroni {node.name} exited:\n{self.logs()}")
            time.sleep(0.2)
        return time.monotonic() - began

    def logs(self, tail: int = 3000) -> str:
        """The end of every daemon's log, for failure messages."""
        parts = []
        for path in sorted(self.root.glob("**/*.log")):
            with contextlib.suppress(OSError):
                parts.append(f"--- {path.name} ({path.parent.name})\n{path.read_text()[-tail:]}")
        return "\n".join(parts)

    def create_database(self, name: str) -> str:
        """Create ``name`` on the leader; its multi-host URL."""
        with psycopg.connect(self.leader().dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def kill_primary(self) -> tuple[Node, int]:
        """``kill -9`` the leader's postmaster (Patroni on that member stays up and
        hands over); the member and the PID killed."""
        leader = self.leader()
        pid = leader.postmaster_pid()
        assert pid is not None, f"{leader.name} has no postmaster.pid"
        os.kill(pid, signal.SIGKILL)
        return leader, pid

    def switchover(self, candidate: Node) -> None:
        """A planned switchover to ``candidate`` with ``patronictl`` (at once, no prompt)."""
        done = subprocess.run(
            [
                self.patronictl,
                "-c",
                str(candidate.config),
                "switchover",
                "--force",
                "--candidate",
                candidate.name,
                SCOPE,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise RuntimeError(f"patronictl switchover failed: {done.stdout}{done.stderr}")

    def destroy(self) -> None:
        """Stop the daemons this cluster started (by PID), then delete its folder."""
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.send_signal(signal.SIGTERM)  # Patroni stops its postmaster
        for node in self.nodes:
            if node.process is not None:
                try:
                    node.process.wait(30)
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait()
            if node.postmaster_pid() is not None and node.data.exists():
                # Left running by a Patroni that died first: stop it on its own folder.
                argv = [str(self.bindir / "pg_ctl"), "-D", str(node.data), "-m", "immediate"]
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    subprocess.run(
                        [*argv, "-w", "-t", "20", "stop"],
                        capture_output=True,
                        timeout=30,
                        **(
                            {"user": self.owner.pw_uid, "group": self.owner.pw_gid}
                            if self.owner is not None
                            else {}
                        ),
                    )
        if self.etcd_process is not None and self.etcd_process.poll() is None:
            self.etcd_process.terminate()
            try:
                self.etcd_process.wait(20)
            except subprocess.TimeoutExpired:
                self.etcd_process.kill()
                self.etcd_process.wait()
        shutil.rmtree(self.root, ignore_errors=True)
