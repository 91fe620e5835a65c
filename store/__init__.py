"""The store box: the monitor's own memory, and the only code that touches its database.

It owns the schema (store.schema), every write (store.batch: one transaction per batch of input,
checkpoints included), the engine's open state (store.engine_state), retention (store.retention),
every read the pages, /metrics, the CLI and the exports make (store.store, store.queries), and
the store's files on disk: their modes, the monitor's lock and a full disk (store.files,
store.lock, store.errors), and the same in a shared PostgreSQL database (store.postgres,
store.dialect).
"""

from oncewatch.store.batch import Batch
from oncewatch.store.errors import NotAStoreError, StoreError, StoreFullError, StoreLockedError, StoreUnavailableError
from oncewatch.store.files import is_store_file
from oncewatch.store.store import Store, open_monitor, open_reader, open_writer

__all__ = ["Batch", "NotAStoreError", "Store", "StoreError", "StoreFullError", "StoreLockedError",
           "StoreUnavailableError", "is_store_file", "open_monitor", "open_reader", "open_writer"]
