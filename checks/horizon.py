"""Bounded open state: maps whose entries fall off a time horizon, counted, never silently.

`Aging` is a dict kept in last-touched order so that expiring is a walk from the front.
Each walk is one iterator over the dict: `next(iter(d))` after deleting from the front scans
the deleted slots every time (CPython keeps them until a resize), which made sweeps quadratic.
`Deadlines` holds items that become due at `time + grace` (an order that may get stuck, a
change waiting for its event) and moves them to `overdue` once judged, where they wait to be
resolved. Both serialise to plain lists in order, because `to_json` sorts dict keys and
the order is what makes expiring cheap.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice, takewhile
from typing import Any, Generic, Protocol, TypeVar

V = TypeVar("V")


class Aging(Generic[V]):
    """key -> value with the stream time it was last touched; bounded by age and by count."""

    def __init__(self, horizon: float, max_entries: int):
        self.horizon = horizon
        self.max_entries = max_entries
        self.items: dict[str, tuple[float, V]] = {}
        self.dropped = 0

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, key: str) -> bool:
        return key in self.items

    def get(self, key: str) -> V | None:
        entry = self.items.get(key)
        return None if entry is None else entry[1]

    def put(self, key: str, value: V, time: float) -> None:
        """Set and move to the back; over `max_entries`, the oldest 1% falls off (in one walk)."""
        self.items.pop(key, None)
        self.items[key] = (time, value)
        if len(self.items) > self.max_entries:
            oldest = list(islice(self.items, len(self.items) - self.max_entries + self.max_entries // 100))
            for k in oldest:
                del self.items[k]
            self.dropped += len(oldest)

    def pop(self, key: str) -> V | None:
        entry = self.items.pop(key, None)
        return None if entry is None else entry[1]

    def values(self) -> Iterator[V]:
        return (v for _, v in self.items.values())

    def expire(self, now: float) -> list[V]:
        """Drop entries last touched before `now - horizon`; returns them for reporting.

        Touch times are nearly but not strictly ordered (two streams), so an entry slightly
        out of order waits for the next sweep: the walk stops at the first young entry.
        """
        cutoff = now - self.horizon
        old = list(takewhile(lambda kv: kv[1][0] < cutoff, self.items.items()))
        for key, _ in old:
            del self.items[key]
        self.dropped += len(old)
        return [value for _, (_, value) in old]

    def dump(self) -> dict[str, Any]:
        return {"items": [[k, t, v] for k, (t, v) in self.items.items()], "dropped": self.dropped}

    def load(self, d: dict[str, Any]) -> None:
        self.items = {k: (t, v) for k, t, v in d["items"]}
        self.dropped = d["dropped"]


def _pop_first(aging: Aging[list[dict[str, Any]]], key: str) -> dict[str, Any] | None:
    entry = aging.items.get(key)
    if entry is None:
        return None
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
            items.append(item)

    def has(self, key: str) -> bool:
        return key in self.fresh or key in self.overdue

    def take(self, key: str) -> tuple[dict[str, Any], bool] | None:
        """The oldest item of `key` and whether it was overdue; None when there is none."""
        item = _pop_first(self.overdue, key)
        if item is not None:
            return item, True
        item = _pop_first(self.fresh, key)
        return None if item is None else (item, False)

    def due(self, now: float) -> list[tuple[str, dict[str, Any]]]:
        """Move the items whose deadline is before `now` to overdue and return them."""
        out = []
        cutoff = now - self.grace
        for key, (time, items) in list(takewhile(lambda kv: kv[1][0] < cutoff, self.fresh.items.items())):
            late = [i for i in items if i["t"] < cutoff]
            rest = [i for i in items if i["t"] >= cutoff]
            self.fresh.pop(key)
            if rest:
                self.fresh.put(key, rest, rest[0]["t"])
            previous = self.overdue.get(key) or []
            self.overdue.put(key, previous + late, time)
            out.extend((key, i) for i in late)
        return out

    def expire(self, now: float) -> list[dict[str, Any]]:
        return [i for items in self.fresh.expire(now) + self.overdue.expire(now) for i in items]

    @property
    def dropped(self) -> int:
        return self.fresh.dropped + self.overdue.dropped

    def discard(self, key: str, item: dict[str, Any]) -> None:
        """Forget one overdue item that has been judged for good (e.g. found to be a duplicate)."""
        items = self.overdue.get(key)
        if items is not None and item in items:
            items.remove(item)
            if not items:
                self.overdue.pop(key)

    def dump(self) -> dict[str, Any]:
        return {"fresh": self.fresh.dump(), "overdue": self.overdue.dump()}

    def load(self, d: dict[str, Any]) -> None:
        self.fresh.load(d["fresh"])
        self.overdue.load(d["overdue"])


class Space(Protocol):
    """What the engine's memory needs of each piece of open state."""

    dropped: int

    def __len__(self) -> int: ...

    def expire(self, now: float) -> list[Any]: ...

    def dump(self) -> dict[str, Any]: ...

    def load(self, d: dict[str, Any]) -> None: ...


BINLOG, KAFKA, STREAMS = "binlog", "kafka", "streams"


class Memory:
    """All open state of the engine by name: what `Engine.state()` saves and the horizon sweeps.

    Each space ages on the clock of the stream it comes from (`BINLOG` commit time, `KAFKA`
    event time, or `STREAMS`, the later of the two), so a stalled stream does not make the
    other one's state fall off. `plain` dicts hold small JSON-able values (counters, a
    histogram) saved as they are and refilled in place on load, so holders keep their reference.
    """

    def __init__(self, horizon: float, max_entries: int):
        self.horizon = horizon
        self.max_entries = max_entries
        self.spaces: dict[str, tuple[Space, str]] = {}
        self.plain: dict[str, dict[str, Any]] = {}

    def add(self, name: str, space: Space, clock: str) -> Any:
        self.spaces[name] = (space, clock)
        return space

    def aging(self, name: str, clock: str) -> Aging[Any]:
        return self.add(name, Aging(self.horizon, self.max_entries), clock)

    def deadlines(self, name: str, clock: str, grace: float) -> Deadlines:
        return self.add(name, Deadlines(grace, self.horizon, self.max_entries), clock)

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

    def dump(self) -> dict[str, Any]:
        return {"spaces": {name: space.dump() for name, (space, _) in self.spaces.items()}, "plain": self.plain}

    def load(self, d: dict[str, Any]) -> None:
        for name, (space, _) in self.spaces.items():
            space.load(d["spaces"][name])
        for name, values in self.plain.items():
            values.clear()
            values.update(d["plain"][name])
