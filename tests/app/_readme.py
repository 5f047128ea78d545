"""The README's code blocks, by section (shared by the tests that run them)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def blocks(section: str, language: str = "python") -> list[str]:
    """The ``language`` code blocks of the README section titled ``section``."""
    text = README.read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start : end if end != -1 else len(text)]
    return re.findall(rf"```{language}\n(.*?)```", body, flags=re.S)
