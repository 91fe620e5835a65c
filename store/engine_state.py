"""The engine's open state in the store, saved as deltas.

Writing the whole state at every checkpoint costs seconds once it holds a day of open
entries; the engine instead hands over what was put and what went since the last save
(`Engine.state_delta`). Entries live one row each in `engine_entries`, the rest (version,
counters, findings not yet drained) in the `state` table, all inside the caller's store
transaction so they move together with the checkpoints.
"""

from __future__ import annotations

from typing import Any

from oncewatch.core.exact_json import from_json, to_json
from oncewatch.store.batch import Batch
from oncewatch.store.store import Store

HEAD = "engine_head"


def save(tx: Batch, delta: dict[str, Any]) -> None:
    """Apply one `state_delta()` inside the caller's store transaction."""
    for space, change in delta["changes"].items():
        if change["full"]:
            tx.conn.execute("DELETE FROM engine_entries WHERE space = ?", (space,))
        tx.conn.executemany("INSERT INTO engine_entries (space, key, at, value) VALUES (?, ?, ?, ?) "
                            "ON CONFLICT(space, key) DO UPDATE SET at = excluded.at, value = excluded.value",
                            [(space, to_json(k), t, to_json(v)) for k, t, v in change["put"]])
        tx.conn.executemany("DELETE FROM engine_entries WHERE space = ? AND key = ?",
                            [(space, to_json(k)) for k in change["gone"]])
    tx.set_state(HEAD, {k: v for k, v in delta.items() if k != "changes"})


def load(store: Store) -> dict[str, Any] | None:
    """The full state (`Engine.restore` input), or None when nothing was saved yet."""
    head = store.state(HEAD)
    if head is None:
        return None
    entries: dict[str, list[list[Any]]] = {}
    for space, key, at, value in store.conn.execute("SELECT space, key, at, value FROM engine_entries"):
        entries.setdefault(space, []).append([from_json(key), at, from_json(value)])
    spaces = head.get("dropped", {}).keys()
    return {**head, "entries": {space: entries.get(space, []) for space in spaces | entries.keys()}}
