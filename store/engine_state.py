"""The engine's open state in the store, saved as deltas, and the cold tier of its spilled spaces.

Writing the whole state at every checkpoint costs seconds once it holds a day of open
entries; the engine instead hands over what was put and what went since the last save
(`Engine.state_delta`). Entries live one row each in `open_state`, the rest (version,
counters, findings not yet drained) in the `state` table, all inside the caller's store
transaction so they move together with the checkpoints.

Because every entry is in `open_state` after a save, the spaces the engine only looks up
by key need not stay whole in memory: `ColdEntries` reads a missed key back from there and
drops entries by age, on the writer's own connection, so inside its transaction
(checks.horizon explains the spilling).

A row holds its space's number (`open_state_spaces`, store.numbered), and the engine's key cut after its last
separator: the number of the part up to there (`open_state_prefixes`: an announced key's topic and event type, an
effect's table) and the rest. The space's name and the key as JSON text in every row took 41 bytes more a record
read, the keys' prefixes 40 more, each twice with the index by age (issue 47). Stores made before kept them in
`engine_entries`, then with the keys whole in `open_state`; their first writer of this version moves them
(`move_old_entries`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from oncewatch.core.exact_json import from_json, to_json
from oncewatch.store.dialect import Connection
from oncewatch.store.numbered import Numbered, prefix_and_rest
from oncewatch.store.packing import ENGINE, as_bytes
from oncewatch.store.schema import aside, move_rows

if TYPE_CHECKING:
    from oncewatch.store.batch import Batch
    from oncewatch.store.entities import InsertRows
    from oncewatch.store.store import Store

HEAD = "engine_head"
ENTRIES_PER_STATEMENT = 50
OLD_TABLES = ("engine_entries",  # (space name, key as JSON text, at, value), before the spaces were numbered
              aside("open_state"))  # (space, key whole, at, value), before the keys' prefixes were
MOVE_CHUNK = 50_000
SEPARATOR = "\x1f"  # between the parts of the engine's keys (checks.announcements, checks.verdicts)
INSERT = "INSERT INTO open_state (space, prefix, rest, at, value) VALUES "
ROW = "(?, ?, ?, ?, ?)"


class Spaces(Numbered):
    """The numbers of the spaces' names (a name is a 1-tuple), and of the prefixes of their keys (`prefixes`)."""

    def __init__(self) -> None:
        super().__init__("open_state_spaces", ("name",))
        self.prefixes = Numbered("open_state_prefixes", ("prefix",))

    def cut(self, conn: Connection, key: str) -> tuple[int, str]:
        """(the number of `key`'s prefix, given it if it has none, its rest). Called for every entry saved: the
        committed numbers are looked up first, by hand."""
        prefix, rest = split_key(key)
        number = self.prefixes.known.get((prefix,))
        return number if number is not None else self.prefixes.number(conn, (prefix,)), rest

    def keys(self, conn: Connection, rows: list[tuple[Any, ...]]) -> list[Any]:
        """Rows (prefix number, rest, *more) with their keys whole: (key, *more)."""
        texts = self.prefixes.values_of(conn, {prefix for prefix, *_ in rows})
        return [(texts[prefix][0] + rest, *more) for prefix, rest, *more in rows]

    def committed(self) -> None:
        super().committed()
        self.prefixes.committed()

    def rolled_back(self) -> None:
        super().rolled_back()
        self.prefixes.rolled_back()


DROP_WAIT_SECONDS = 10.0  # how long entries past the horizon may stay in the store beside a busy writer

# Of one space in a state delta: (puts by key: (time, JSON text), keys gone, whether the space is saved whole).
Handed = tuple[dict[str, tuple[float, str]], set[str], bool]


def split_key(key: str) -> tuple[str, str]:
    """(prefix, rest) of an engine's key: the prefix up to its last separator, '' when it has none."""
    return prefix_and_rest(key, SEPARATOR)


def _names(shard: int | None) -> tuple[str, str]:
    """(the head's name, the prefix of the spaces' names) of one engine: the monitor's, or a group's shard's."""
    return (HEAD, "") if shard is None else (f"{HEAD}/shard/{shard}", f"shard/{shard}/")


