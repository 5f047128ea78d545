"""Fold a py-spy ``--format raw`` profile into self time per function and per area.

    python -m benchmarks.selftime worker.txt [--top 25]

Areas: conveyor's worker (worker, feed, acks, context, logs), conveyor's store,
SQLAlchemy, the driver (psycopg, aiosqlite, sqlite3), asyncio, and the rest.
Imports and the queueing of the tasks (``prefill``) are left out.
"""

from __future__ import annotations

import argparse
import collections

AREAS = [
    (
        "conveyor worker",
        (
            "conveyor/worker",
            "conveyor/feed",
            "conveyor/acks",
            "conveyor/context",
            "conveyor/logs",
            "conveyor/registry",
            "conveyor/outcomes",
        ),
    ),
    (
        "conveyor store",
        ("conveyor/store", "conveyor/statements", "conveyor/_values", "conveyor/models"),
    ),
    ("sqlalchemy", ("sqlalchemy/",)),
    ("driver", ("psycopg", "aiosqlite", "sqlite3", "asyncpg")),
    ("asyncio", ("asyncio/", "selectors", "greenlet")),
]


def area_of(frame: str) -> str:
    for name, marks in AREAS:
        if any(mark in frame for mark in marks):
            return name
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--within", help="only stacks with a frame containing this (e.g. Worker.run)"
    )
    args = parser.parse_args()
    by_func: collections.Counter[str] = collections.Counter()
    by_area: collections.Counter[str] = collections.Counter()
    total = 0
    with open(args.path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            n = int(count)
            if "_find_and_load" in stack or "prefill" in stack:
                continue  # imports and setting up are not the work measured
            if args.within and args.within not in stack:
                continue
            frames = stack.split(";")
            leaf = frames[-1]
            total += n
            by_func[leaf] += n
            # Self time goes to the innermost frame that is Python code of a known area.
            for frame in reversed(frames):
                area = area_of(frame)
                if area != "other":
                    by_area[area] += n
                    break
            else:
                by_area["other"] += n
    print(f"{total} samples")
    for area, n in by_area.most_common():
        print(f"  {area:<18}{n / total:6.1%}")
    print("self time by function:")
    for func, n in by_func.most_common(args.top):
        print(f"  {n / total:6.1%}  {func}")


if __name__ == "__main__":
    main()
