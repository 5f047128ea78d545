"""The dashboard's tests need the ``web`` extra (and httpx from ``dev``): without
them these modules are not collected."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_NEEDED = ("starlette", "jinja2", "uvicorn", "httpx")

collect_ignore = (
    []
    if all(importlib.util.find_spec(name) is not None for name in _NEEDED)
    else sorted(
        path.name
        for path in Path(__file__).parent.glob("test_*.py")
        if path.name.startswith(("test_dashboard", "test_browser"))
    )
)