def save(tx: Batch, delta: dict[str, Any], shard: int | None = None) -> None:
    """Apply one `state_delta()` inside the caller's store transaction (`shard`: a group's shard's engine). Its
    entries become their JSON text here, in whoever writes: a judge with a writer of its own hands the delta on as
    it is, which pickles in a third of the time the text takes to make (oncewatch.monitor.saver)."""
    head, prefix = _names(shard)
    spaces = tx.spaces
    for name, change in delta["changes"].items():
        space = spaces.number(tx.conn, (prefix + name,))
        if change["full"]:
            tx.conn.execute("DELETE FROM open_state WHERE space = ?", (space,))
        # many rows to a statement: PostgreSQL runs an executemany one statement a row
        tx.insert_rows(INSERT, ROW, ENTRIES_PER_STATEMENT,
                       [(space, *spaces.cut(tx.conn, k), t, tx.packer.pack(ENGINE, to_json(v, sort_keys=False)))
                        for k, t, v in change["put"]],
                       " ON CONFLICT(space, prefix, rest) DO UPDATE SET at = excluded.at, value = excluded.value")
        by_prefix: dict[str, list[str]] = {}
        for key in change["gone"]:
            key_prefix, rest = split_key(key)
            by_prefix.setdefault(key_prefix, []).append(rest)
        for key_prefix, rests in by_prefix.items():
            number = spaces.prefixes.find(tx.conn, (key_prefix,))
            for i in range(0, len(rests) if number is not None else 0, ENTRIES_PER_STATEMENT):
                chunk = rests[i:i + ENTRIES_PER_STATEMENT]
                tx.conn.execute(f"DELETE FROM open_state WHERE space = ? AND prefix = ? AND rest IN "
                                f"({','.join('?' * len(chunk))})", (space, number, *chunk))
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
        space = store.spaces.find(store.conn, (prefix + kind,))
        if space is None:  # no entry of it was ever saved
            entries[kind] = []
            continue
        if kind in hot:
            rows = store.conn.execute("SELECT prefix, rest, at, value FROM open_state WHERE space = ? "
                                      "ORDER BY at DESC LIMIT ?", (space, hot[kind])).fetchall()
            (total,), = store.conn.execute("SELECT COUNT(*) FROM open_state WHERE space = ?", (space,))
            cold[kind] = total - len(rows)
        else:
            rows = store.conn.execute("SELECT prefix, rest, at, value FROM open_state WHERE space = ?",
                                      (space,)).fetchall()
        entries[kind] = [[key, at, from_json(store.packer.unpack(value))]
                         for key, at, value in store.spaces.keys(store.conn, rows)]
    return {**head, "entries": entries, **({"cold": cold} if cold else {})}


def move_old_entries(conn: Connection, tables_sql: str, spaces: Spaces, insert_rows: InsertRows) -> int:
    """An older store's entries (OLD_TABLES) moved into `open_state` and dropped, inside the caller's transaction,
    MOVE_CHUNK entries at a time; returns the entries moved. `tables_sql`: the dialect's query of the store's
    tables."""
    tables = {t for (t,) in conn.execute(tables_sql)}
    moved = 0
    # engine_entries: the space by name, the key as JSON text; open_state set aside: the space by number, the key whole
    for table, start, space_of, key_of in ((OLD_TABLES[0], ("", ""), lambda name: spaces.number(conn, (name,)),
                                            from_json), (OLD_TABLES[1], (-1, ""), int, str)):
        if table in tables:
            moved += move_rows(conn, table, "space, key", start, MOVE_CHUNK, "at, value", lambda rows: insert_rows(
                INSERT, ROW, ENTRIES_PER_STATEMENT, [(space_of(space), *spaces.cut(conn, key_of(key)), at,
                                                      as_bytes(value)) for space, key, at, value in rows], ""),
                "open_state_moved")
    return moved


