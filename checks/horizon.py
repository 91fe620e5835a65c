"""Bounded open state: maps whose entries fall off a time horizon, counted, never silently.

`Aging` is a dict kept in last-touched order so that expiring is a walk from the front.
Each walk is one iterator over the dict: `next(iter(d))` after deleting from the front scans
the deleted slots every time (CPython keeps them until a resize), which made sweeps quadratic.
`Deadlines` holds items that become due at `time + grace` (an order that may get stuck, a
change waiting for its event) and moves them to `overdue` once judged, where they wait to be
resolved.

`Memory` names every `Aging` of the engine and saves them either whole (`dump`) or as the
entries put and gone since the last save (`delta`), so that a large state need not be written
out in full at every checkpoint. Entries are saved as `[key, time, value]` rows; loading sorts
them by time, which restores the order expiring relies on (JSON does not keep dict order).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import islice, takewhile
from typing import Any, Generic, Protocol, TypeVar

V = TypeVar("V")


class Aging(Generic[V]):
    """key -> value with the stream time it was last touched; bounded by age and by count.

    Values are replaced through `put` (or mutated in place and `mark`ed), so that after the
    first `changes()` the keys changed since are known, each with whether it existed then: a
    key made and gone between two calls is in neither list.
    """

    def __init__(self, horizon: float, max_entries: int):
        self.horizon = horizon
        self.max_entries = max_entries
        self.items: dict[str, tuple[float, V]] = {}
        self.dropped = 0
        self.dirty: dict[str, bool] | None = None  # key -> existed at the last changes()

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, key: str) -> bool:
        return key in self.items

    def get(self, key: str) -> V | None:
        entry = self.items.get(key)
        return None if entry is None else entry[1]

    def mark(self, key: str) -> None:
        """`key` is about to change (or its value was changed in place)."""
        if self.dirty is not None and key not in self.dirty:
            self.dirty[key] = key in self.items

    def put(self, key: str, value: V, time: float) -> None:
        """Set and move to the back; over `max_entries`, the oldest 1% falls off (in one walk)."""
        self.mark(key)
        self.items.pop(key, None)
        self.items[key] = (time, value)
        if len(self.items) > self.max_entries:
            self._drop(list(islice(self.items, len(self.items) - self.max_entries + self.max_entries // 100)))

    def pop(self, key: str) -> V | None:
        self.mark(key)
        entry = self.items.pop(key, None)
        return None if entry is None else entry[1]

    def values(self) -> Iterator[V]:
        return (v for _, v in self.items.values())

    def _drop(self, keys: list[str]) -> list[V]:
        for k in keys:
            self.mark(k)
        gone = [self.items.pop(k)[1] for k in keys]
        self.dropped += len(keys)
        return gone

    def expire(self, now: float) -> list[V]:
        """Drop entries last touched before `now - horizon`; returns them for reporting.

        Touch times are nearly but not strictly ordered (two streams), so an entry slightly
        out of order waits for the next sweep: the walk stops at the first young entry.
        """
        cutoff = now - self.horizon
        return self._drop([k for k, _ in takewhile(lambda kv: kv[1][0] < cutoff, self.items.items())])

    # ------------------------------------------------------------ saving

    def rows(self, encode: Callable[[V], Any]) -> list[list[Any]]:
        return [[k, t, encode(v)] for k, (t, v) in self.items.items()]

    def changes(self, encode: Callable[[V], Any]) -> dict[str, Any]:
        """Rows put and keys gone since the last call; everything (`full`) on the first call."""
        if self.dirty is None:
            self.dirty = {}
            return {"full": True, "put": self.rows(encode), "gone": []}
        put = [[k, self.items[k][0], encode(self.items[k][1])] for k in self.dirty if k in self.items]
        gone = [k for k, existed in self.dirty.items() if existed and k not in self.items]
        self.dirty = {}
        return {"full": False, "put": put, "gone": gone}

    def load(self, rows: Iterable[list[Any]], decode: Callable[[Any], V]) -> None:
        self.items = {k: (t, decode(v)) for k, t, v in sorted(rows, key=lambda r: r[1])}
        self.dirty = None


class Space(Protocol):
    """What the horizon sweep needs of each piece of open state."""

    dropped: int

    def __len__(self) -> int: ...

    def expire(self, now: float) -> list[Any]: ...


def _pop_first(aging: Aging[list[dict[str, Any]]], key: str) -> dict[str, Any] | None:
    entry = aging.items.get(key)
    if entry is None:
        return None
    aging.mark(key)
    items = entry[1]
    if len(items) == 1:
        del aging.items[key]
    return items.pop(0)


class Deadlines:
    """Items (dicts with a time under "t") per key, due at t + grace; FIFO per key.

    `fresh` holds items not judged yet, `overdue` those judged late and waiting for their
    resolution (a late event, an order finally paid). `take` prefers overdue items: they are
    the oldest.
    """

    def __init__(self, grace: float, horizon: float, max_entries: int):
        self.grace = grace
        self.fresh: Aging[list[dict[str, Any]]] = Aging(horizon, max_entries)
        self.overdue: Aging[list[dict[str, Any]]] = Aging(horizon, max_entries)

    def __len__(self) -> int:
        return len(self.fresh) + len(self.overdue)

    def add(self, key: str, item: dict[str, Any]) -> None:
        items = self.fresh.get(key)
        if items is None:
            self.fresh.put(key, [item], item["t"])
        else:
            self.fresh.mark(key)
            items.append(item)

    def has(self, key: str) -> bool:
        return key in self.fresh or key in self.overdue

    def take(self, key: str) -> tuple[dict[str, Any], bool] | None:
        """The oldest item of `key` and whether it was overdue; None when there is none."""
        item = _pop_first(self.overdue, key) if self.overdue.items else None
        if item is not None:
            return item, True
        item = _pop_first(self.fresh, key)
        return None if item is None else (item, False)

    def due(self, now: float) -> list[tuple[str, dict[str, Any]]]:
        """Move the items whose deadline is before `now` to overdue and return them."""
        out = []
        cutoff = now - self.grace
        for key, (_, items) in list(takewhile(lambda kv: kv[1][0] < cutoff, self.fresh.items.items())):
            late = [i for i in items if i["t"] < cutoff]
            rest = [i for i in items if i["t"] >= cutoff]
            self.fresh.pop(key)
            if rest:
                self.fresh.put(key, rest, rest[0]["t"])
            # The key's time is its first item's when added: once that item was taken, none may be late yet.
            if late:
                overdue = (self.overdue.get(key) or []) + late
                self.overdue.put(key, overdue, overdue[0]["t"])
                out.extend((key, i) for i in late)
        return out

    def expire(self, now: float) -> list[dict[str, Any]]:
        return [i for items in self.fresh.expire(now) + self.overdue.expire(now) for i in items]

    @property
    def dropped(self) -> int:
        return self.fresh.dropped + self.overdue.dropped


BINLOG, KAFKA, STREAMS = "binlog", "kafka", "streams"


def _same(value: Any) -> Any:
    return value


class Memory:
    """All open state of the engine by name: what the engine saves and the horizon sweeps.

    Each space ages on the clock of the stream it comes from (`BINLOG` commit time, `KAFKA`
    event time, or `STREAMS`, the later of the two), so a stalled stream does not make the
    other one's state fall off. `plain` dicts hold small JSON-able values (counters, a
    histogram) saved as they are and refilled in place on load, so holders keep their reference.
    """

    def __init__(self, horizon: float, max_entries: int):
        self.horizon = horizon
        self.max_entries = max_entries
        self.spaces: dict[str, tuple[Space, str]] = {}
        # name -> (aging, encode, decode): what is saved, one flat map per Aging
        self.saved: dict[str, tuple[Aging[Any], Callable[[Any], Any], Callable[[Any], Any]]] = {}
        self.plain: dict[str, dict[str, Any]] = {}

    def aging(self, name: str, clock: str, encode: Callable[[Any], Any] = _same,
              decode: Callable[[Any], Any] = _same) -> Aging[Any]:
        aging: Aging[Any] = Aging(self.horizon, self.max_entries)
        self.spaces[name] = (aging, clock)
        self.saved[name] = (aging, encode, decode)
        return aging

    def deadlines(self, name: str, clock: str, grace: float) -> Deadlines:
        deadlines = Deadlines(grace, self.horizon, self.max_entries)
        self.spaces[name] = (deadlines, clock)
        self.saved[f"{name}.fresh"] = (deadlines.fresh, _same, _same)
        self.saved[f"{name}.overdue"] = (deadlines.overdue, _same, _same)
        return deadlines

    def counters(self, name: str, initial: dict[str, Any]) -> dict[str, Any]:
        self.plain[name] = initial
        return initial

    def expire(self, binlog_time: float, kafka_time: float) -> dict[str, list[Any]]:
        now = {BINLOG: binlog_time, KAFKA: kafka_time, STREAMS: max(binlog_time, kafka_time)}
        gone = {name: space.expire(now[clock]) for name, (space, clock) in self.spaces.items()}
        return {name: values for name, values in gone.items() if values}

    def dropped(self) -> int:
        return sum(space.dropped for space, _ in self.spaces.values())

    def held(self) -> int:
        """Entries held over all spaces (keys, not the items under them)."""
        return sum(len(space) for space, _ in self.spaces.values())

    def _head(self) -> dict[str, Any]:
        return {"plain": self.plain, "dropped": {name: a.dropped for name, (a, _, _) in self.saved.items()}}

    def dump(self) -> dict[str, Any]:
        return {**self._head(), "entries": {name: a.rows(enc) for name, (a, enc, _) in self.saved.items()}}

    def delta(self) -> dict[str, Any]:
        return {**self._head(), "changes": {name: a.changes(enc) for name, (a, enc, _) in self.saved.items()}}

    def load(self, d: dict[str, Any]) -> None:
        for name, (aging, _, decode) in self.saved.items():
            aging.load(d["entries"][name], decode)
            aging.dropped = d["dropped"][name]
        for name, values in self.plain.items():
            values.clear()
            values.update(d["plain"].get(name, {}))  # a space added since the state was saved starts empty
