"""The store's files on disk: which they are, kept private (0600), and a full disk told as such.

A store is the SQLite database at store.path, SQLite's `-wal` and `-shm` beside it, and the
monitor's `.lock` (store.lock). They hold full rows (phone numbers, addresses), so they are
created 0600; SQLite gives `-wal` and `-shm` the database file's mode, so creating that one
private is enough for them.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from oncewatch.store.errors import StoreError, StoreFullError

log = logging.getLogger("oncewatch.store")

MEMORY = ":memory:"
LOCK = ".lock"
SIDECARS = ("-wal", "-shm", LOCK)
PRIVATE = 0o600
# Below this much free space the monitor does not start: its first batches need more than that
# in the WAL, so it would only fail a few seconds later, after it had connected to the sources.
MIN_FREE_BYTES = 1 << 20
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def store_files(path: str) -> tuple[str, ...]:
    """The database and every file beside it that belongs to it."""
    return (path, *(path + suffix for suffix in SIDECARS))


def is_store_file(candidate: str, path: object) -> bool:
    """True when `candidate` names one of the store's files (by another name too: a link, `..`); a store
    in PostgreSQL has none."""
    if not isinstance(path, str) or path == MEMORY:
        return False
    target = Path(candidate).resolve()
    for own in store_files(path):
        if target == Path(own).resolve() or (target.exists() and Path(own).exists()
                                             and os.path.samefile(target, own)):
            return True
    return False


def free_bytes(path: str) -> int:
    return shutil.disk_usage(Path(path).parent).free


def require_space(path: str) -> None:
    """StoreFullError unless the store's filesystem has MIN_FREE_BYTES free."""
    free = free_bytes(path)
    if free < MIN_FREE_BYTES:
        raise StoreFullError(path, f"{free} bytes free, the monitor needs at least {MIN_FREE_BYTES}")


@contextmanager
def said_full(path: str) -> Iterator[None]:
    """A full disk met inside the block becomes StoreFullError naming the store. SQLite says
    SQLITE_FULL when a write finds no room, but only "disk I/O error" when it cannot grow its
    `-shm` (even to read), so an I/O error on a filesystem with (almost) no room left counts too."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        code = exc.sqlite_errorcode & 0xFF
        if code == sqlite3.SQLITE_FULL or (code == sqlite3.SQLITE_IOERR and free_bytes(path) < MIN_FREE_BYTES):
            raise StoreFullError(path, f"SQLite: {exc}") from exc
        raise
    except OSError as exc:
        if exc.errno in _NO_SPACE:
            raise StoreFullError(path, exc.strerror or "no space left") from exc
        raise


def make_dir(path: str) -> None:
    """The store's directory, made when missing."""
    try:
        with said_full(path):
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
