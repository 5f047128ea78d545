"""``conveyor worker`` on an app whose module fails to import shows the user's
own traceback (trimmed to their frames), then one error line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from conveyor.cli import run

EXIT_USAGE = 2


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CONVEYOR_URL", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_an_import_error_inside_the_users_module_shows_their_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    package = tmp_path / "brokenapp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text("import not_installed_anywhere  # a missing dependency\n")
    (package / "tasks.py").write_text(
        textwrap.dedent(
            """
            import conveyor
            from brokenapp import helpers

            app = conveyor.App()
            """
        )
    )
    assert run(["worker", "brokenapp.tasks:app"]) == EXIT_USAGE
    error = capsys.readouterr().err
    assert "Traceback" in error
    assert str(package / "tasks.py") in error and "from brokenapp import helpers" in error
    assert str(package / "helpers.py") in error and "import not_installed_anywhere" in error
    assert "importlib" not in error and "conveyor/cli" not in error
    last = error.strip().splitlines()[-1]
    assert last.startswith("error: cannot load 'brokenapp.tasks:app'")
    assert "not_installed_anywhere" in last


def test_a_module_that_is_not_there_gets_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["worker", "nowhere_to_be_found:app"]) == EXIT_USAGE
    error = capsys.readouterr().err
    assert "Traceback" not in error
    assert error.count("\n") == 1 and "nowhere_to_be_found" in error
