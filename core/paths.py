"""Dotted paths into a JSON document (`a.b.0.c`: list items by index), shared by the Kafka
parser (which values an event carries) and the rules (which parts of a payload F9 compares)."""

from __future__ import annotations

import copy
from typing import Any

Path = tuple[str | int, ...]


def compile_path(path: str) -> Path:
    return tuple(int(p) if p.isdigit() else p for p in path.split("."))


def lookup(doc: Any, path: Path) -> Any:
    """The value at a compiled dotted path, or None when there is none (a JSON null counts as missing)."""
    for part in path:
        if isinstance(doc, dict):
            doc = doc.get(part if isinstance(part, str) else str(part))
        elif isinstance(doc, list) and isinstance(part, int) and part < len(doc):
            doc = doc[part]
        else:
            return None
        if doc is None:
            return None
    return doc


def without(doc: Any, paths: tuple[Path, ...]) -> Any:
    """A copy of `doc` with the values at `paths` taken out (paths that lead nowhere change nothing)."""
    out = copy.deepcopy(doc)
    for path in paths:
        parent = lookup(out, path[:-1]) if len(path) > 1 else out
        last = path[-1]
        if isinstance(parent, dict):
            parent.pop(last if isinstance(last, str) else str(last), None)
        elif isinstance(parent, list) and isinstance(last, int) and last < len(parent):
            parent[last] = None
    return out


__all__ = ["Path", "compile_path", "lookup", "without"]
