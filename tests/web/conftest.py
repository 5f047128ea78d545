"""The dashboard's tests need the ``web`` extra (and httpx from ``dev``): without
them these modules are not collected."""

from __future__ import annotations

import importlib.util

_NEEDED = ("starlette", "jinja2", "uvicorn", "httpx")

collect_ignore = (
    []
    if all(importlib.util.find_spec(name) is not None for name in _NEEDED)
    else [
        "test_dashboard.py",
        "test_dashboard_bulk.py",
        "test_dashboard_groups.py",
        "test_browser.py",
        "test_browser_bulk.py",
    ]
)
