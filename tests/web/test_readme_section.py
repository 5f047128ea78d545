"""The "Dashboard, metrics and traces" section's commands (docs/guide.md, found by
its heading) name real options (its Python blocks run in tests/test_readme.py)."""

from __future__ import annotations

from _docs import blocks

SECTION = "Dashboard, metrics and traces"


def test_shell_lines_name_real_commands_and_options() -> None:
    from typer.main import get_command

    from conveyor.cli import cli

    root = get_command(cli)
    lines = [line for block in blocks(SECTION, "bash") for line in block.splitlines()]
    assert any(line.startswith("conveyor dashboard") for line in lines)
    for line in lines:
        if not line.startswith("conveyor "):
            continue
        name = line.split()[1]
        command = root.commands[name]  # type: ignore[attr-defined]
        known = {opt for p in command.params for opt in p.opts}
        for word in line.split("#")[0].split()[2:]:
            if word.startswith("--"):
                assert word in known, f"{name} has no option {word}"
