"""Task functions carry their handler's parameter types: mypy --strict, run as a
subprocess on a sample user module, accepts the right calls and names the wrong ones."""

from __future__ import annotations

import os
import re
import site
import subprocess
import sys
from pathlib import Path

import conveyor

GOOD = """
from sqlalchemy.ext.asyncio import AsyncSession

import conveyor
from conveyor import Context, Task

app = conveyor.App()


@app.task(queue="emails", max_attempts=5)
async def send_email(ctx: Context, to: str, subject: str = "hi") -> dict[str, bool]:
    await ctx.progress(0.5, "rendered")
    return {"sent": ctx.task.attempt > 0}


@app.task
def build_report(ctx: Context, day: str) -> str:
    ctx.progress_sync(0.1)
    return day


@app.periodic(every=60)
@app.task(name="tick")
async def tick(ctx: Context) -> None:
    pass


async def produce(session: AsyncSession) -> Task:
    await send_email.submit(to="a@b.c")
    await send_email.submit("a@b.c", subject="welcome")
    await send_email.with_options(partition="customer-7", key="k").submit(to="x@y.z")
    await send_email.with_options(connection=session).submit(to="in-my-transaction")
    await tick.submit()
    build_report.submit_sync("2026-01-01")
    build_report.with_options(delay=5).submit_sync(day="2026-01-02")
    return await send_email.submit(to="a@b.c")
"""

BAD = """
from user_tasks import build_report, send_email, tick


async def produce() -> None:
    await send_email.submit(to=42)
    await send_email.submit(to="a@b.c", cc="b@c.d")
    await send_email.with_options(delay=1).submit()
    build_report.submit_sync(day=3)
    await tick.submit(1)
"""

#: A call of BAD, and the error mypy must report on its line.
EXPECTED = {
    "submit(to=42)": (
        r'Argument "to" to "submit" of "TaskFunction" has incompatible type "int"; expected "str"'
    ),
    'cc="b@c.d"': r'Unexpected keyword argument "cc" for "submit" of "TaskFunction"',
    "with_options(delay=1)": r'Missing positional argument "to" in call to "submit" of "TaskCall"',
    "submit_sync(day=3)": r'Argument "day" to "submit_sync" of "TaskFunction" .* type "int"',
    "tick.submit(1)": r'Too many arguments for "submit" of "TaskFunction"',
}


def _mypy_env() -> dict[str, str]:
    """The environment for a mypy that checks against this conveyor: its source
    folder on MYPYPATH unless it is installed in site-packages (mypy finds it
    there, and refuses site-packages on MYPYPATH)."""
    env = dict(os.environ)
    source = Path(conveyor.__file__).resolve().parents[1]
    installed = {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]}
    if source not in installed:
        env["MYPYPATH"] = str(source)
    return env


def test_mypy_checks_task_arguments_against_the_handler(tmp_path: Path) -> None:
    (tmp_path / "user_tasks.py").write_text(GOOD)
    (tmp_path / "user_wrong.py").write_text(BAD)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-error-summary",
            "--show-error-codes",
            "--cache-dir",
            str(tmp_path / ".mypy_cache"),
            "user_tasks.py",
            "user_wrong.py",
        ],
        cwd=tmp_path,
        env=_mypy_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert not [line for line in lines if not line.startswith("user_wrong.py:")], done.stdout
    assert done.returncode == 1, done.stdout + done.stderr
    errors = {int(line.split(":")[1]): line for line in lines}
    for call, message in EXPECTED.items():
        (line_number,) = [n for n, code in enumerate(BAD.splitlines(), 1) if call in code]
        assert line_number in errors, f"no error for {call}:\n{done.stdout}"
        assert re.search(message, errors[line_number]), errors[line_number]
    assert len(errors) == len(EXPECTED), done.stdout
