"""Which watched table a real table is: `mysql.tables` entries are names or shell-style patterns.

An entry such as `shop_*.pay_order_*` (`*`, `?`, `[0-9]`; schema and table matched apart, case
as the server has it) stands for every shard that matches it, shards created after the monitor
started too. The binlog collector, the bootstrap and the engine all ask `Watched.entry` which
entry a real table falls under, and the roles of [domain] name entries: one role covers all of
its shards. Where a real table matches several entries, the first listed wins.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

PATTERN_CHARS = frozenset("*?[")
CACHE_LIMIT = 100_000  # real tables remembered; a shop with more is looked up each time past that


def is_pattern(name: str) -> bool:
    return not PATTERN_CHARS.isdisjoint(name)


class Watched:
    """Entries of `mysql.tables` ('schema.table', either part a pattern) and the real tables under them."""

    def __init__(self, entries: Iterable[str]):
        self.entries = tuple(entries)
        self._exact = {tuple(e.split(".", 1)): e for e in self.entries if not is_pattern(e)}
        self._patterns = [(*e.split(".", 1), e) for e in self.entries if is_pattern(e)]
        self._seen: dict[tuple[str, str], str | None] = {}

    def entry(self, schema: str, table: str) -> str | None:
        """The entry the real table `schema.table` falls under, or None when it is not watched."""
        key = (schema, table)
        try:
            return self._seen[key]
        except KeyError:
            pass
        found = self._exact.get(key)
        if found is None:
            found = next((e for s, t, e in self._patterns if fnmatchcase(schema, s) and fnmatchcase(table, t)), None)
        if len(self._seen) < CACHE_LIMIT:
            self._seen[key] = found
        return found

    def qualified(self, name: str) -> str | None:
        """`entry` of a 'schema.table' name."""
        schema, _, table = name.partition(".")
        return self.entry(schema, table)

    def exact_schemas(self) -> tuple[str, ...] | None:
        """The schemas to ask the server for, or None when a schema part is a pattern (then all are read)."""
        parts = [e.split(".", 1)[0] for e in self.entries]
        return None if any(map(is_pattern, parts)) else tuple(sorted(set(parts)))

    def exact_tables(self) -> tuple[str, ...] | None:
        """The table names to ask the server for, or None when a table part is a pattern."""
        parts = [e.split(".", 1)[1] for e in self.entries]
        return None if any(map(is_pattern, parts)) else tuple(sorted(set(parts)))


__all__ = ["Watched", "is_pattern"]
