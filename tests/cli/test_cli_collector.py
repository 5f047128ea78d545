"""The CLI and the garbage collector: what a command line imports is frozen out of
the collector's walks (``gc.freeze()``), once the first store is open and when
the command ends, and the collector is left as the command found it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import conveyor


def _python(script: str, cwd: Path, *args: str) -> list[str]:
    """The lines ``script`` prints on stderr, run in a fresh interpreter."""
    env = {k: v for k, v in os.environ.items() if k not in ("CONVEYOR_URL", "CONVEYOR_APP")}
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr.splitlines()


# Run at exit, before the interpreter's last collection: how much main() froze.
_AT_EXIT = (
    "import atexit, gc, sys\n"
    "atexit.register(lambda: print('frozen', gc.get_freeze_count(), file=sys.stderr))\n"
    "sys.argv = ['conveyor', *sys.argv[1:]]\n"
    "from conveyor.cli import main\n"
    "main()\n"
)


def test_a_command_line_ends_with_its_objects_frozen(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with conveyor.connect_sync(url) as store:
        store.submit("t", queue="q")
    for args in (("--help",), ("stats", "--url", url)):
        (line,) = _python(_AT_EXIT, tmp_path, *args)
        name, count = line.split()
        assert name == "frozen" and int(count) > 10_000, (args, line)


def test_the_first_open_freezes_the_store_it_imported(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with conveyor.connect_sync(url) as store:
        store.submit("t", queue="q")
    script = (
        "import gc, sys\n"
        "from conveyor.cli._common import open_store\n"
        "before = gc.get_freeze_count()\n"
        "for _ in range(2):\n"
        "    with open_store(sys.argv[1], create=False) as store:\n"
        "        print('open', gc.isenabled(), gc.get_freeze_count(), file=sys.stderr)\n"
        "        assert store.stats() != []\n"
        "print('before', before, 'after', gc.isenabled(), file=sys.stderr)\n"
    )
    first, second, last = _python(script, tmp_path, url)
    assert last == "before 0 after True"
    _, collecting, frozen = first.split()
    # SQLAlchemy, aiosqlite and the store were imported with the collector paused,
    # then frozen; the collector runs again while the command works.
    assert collecting == "True" and int(frozen) > 10_000
    # Once per process: a second open freezes nothing more (garbage made in
    # between is left to the collector; frozen objects freed by their last
    # reference leave the count).
    _, collecting, frozen_again = second.split()
    assert collecting == "True" and int(frozen_again) <= int(frozen)


def test_a_collector_turned_off_stays_off(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with conveyor.connect_sync(url) as store:
        store.submit("t", queue="q")
    script = (
        "import gc, sys\n"
        "gc.disable()\n"
        "from conveyor.cli._common import open_store\n"
        "with open_store(sys.argv[1], create=False):\n"
        "    pass\n"
        "print(gc.isenabled(), gc.get_freeze_count(), file=sys.stderr)\n"
    )
    assert _python(script, tmp_path, url) == ["False 0"]
