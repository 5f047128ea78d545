"""Alembic migrations for the conveyor schema, shipped inside the package so that
opening a store (or ``conveyor migrate``) works from an installed wheel."""

from __future__ import annotations

from pathlib import Path

SCRIPT_LOCATION = str(Path(__file__).parent)
VERSION_TABLE = "conveyor_alembic_version"
