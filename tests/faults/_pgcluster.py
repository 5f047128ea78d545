"""A private PostgreSQL cluster that a fault test may stop, restart and kill.

The shared test server is never touched: :class:`Cluster` runs ``initdb`` into a
fresh temporary folder with the server binaries installed on the machine
(``/usr/lib/postgresql/*/bin``, ``pg_config --bindir`` or ``$PATH``), picks a
free port on 127.0.0.1 (its own folder and port, so parallel test processes
each run theirs), and starts, stops and restarts that server with
``pg_ctl``; ``Cluster(standby_of=primary)`` is a streaming replica of a
running one, made with ``pg_basebackup -R``. ``initdb`` and ``postgres`` refuse
to run as root, so under root the commands run as the ``postgres`` OS user
(``runuser``, else ``su``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg

SERVER_USER = "postgres"


class ClusterUnavailable(RuntimeError):
    """The machine cannot run a private PostgreSQL server (no binaries, no user)."""


def find_bindir() -> Path:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres`` (newest version)."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
        reverse=True,
    )
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, timeout=10, check=True
        )
        candidates.append(out.stdout.strip())
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    for folder in candidates:
        if folder and all((Path(folder) / exe).exists() for exe in ("initdb", "pg_ctl")):
            return Path(folder)
    raise ClusterUnavailable("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody uses right now, below the ephemeral range.

    Below it, because a cluster's port must stay free while a test holds the
    server down: an ephemeral port could meanwhile become the local end of some
    client connection (parallel test workers open many), and the restart would
    then fail to bind. The choice is random, so parallel workers spread out.
    """
    low, _ = _ephemeral_range()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(20_000, max(20_001, min(low, 32_768)))
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # a crowded machine: any port the kernel offers
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Cluster:
    """One throwaway server: ``start()``, ``stop(mode)``, ``restart(mode, down=...)``."""

    def __init__(
        self,
        root: Path | None = None,
        *,
        standby_of: Cluster | None = None,
        netns: str | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.bindir = find_bindir()
        # In a network namespace (a host of its own), its commands run under
        # ``ip netns exec`` and the server listens on that namespace's ``host``.
        self.prefix = [] if netns is None else ["ip", "netns", "exec", netns]
        self.host = host
        self.as_root = os.geteuid() == 0
        self.owner: pwd.struct_passwd | None = None
        if self.as_root:
            try:
                self.owner = pwd.getpwnam(SERVER_USER)
            except KeyError:
                raise ClusterUnavailable(
                    f"running as root and there is no {SERVER_USER!r} OS user to run the server as"
                ) from None
        base = tempfile.mkdtemp(prefix="conveyor-pg-", dir=root)
        self.root = Path(base)
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        if self.owner is not None:
            os.chmod(self.root, 0o755)  # the server user must reach its folder
            os.chown(self.root, self.owner.pw_uid, self.owner.pw_gid)
        if standby_of is not None:
            self._clone(standby_of)
            return
        self._run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ]
        )
        conf = "\n".join(
            [
                f"listen_addresses = '{host}'",
                f"port = {self.port}",
                f"unix_socket_directories = '{self.root}'",
                "fsync = off",  # a throwaway server; crash safety of the OS is not under test
                "max_connections = 100",
                "shared_buffers = 32MB",
                "log_min_messages = warning",
                "",
            ]
        )
        with (self.data / "postgresql.conf").open("a") as fh:
            fh.write(conf)
        if host != "127.0.0.1":  # clients on the other hosts of its subnet
            with (self.data / "pg_hba.conf").open("a") as fh:
                fh.write("host all all samenet trust\n")

    def _clone(self, primary: Cluster) -> None:
        """This cluster as a streaming replica of the running ``primary``: a base
        backup with ``-R`` (its ``standby.signal`` and ``primary_conninfo``), then
        this cluster's own port and socket folder (the last setting wins)."""
        self._run(
            [
                str(self.bindir / "pg_basebackup"),
                "-D",
                str(self.data),
                "-h",
                "127.0.0.1",
                "-p",
                str(primary.port),
                "-U",
                "postgres",
                "-R",
                "-X",
                "stream",
                "--checkpoint=fast",  # a spread checkpoint would take minutes
                "--no-sync",
            ]
        )
        with (self.data / "postgresql.conf").open("a") as fh:
            fh.write(
                f"port = {self.port}\nunix_socket_directories = '{self.root}'\nhot_standby = on\n"
            )

    @property
    def admin_dsn(self) -> str:
        """A psycopg connection string to the ``postgres`` database."""
        return f"postgresql://postgres@{self.host}:{self.port}/postgres"

    def url(self, database: str) -> str:
        """A conveyor URL for ``database`` on this server."""
        return f"postgresql://postgres@{self.host}:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create ``name`` and return its URL."""
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    # -------------------------------------------------------------- control
    def _run(self, argv: Sequence[str], timeout: float = 120) -> None:
        if self.owner is not None:
            if shutil.which("runuser"):
                argv = ["runuser", "-u", SERVER_USER, "--", *argv]
            else:
                argv = ["su", SERVER_USER, "-s", "/bin/sh", "-c", subprocess.list2cmdline(argv)]
        argv = [*self.prefix, *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            tail = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(
                f"{' '.join(argv)} exited {done.returncode}: {done.stdout}{done.stderr}{tail}"
            )

    def _pg_ctl(self, *args: str) -> None:
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), *args])

    def start(self) -> float:
        """Start the server and wait until it accepts connections; returns the
        monotonic time it did."""
        self._pg_ctl("-l", str(self.log), "-w", "-t", "60", "start")
        self.wait_ready()
        return time.monotonic()

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m MODE`` (``smart``, ``fast`` or ``immediate``)."""
        self._pg_ctl("-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str, down: float) -> tuple[float, float]:
        """Stop with ``mode``, stay down ``down`` seconds, start again.

        Returns the monotonic times the server went down and came back.
        """
        self.stop(mode)
        went_down = time.monotonic()
        time.sleep(down)
        return went_down, self.start()

    def wait_ready(self, timeout: float = 60) -> None:
        """Wait until a connection succeeds (after a crash, recovery runs first)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.admin_dsn, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def running(self) -> bool:
        """Whether the server's postmaster is up."""
        return (self.data / "postmaster.pid").exists()

    def destroy(self) -> None:
        """Stop the server (immediately) and delete its folder."""
        if self.running():
            with contextlib.suppress(Exception):
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
