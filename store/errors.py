"""What can be wrong with a store file, as exceptions whose messages name the file and say what to do.

The CLI says them with its exit code 2: a store.path it cannot use.
"""

from __future__ import annotations


class StoreError(RuntimeError):
    """The store file cannot be opened or written; the message names the file."""


class NotAStoreError(StoreError):
    """The file at store.path is empty or is not an oncewatch store; it is left as it is."""


class StoreLockedError(StoreError):
    """Another monitor holds the store: one monitor writes a store (readers need no lock)."""

