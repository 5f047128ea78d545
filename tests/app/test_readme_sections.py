"""The documentation's sections on living inside an application (docs/guide.md,
found by heading) run as pasted."""

from __future__ import annotations

import os
import subprocess
import sys
import time
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


def plain_pytest(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """Run ``pytest`` in the sample project as a user types it: the project's folder
    is not on ``sys.path`` unless pytest puts it there (``python -m pytest`` and
    pytester's own runs add the current folder, which hides a missing import path)."""
    project = str(pytester.path)
    inherited = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in inherited if p and p != project))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    return pytest.RunResult(
        done.returncode,
        done.stdout.splitlines(),
        done.stderr.splitlines(),
        time.monotonic() - started,
    )


OWN_APP = (
    "import conveyor\napp = conveyor.App()\n"
    "@app.task(name='ping')\nasync def ping(ctx):\n    return 'pong'\n"
)

OWN_APP_TEST = """
import pytest
from myapp.tasks import app, ping

@pytest.mark.asyncio
async def test_ping(conveyor_app, run_tasks):
    assert conveyor_app is app
    await ping.submit()
    assert [t.result for t in (await run_tasks()).succeeded] == ["pong"]
"""


def _testing_project(pytester: pytest.Pytester, conftest_folder: str) -> None:
    """A project with its own app (``myapp/tasks.py``), the README's conftest in
    ``conftest_folder`` and its example test twice (a test defining a task of its
    own on the overridden app, the next one defining it again)."""
    test_file, conftest = blocks("Testing code that enqueues tasks")
    package = pytester.mkpydir("myapp")
    (package / "tasks.py").write_text(OWN_APP)
    tests = pytester.path / conftest_folder
    tests.mkdir(exist_ok=True)
    (tests / "conftest.py").write_text(conftest)
    (tests / "test_signup.py").write_text(test_file)
    (tests / "test_signup_again.py").write_text(test_file)
    (tests / "test_own_app.py").write_text(OWN_APP_TEST)


def test_testing_example_runs(pytester: pytest.Pytester) -> None:
    test_file, _ = blocks("Testing code that enqueues tasks")
    pytester.makepyfile(test_signup=test_file)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    result = plain_pytest(pytester, "-q")
    result.assert_outcomes(passed=1)


def test_testing_recipe_with_the_conftest_beside_the_app(pytester: pytest.Pytester) -> None:
    _testing_project(pytester, ".")
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    result = plain_pytest(pytester, "-q")
    result.assert_outcomes(passed=3)


def test_testing_recipe_with_a_tests_folder(pytester: pytest.Pytester) -> None:
    _testing_project(pytester, "tests")
    (settings,) = blocks("Testing code that enqueues tasks", "toml")
    assert settings.startswith("# pyproject.toml")
    (pytester.path / "pyproject.toml").write_text(settings)
    result = plain_pytest(pytester, "-q")
    assert "ModuleNotFoundError" not in result.stdout.str(), result.stdout.str()
    result.assert_outcomes(passed=3)
