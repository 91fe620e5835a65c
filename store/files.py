"""The store's files on disk: which they are.

A store is the SQLite database at store.path and SQLite's `-wal` and `-shm` beside it.
"""

from __future__ import annotations

import os
from pathlib import Path

MEMORY = ":memory:"
SIDECARS = ("-wal", "-shm")


def store_files(path: str) -> tuple[str, ...]:
    """The database and every file beside it that belongs to it."""
    return (path, *(path + suffix for suffix in SIDECARS))


def is_store_file(candidate: str, path: str) -> bool:
    """True when `candidate` names one of the store's files (by another name too: a link, `..`)."""
    if path == MEMORY:
        return False
    target = Path(candidate).resolve()
    for own in store_files(path):
        if target == Path(own).resolve() or (target.exists() and Path(own).exists()
                                             and os.path.samefile(target, own)):
            return True
    return False
