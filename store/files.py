"""The store's files on disk: which they are, and kept private (0600).

A store is the SQLite database at store.path and SQLite's `-wal` and `-shm` beside it. They hold
full rows (phone numbers, addresses), so they are created 0600; SQLite gives `-wal` and `-shm`
the database file's mode, so creating that one private is enough for them.
"""

from __future__ import annotations

import os
from pathlib import Path

from oncewatch.store.errors import StoreError

MEMORY = ":memory:"
SIDECARS = ("-wal", "-shm")
PRIVATE = 0o600


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


def make_dir(path: str) -> None:
    """The store's directory, made when missing."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot make the store's directory {Path(path).parent} ({exc.strerror}); "
                         f"check store.path") from exc


def create_private(path: str) -> int:
    """A new file at `path`, 0600 (a umask can take more away, never add); FileExistsError if there is one."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, PRIVATE)
