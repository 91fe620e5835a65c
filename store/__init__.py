"""The store box: the monitor's own memory, and the only code that touches its database.

It owns the schema (store.schema), every write (store.batch: one transaction per batch of input,
checkpoints included), the engine's open state (store.engine_state) and every read the pages,
/metrics, the CLI and the exports make (store.store, store.queries), and which files on disk are
the store's (store.files).
"""

from oncewatch.store.batch import Batch
from oncewatch.store.files import is_store_file
from oncewatch.store.schema import StoreError
from oncewatch.store.store import Store, open_reader, open_writer

__all__ = ["Batch", "Store", "StoreError", "is_store_file", "open_reader", "open_writer"]
