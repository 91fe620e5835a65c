"""The store's files on disk: which they are, and kept private (0600).

A store is the SQLite database at store.path, SQLite's `-wal` and `-shm` beside it, and the
monitor's `.lock` (store.lock). They hold full rows (phone numbers, addresses), so they are
created 0600; SQLite gives `-wal` and `-shm` the database file's mode, so creating that one
private is enough for them.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from oncewatch.store.errors import StoreError

log = logging.getLogger("oncewatch.store")

MEMORY = ":memory:"
LOCK = ".lock"
SIDECARS = ("-wal", "-shm", LOCK)
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


def make_private(path: str) -> None:
    """Takes group and other access away from the store's files (a store made before they were 0600)."""
    for name in store_files(path):
        try:
            mode = stat.S_IMODE(os.stat(name).st_mode)
        except FileNotFoundError:
            continue
        if mode & 0o077:
            try:
                os.chmod(name, mode & PRIVATE)
            except PermissionError as exc:
                raise StoreError(f"{name} is open to other users and this user cannot change that: run "
                                 f"`chmod 600 {name}` as its owner") from exc
            log.warning("store file was open to other users; made private",
                        extra={"event": "store_mode_fixed", "path": name, "was": oct(mode), "now": oct(mode & PRIVATE)})
