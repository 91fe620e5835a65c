"""The engine's open state in the store, saved as deltas, and the cold tier of its spilled spaces.

Writing the whole state at every checkpoint costs seconds once it holds a day of open
entries; the engine instead hands over what was put and what went since the last save
(`Engine.state_delta`). Entries live one row each in `engine_entries`, the rest (version,
counters, findings not yet drained) in the `state` table, all inside the caller's store
transaction so they move together with the checkpoints.

Because every entry is in `engine_entries` after a save, the spaces the engine only looks up
by key need not stay whole in memory: `ColdEntries` reads a missed key back from there and
drops entries by age, on the writer's own connection, so inside its transaction
(checks.horizon explains the spilling).
"""

from __future__ import annotations

from typing import Any

from oncewatch.core.exact_json import from_json, to_json
from oncewatch.store.batch import Batch
from oncewatch.store.packing import ENGINE
from oncewatch.store.store import Store

HEAD = "engine_head"
ENTRIES_PER_STATEMENT = 50


def _names(shard: int | None) -> tuple[str, str]:
    """(the head's name, the prefix of the spaces' names) of one engine: the monitor's, or a group's shard's."""
    return (HEAD, "") if shard is None else (f"{HEAD}/shard/{shard}", f"shard/{shard}/")


def save(tx: Batch, delta: dict[str, Any], shard: int | None = None) -> None:
    """Apply one `state_delta()` inside the caller's store transaction (`shard`: a group's shard's engine)."""
    head, prefix = _names(shard)
    for name, change in delta["changes"].items():
        space = prefix + name
        if change["full"]:
            tx.conn.execute("DELETE FROM engine_entries WHERE space = ?", (space,))
        # many rows to a statement: PostgreSQL runs an executemany one statement a row
        tx.insert_rows("INSERT INTO engine_entries (space, key, at, value) VALUES ", "(?, ?, ?, ?)",
                       ENTRIES_PER_STATEMENT,
                       [(space, to_json(k), t, tx.packer.pack(ENGINE, to_json(v, sort_keys=False)))
                        for k, t, v in change["put"]],
                       " ON CONFLICT(space, key) DO UPDATE SET at = excluded.at, value = excluded.value")
        gone = [to_json(k) for k in change["gone"]]
        for i in range(0, len(gone), ENTRIES_PER_STATEMENT):
            chunk = gone[i:i + ENTRIES_PER_STATEMENT]
            tx.conn.execute(f"DELETE FROM engine_entries WHERE space = ? AND key IN ({','.join('?' * len(chunk))})",
                            (space, *chunk))
    tx.set_state(head, {k: v for k, v in delta.items() if k != "changes"})


def load(store: Store, hot: dict[str, int] | None = None, shard: int | None = None) -> dict[str, Any] | None:
    """The state to `Engine.restore`, or None when nothing was saved yet. `hot` (`memory.hot_limits()`):
    of those spaces only the newest entries are read, the rest counted under "cold"."""
    name, prefix = _names(shard)
    head = store.state(name)
    if head is None:
        return None
    hot = hot or {}
    entries: dict[str, list[list[Any]]] = {}
    cold: dict[str, int] = {}
    for kind in head.get("dropped", {}):  # every space saved
        space = prefix + kind
        if kind in hot:
            rows = store.conn.execute("SELECT key, at, value FROM engine_entries WHERE space = ? "
                                      "ORDER BY at DESC LIMIT ?", (space, hot[kind])).fetchall()
            (total,), = store.conn.execute("SELECT COUNT(*) FROM engine_entries WHERE space = ?", (space,))
            cold[kind] = total - len(rows)
        else:
            rows = store.conn.execute("SELECT key, at, value FROM engine_entries WHERE space = ?", (space,))
        entries[kind] = [[from_json(key), at, from_json(store.packer.unpack(value))] for key, at, value in rows]
    return {**head, "entries": entries, **({"cold": cold} if cold else {})}


class ColdEntries:
    """checks.horizon.Cold over `engine_entries`."""

    def __init__(self, store: Store):
        self.conn = store.conn
        self.unpack = store.packer.unpack

    def get(self, space: str, key: str) -> tuple[float, Any] | None:
        row = self.conn.execute("SELECT at, value FROM engine_entries WHERE space = ? AND key = ?",
                                (space, to_json(key))).fetchone()
        return None if row is None else (row[0], from_json(self.unpack(row[1])))

    def drop_before(self, space: str, cutoff: float) -> list[str]:
        return self._keys(self.conn.execute("DELETE FROM engine_entries WHERE space = ? AND at < ? RETURNING key",
                                            (space, cutoff)))

    def drop_oldest(self, space: str, n: int) -> list[str]:
        return self._keys(self.conn.execute(
            "DELETE FROM engine_entries WHERE space = ? AND key IN (SELECT key FROM engine_entries WHERE space = ? "
            "ORDER BY at LIMIT ?) RETURNING key", (space, space, n)))

    def drop_all(self, space: str) -> None:
        self.conn.execute("DELETE FROM engine_entries WHERE space = ?", (space,))

    def keys(self, space: str) -> list[str]:
        return self._keys(self.conn.execute("SELECT key FROM engine_entries WHERE space = ?", (space,)))

    @staticmethod
    def _keys(cursor: Any) -> list[str]:
        return [from_json(key) for (key,) in cursor.fetchall()]
