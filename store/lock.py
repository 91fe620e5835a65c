"""One monitor per store: an exclusive lock on `<store>.lock`, held for as long as the monitor runs.

Two monitors on one store both commit the same records and one dies later on an IntegrityError;
the lock refuses the second at start instead. It is flock(2) on a file of its own, not one of
SQLite's locks, so that readers (the dashboard, /metrics, `oncewatch findings|export`) and a
person's short reviews (`ack`, `close`) go on beside the monitor, and so that the kernel drops
it when the process ends, however it ends: a kill -9 leaves no stale lock to clean up. The
holder writes its pid into the file for the refusal's message. The file stays when the lock is
given up; deleting it while a monitor runs would let a second one lock a new file.
"""

from __future__ import annotations

import fcntl
import os

from oncewatch.store.errors import StoreError, StoreLockedError
from oncewatch.store.files import LOCK, create_private, said_full


class MonitorLock:
    """The held lock; `release()` (or the end of the process) gives it up."""

    def __init__(self, fd: int):
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, store_path: str) -> MonitorLock:
        """The lock of the store at `store_path`, or StoreLockedError naming the store and the holder's pid."""
        path = store_path + LOCK
        try:
            with said_full(store_path):
                fd = _open(path)
        except OSError as exc:
            raise StoreError(f"cannot open the lock file {path} ({exc.strerror}): the monitor needs to create "
                             f"and write files in the store's directory") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise StoreLockedError(
                f"another oncewatch monitor{f' (pid {holder})' if holder else ''} is running on the store "
                f"{store_path} (it holds {path}): stop it first, or give this monitor a store of its own. "
                f"The dashboard, `findings`, `export`, `ack` and `close` work beside it") from None
        try:
            with said_full(store_path):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _open(path: str) -> int:
    try:
        return create_private(path)
    except FileExistsError:
        return os.open(path, os.O_RDWR)


def _holder(fd: int) -> int | None:
    """The pid the holder wrote, if it has written it yet."""
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None
