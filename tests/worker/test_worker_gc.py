"""The worker settles the garbage collector once per process at its first start;
opening a store leaves the collector alone unless asked (``gc_freeze=True``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import conveyor
from conveyor import App, InvalidArgument

SCRIPT = """
import asyncio, gc, json, sys
import conveyor

freeze = sys.argv[2] == "on"
app = conveyor.App(sys.argv[1])  # the store's default: it leaves the collector alone
seen = []


@app.task(name="probe", queue="gc")
async def probe(ctx):
    seen.append(gc.get_freeze_count())


async def main():
    async with app:
        for _ in range(2):  # two workers, one after the other, in one process
            await probe.submit()
            worker = app.worker("gc", gc_freeze=freeze, maintain_interval=None)
            worker.stop_when_idle = True
            await worker.run()
    print(json.dumps(seen))


asyncio.run(main())
"""


def run_script(script: str, url: str, option: str) -> list[int]:
    """The freeze counts ``script`` prints, run in a process of its own: the
    freeze is once per process, and this one's collector must not depend on
    which tests ran before."""
    out = subprocess.run(
        [sys.executable, "-c", script, url, option],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    counts: list[int] = json.loads(out.stdout.strip().splitlines()[-1])
    return counts


def frozen_counts(tmp_path: Path, freeze: str) -> list[int]:
    return run_script(SCRIPT, f"sqlite:///{tmp_path / f'gc-{freeze}.sqlite'}", freeze)


def test_a_worker_freezes_what_is_alive_once_per_process(tmp_path: Path) -> None:
    first, second = frozen_counts(tmp_path, "on")
    # The modules, the app and the store: thousands of objects, frozen by the first
    # start (the store, opened before it, froze nothing).
    assert first > 1_000
    # The second worker of the process froze nothing more, so its garbage stays
    # collectable (frozen objects freed by their reference count leave the count).
    assert second <= first


def test_gc_freeze_false_leaves_the_collector_alone(tmp_path: Path) -> None:
    assert frozen_counts(tmp_path, "off") == [0, 0]


def test_gc_freeze_must_be_a_bool() -> None:
    app = App("sqlite:///:memory:")
    with pytest.raises(InvalidArgument, match="gc_freeze"):
        app.worker("gc", gc_freeze="yes")  # type: ignore[arg-type]


STORE_SCRIPT = """
import asyncio, gc, json, sys
import conveyor

async def main():
    counts = [gc.get_freeze_count()]
    options = {"default": {}, "on": {"gc_freeze": True}, "off": {"gc_freeze": False}}[sys.argv[2]]
    async with conveyor.connect(sys.argv[1], **options) as store:
        counts.append(gc.get_freeze_count())
        await store.submit("x")
    print(json.dumps(counts))

asyncio.run(main())
"""


@pytest.mark.parametrize("option", ["default", "off"])
def test_opening_a_store_leaves_the_collector_alone(tmp_path: Path, option: str) -> None:
    """A process that only opens a store (a web app submitting tasks, say) keeps
    its garbage collector as it was: nothing frozen by default or with False."""
    url = f"sqlite:///{tmp_path / 'store-gc.sqlite'}"
    before, after = run_script(STORE_SCRIPT, url, option)
    assert before == 0
    assert after == before


def test_gc_freeze_true_settles_the_collector_at_open(tmp_path: Path) -> None:
    """Asked for, the store's open settles the collector as a worker's start does."""
    url = f"sqlite:///{tmp_path / 'store-gc.sqlite'}"
    before, after = run_script(STORE_SCRIPT, url, "on")
    assert before == 0
    assert after > 1_000  # the modules, SQLAlchemy, the driver, the store


def test_the_store_option_must_be_a_bool() -> None:
    with pytest.raises(InvalidArgument, match="gc_freeze"):
        conveyor.connect("sqlite:///:memory:", gc_freeze="yes")
