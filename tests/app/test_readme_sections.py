"""The documentation's sections on living inside an application (docs/guide.md,
found by heading) run as pasted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _readme import blocks

pytest_plugins = ["pytester"]


def test_periodic_tasks_example_runs(tmp_path: Path) -> None:
    (code,) = blocks("Periodic tasks")
    package = tmp_path / "myapp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "periodic.py").write_text(code)
    check = (
        "from myapp.periodic import app; "
        "assert sorted(app.schedules) == "
        "['myapp.periodic.nightly_report', 'myapp.periodic.sweep', 'rollup-eu', 'rollup-us']"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("section", ["Periodic tasks"])
def test_shell_lines_name_real_commands(section: str) -> None:
    from conveyor.cli import cli

    commands = {
        c.name or (c.callback.__name__ if c.callback else "") for c in cli.registered_commands
    }
    for block in blocks(section, "bash"):
        for line in block.splitlines():
            if line.startswith("conveyor "):
                assert line.split()[1] in commands, line


def test_testing_example_runs(pytester: pytest.Pytester) -> None:
    test_file, conftest = blocks("Testing code that enqueues tasks")
    pytester.makepyfile(test_signup=test_file)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    result = pytester.runpytest_subprocess("-q")
    result.assert_outcomes(passed=1)
    # The conftest that points an application's own app at the test database.
    package = pytester.mkpydir("myapp")
    (package / "tasks.py").write_text(
        "import conveyor\napp = conveyor.App()\n"
        "@app.task(name='ping')\nasync def ping(ctx):\n    return 'pong'\n"
    )
    pytester.makeconftest(conftest)
    pytester.makepyfile(
        test_own_app="""
import pytest
from myapp.tasks import ping

@pytest.mark.asyncio
async def test_ping(conveyor_app, run_tasks):
    await ping.submit()
    assert [t.result for t in (await run_tasks()).succeeded] == ["pong"]
"""
    )
    result = pytester.runpytest_subprocess("-q", "test_own_app.py")
    result.assert_outcomes(passed=1)
