"""What can be wrong with a store file, as exceptions whose messages name the file and say what to do.

The CLI maps them to its exit codes: a full disk has its own (4), the others are a wrong
store.path or usage (2).
"""

from __future__ import annotations

import time


class StoreError(RuntimeError):
    """The store file cannot be opened or written; the message names the file."""


class NotAStoreError(StoreError):
    """The file at store.path is empty or is not an oncewatch store; it is left as it is."""


class StoreLockedError(StoreError):
    """Another monitor holds the store: one monitor writes a store (readers need no lock)."""


class StoreUnavailableError(StoreError):
    """The store's server (PostgreSQL) cannot be reached: what was committed is kept there, and the
    monitor starts again from its checkpoint once it answers. `at`: when it was found away, which is when the
    outage began, however long the monitor then takes to stop its readers."""

    def __init__(self, *args: object):
        super().__init__(*args)
        self.at = time.time()


class StoreFullError(StoreError):
    """The filesystem holding the store has no room left for it; what was committed is kept."""

    def __init__(self, path: str, detail: str):
        super().__init__(f"the disk holding the store {path} is full ({detail}). Free space on that filesystem "
                         f"(or move the store and store.path to a larger one), then start again: everything "
                         f"committed is kept, and the monitor resumes from its checkpoint")
        self.path = path
