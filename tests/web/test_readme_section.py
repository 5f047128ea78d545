"""The README's "Dashboard, metrics and traces" commands name real options (its
Python blocks run in tests/test_readme.py)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "Dashboard, metrics and traces"


def blocks(language: str) -> list[str]:
    text = README.read_text()
    start = text.index(f"\n## {SECTION}\n")
    end = text.find("\n## ", start + 1)
    return re.findall(rf"```{language}\n(.*?)```", text[start:end], flags=re.S)


def test_shell_lines_name_real_commands_and_options() -> None:
    from typer.main import get_command

    from conveyor.cli import cli

    root = get_command(cli)
    for block in blocks("bash"):
        for line in block.splitlines():
            if not line.startswith("conveyor "):
                continue
            name = line.split()[1]
            command = root.commands[name]  # type: ignore[attr-defined]
            known = {opt for p in command.params for opt in p.opts}
            for word in line.split("#")[0].split()[2:]:
                if word.startswith("--"):
                    assert word in known, f"{name} has no option {word}"
