"""Values a store keeps once, in a table of their own, each under a number its rows point to (issue 47): the engine's
spaces (`open_state_spaces`) and where row changes come from (`row_sources`).

Such a table is `id INTEGER PRIMARY KEY` and the value's columns, unique together. Its writers give the numbers, one
past the largest; a writer that loses the race to another (a group's members save into one PostgreSQL store) tries
again. A writer keeps the numbers it has met, and forgets those given in a transaction that rolled back
(`committed`, `rolled_back`: Store.batch), whose rows are gone.
"""

from __future__ import annotations

from typing import Any

from oncewatch.store.dialect import Connection
from oncewatch.store.errors import StoreError

TRIES = 100


def prefix_and_rest(text: str, separator: str) -> tuple[str, str]:
    """(the part of `text` up to and with its last `separator`, kept once under a number; the rest): '' and the whole
    text when it has none."""
    cut = text.rfind(separator) + 1
    return text[:cut], text[cut:]


class Numbered:
    """The numbers of the values of `table` (columns `columns`), as its writers give them."""

    def __init__(self, table: str, columns: tuple[str, ...]):
        self.table = table
        self.columns = columns
        self.known: dict[tuple[Any, ...], int] = {}
        self.pending: dict[tuple[Any, ...], int] = {}
        match = " AND ".join(f"{c} = ?" for c in columns)
        self._find = f"SELECT id FROM {table} WHERE {match}"
        # WHERE true: SQLite would read the ON of an upsert after a SELECT's FROM as a join's
        self._give = (f"INSERT INTO {table} (id, {', '.join(columns)}) SELECT COALESCE(MAX(id), 0) + 1, "
                      f"{', '.join('?' * len(columns))} FROM {table} WHERE true ON CONFLICT DO NOTHING")

    def find(self, conn: Connection, value: tuple[Any, ...]) -> int | None:
        """`value`'s number, None while it has none."""
        number = self.known.get(value) or self.pending.get(value)
        if number is None:
            row = conn.execute(self._find, value).fetchone()
            if row is not None:
                number = self.known[value] = row[0]
        return number

    def number(self, conn: Connection, value: tuple[Any, ...]) -> int:
        """`value`'s number, given it (and stored, inside the caller's transaction) if it has none."""
        number = self.find(conn, value)
        for _ in range(TRIES):
            if number is not None:
                return number
            conn.execute(self._give, value)
            row = conn.execute(self._find, value).fetchone()
            if row is not None:
                number = self.pending[value] = row[0]
        raise StoreError(f"no number for {value!r} in {self.table} after {TRIES} tries: other writers of the store "
                         f"took each one first; start the monitor again")

    def values_of(self, conn: Connection, numbers: set[int]) -> dict[int, tuple[Any, ...]]:
        """The value of each of `numbers` (each one given, in this transaction or before)."""
        out = {n: v for values in (self.known, self.pending) for v, n in values.items() if n in numbers}
        if missing := sorted(numbers - out.keys()):
            for number, *value in conn.execute(f"SELECT id, {', '.join(self.columns)} FROM {self.table} WHERE id IN "
                                               f"({','.join('?' * len(missing))})", missing):
                self.known[tuple(value)] = number
                out[number] = tuple(value)
        return out

    def committed(self) -> None:
        self.known.update(self.pending)
        self.pending.clear()

    def rolled_back(self) -> None:
        self.pending.clear()
