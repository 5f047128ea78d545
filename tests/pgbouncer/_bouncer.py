"""A real PgBouncer in front of the shared test server, and the worker child that
drains tasks through it.

:class:`Bouncer` writes a ``pgbouncer.ini`` and a userlist into a fresh temporary
folder, picks a free port on 127.0.0.1 and runs the machine's ``pgbouncer``
(``auth_type = trust``) in the pool mode asked for, every database forwarded to
the server of ``$CONVEYOR_TEST_PG_URL``. PgBouncer refuses to run as root, so
under root it runs as the ``postgres`` OS user (as the private clusters of
tests/faults do).

Run as a script, this file is the worker child::

    python _bouncer.py worker URL      (drains queue "through" until SIGTERM)
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

import conveyor

SERVER_USER = "postgres"
QUEUE = "through"

app = conveyor.App()


@app.task(name="double", queue=QUEUE)
async def double(ctx: Any, n: int) -> int:
    """The worker's one task."""
    return n * 2


class BouncerUnavailable(RuntimeError):
    """No pgbouncer on this machine (or no user to run it as)."""


def find_pgbouncer() -> str:
    """The pgbouncer executable (``$PATH``, else Debian's /usr/sbin)."""
    found = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )
    if found is None:
        raise BouncerUnavailable("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Bouncer:
    """One PgBouncer in ``mode`` (``"transaction"`` or ``"session"``) in front of
    the server that ``admin_url`` names."""

    def __init__(self, mode: str, admin_url: str) -> None:
        self.exe = find_pgbouncer()
        self.mode = mode
        server = make_url(admin_url)
        self.owner: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            try:
                self.owner = pwd.getpwnam(SERVER_USER)
            except KeyError:
                raise BouncerUnavailable(
                    f"running as root and there is no {SERVER_USER!r} OS user to run pgbouncer as"
                ) from None
        self.root = Path(tempfile.mkdtemp(prefix=f"conveyor-pgbouncer-{mode}-"))
        self.port = _free_port()
        self.log = self.root / "pgbouncer.log"
        users = self.root / "userlist.txt"
        users.write_text(f'"{server.username or "postgres"}" ""\n')
        self.ini = self.root / "pgbouncer.ini"
        self.ini.write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host={server.host or '127.0.0.1'} port={server.port or 5432}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {users}",
                    f"pool_mode = {mode}",
                    "max_client_conn = 400",
                    "default_pool_size = 20",
                    # Idle server connections close at once: the shared server has
                    # 100 slots, and the other test processes need theirs.
                    "server_idle_timeout = 1",
                    f"logfile = {self.log}",
                    f"pidfile = {self.root / 'pgbouncer.pid'}",
                    # The tests' admin connections send application_name; PgBouncer
                    # passes it on, and ignores nothing else.
                    "",
                ]
            )
        )
        if self.owner is not None:
            os.chmod(self.root, 0o755)
            for path in (self.root, users, self.ini):
                os.chown(path, self.owner.pw_uid, self.owner.pw_gid)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it and wait until it accepts connections."""
        argv = [self.exe, str(self.ini)]
        if self.owner is not None:
            argv = ["runuser", "-u", SERVER_USER, "--", *argv]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text()[-2000:] if self.log.exists() else ""
                raise RuntimeError(f"pgbouncer did not start ({self.proc.poll()}): {tail}")
            time.sleep(0.05)

    def url(self, database: str, *, pooler: bool = True) -> str:
        """A conveyor URL for ``database`` through this PgBouncer (``?pooler=`` its
        mode unless ``pooler=False``)."""
        query = f"?pooler={self.mode}" if pooler else ""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}{query}"

    def stop(self) -> None:
        """Stop it (SIGTERM to the process it runs as) and delete its folder."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            pid_file = self.root / "pgbouncer.pid"
            # Under runuser, the pgbouncer process is runuser's child: signal it too.
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def spawn_worker(url: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """The worker child on ``url``, its stderr in ``log``."""
    child_env = {
        **os.environ,
        **(env or {}),
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
        ),
        "PYTHONUNBUFFERED": "1",
    }
    with log.open("w") as sink:
        return subprocess.Popen(
            [sys.executable, __file__, "worker", url],
            env=child_env,
            stdout=subprocess.DEVNULL,
            stderr=sink,
            stdin=subprocess.DEVNULL,
            text=True,
        )


def _main(argv: list[str]) -> None:
    role, url = argv
    assert role == "worker"
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    app.run_worker(
        [QUEUE], concurrency=4, poll_interval=0.2, grace=5.0, maintain_interval=1.0, url=url
    )


if __name__ == "__main__":
    _main(sys.argv[1:])