class ColdEntries:
    """checks.horizon.Cold over `open_state`, for an engine whose state may be written by a writer of its own
    (oncewatch.monitor.saver) while the engine goes on: `handed` gives the state delta handed to it and not yet
    written (None when none is), `settle` waits until it is written.

    What is read is the state last handed on: a key the delta in flight puts is read from it (as the store will give
    it back), one it drops is absent, any other is read from the store, which the delta in flight does not change for
    it. An entry past the horizon is absent from the moment the engine drops it, and deleted once nothing is in flight
    (at a later drop; within DROP_WAIT_SECONDS, waiting for the writer then). The rarer uses (the oldest dropped for
    room, a space emptied, every key listed) wait for the delta in flight to be written first."""

    def __init__(self, store: Store, settle: Callable[[], object] = lambda: None,
                 handed: Callable[[], dict[str, Any] | None] = lambda: None):
        self.conn = store.conn
        self.spaces = store.spaces
        self.unpack = store.packer.unpack
        self.settle = settle
        self.handed = handed
        self._cutoffs: dict[str, float] = {}  # space -> the engine's latest horizon cutoff for it
        self._waiting: dict[str, float] = {}  # space -> since when its drop has waited for the writer
        self._overlay: tuple[dict[str, Any] | None, dict[str, Handed | None]] = (None, {})

    def get(self, space: str, key: str) -> tuple[float, Any] | None:
        cutoff = self._cutoffs.get(space, float("-inf"))
        handed = self._handed(space)
        if handed is not None:
            puts, gone, full = handed
            if key in puts:
                at, value = puts[key]
                # as the store will give it back (tuples as lists, sets as sorted lists), and never the object
                # the engine handed on, which it may change in place once it holds it again
                return None if at < cutoff else (at, from_json(to_json(value, sort_keys=False)))
            if full or key in gone:
                return None
        number = self.spaces.find(self.conn, (space,))
        prefix, rest = split_key(key)
        prefix_number = self.spaces.prefixes.find(self.conn, (prefix,))
        row = None if number is None or prefix_number is None else self.conn.execute(
            "SELECT at, value FROM open_state WHERE space = ? AND prefix = ? AND rest = ?",
            (number, prefix_number, rest)).fetchone()
        return None if row is None or row[0] < cutoff else (row[0], from_json(self.unpack(row[1])))

    def _handed(self, space: str) -> Handed | None:
        """(puts by key, keys gone, whether the space is saved whole) of `space` in the delta in flight."""
        delta = self.handed()
        if delta is None:
            return None
        if self._overlay[0] is not delta:
            self._overlay = (delta, {})
        spaces = self._overlay[1]
        if space not in spaces:
            change = delta["changes"].get(space)
            spaces[space] = None if change is None else (
                {k: (t, v) for k, t, v in change["put"]}, set(change["gone"]), change["full"])
        return spaces[space]

    def drop_before(self, space: str, cutoff: float) -> list[str]:
        self._cutoffs[space] = max(cutoff, self._cutoffs.get(space, cutoff))
        if self.handed() is not None:
            waited = self._waiting.setdefault(space, time.monotonic())
            if time.monotonic() - waited < DROP_WAIT_SECONDS:
                return []
            self.settle()  # a writer never idle when asked: the entries past the horizon go all the same
        self._waiting.pop(space, None)
        number = self.spaces.find(self.conn, (space,))
        return [] if number is None else self._keys(self.conn.execute(
            "DELETE FROM open_state WHERE space = ? AND at < ? RETURNING prefix, rest", (number, cutoff)))

    def drop_oldest(self, space: str, n: int) -> list[str]:
        self.settle()
        number = self.spaces.find(self.conn, (space,))
        return [] if number is None else self._keys(self.conn.execute(
            "DELETE FROM open_state WHERE space = ? AND (prefix, rest) IN (SELECT prefix, rest FROM open_state "
            "WHERE space = ? ORDER BY at LIMIT ?) RETURNING prefix, rest", (number, number, n)))

    def drop_all(self, space: str) -> None:
        self.settle()
        number = self.spaces.find(self.conn, (space,))
        if number is not None:
            self.conn.execute("DELETE FROM open_state WHERE space = ?", (number,))

    def keys(self, space: str) -> list[str]:
        self.settle()
        number = self.spaces.find(self.conn, (space,))
        return [] if number is None else self._keys(self.conn.execute(
            "SELECT prefix, rest FROM open_state WHERE space = ?", (number,)))

    def _keys(self, cursor: Any) -> list[str]:
        return [key for (key,) in self.spaces.keys(self.conn, cursor.fetchall())]
