"""The processes below a process, from Linux's /proc: the dashboard's launcher asks which of them holds its port
(oncewatch.dashboards.launch), the benches sum what they use (bench/processes.py)."""

from __future__ import annotations

import os


def parent_of(pid: int) -> int:
    """The parent's pid of a live process; OSError once it has ended."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rpartition(")")[2].split()[1])


def descendants(pid: int) -> set[int]:
    """Every process below `pid` now, its children and theirs; OSError where there is no /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                children.setdefault(parent_of(int(entry)), []).append(int(entry))
            except (OSError, IndexError, ValueError):
                continue  # a process that ended meanwhile
    found: set[int] = set()
    todo = list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        found.add(child)
        todo.extend(children.get(child, ()))
    return found


__all__ = ["descendants", "parent_of"]
