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

Spilling: an `Aging` that is only ever looked up by key (effects per trade_no, payments and
amounts per order, announced keys) may hold just its newest `hot` entries in memory once it is
attached to a `Cold` tier (the store's saved entries, `Memory.spill_to`). Right after a save,
every entry is saved, so the oldest beyond `hot` are simply forgotten in memory (`evict`); a
key missed in memory is looked up in the cold tier (unless the tier's `KeySieve` says it never
went there: most keys a stream brings are new) and moves back into memory when it is put again. The horizon and `max_entries` count both tiers and drop from both. This is what keeps a
bootstrap of millions of rows, or a transaction of millions, within a bounded memory: the
state still holds every entry the rules need, only not all of it in memory. The engine stays
free of I/O of its own: the caller hands it the cold tier.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import islice, takewhile
from typing import Any, Generic, Protocol, TypeVar

V = TypeVar("V")


class Cold(Protocol):
    """Saved entries of spilled spaces, outside memory (the store implements it)."""

    def get(self, space: str, key: str) -> tuple[float, Any] | None:
        """(time, saved value) of `key`, or None."""

    def drop_before(self, space: str, cutoff: float) -> list[str]:
        """Delete the entries older than `cutoff`; their keys."""

    def drop_oldest(self, space: str, n: int) -> list[str]:
        """Delete the `n` oldest entries; their keys."""

    def drop_all(self, space: str) -> None: ...

    def keys(self, space: str) -> list[str]:
        """Every key saved in `space`."""


class KeySieve:
    """A Bloom filter of the keys a cold tier may hold: a key it has never been given is said absent at once,
    so that a key new to the engine (nearly every key a stream brings) costs no read of the store; a key it
    was given, and about one in seventy others, is looked up there. Keys the cold tier deletes stay in it
    (a wasted read, never a wrong answer) until it is built anew (`full`) from the tier's keys."""

    BITS_PER_KEY = 16  # with two bits a key: about 1.4% of absent keys are looked up all the same

    def __init__(self, keys: Iterable[str], capacity: int):
        self.capacity = max(capacity, 1024)
        self.size = self.capacity * self.BITS_PER_KEY
        self.bits = bytearray(self.size // 8 + 1)
        self.added = 0
        for key in keys:
            self.add(key)

    def _places(self, key: str) -> tuple[int, int]:
        h = hash(key) & 0xFFFF_FFFF_FFFF_FFFF  # a str caches its hash: the dict lookups beside this paid for it
        return h % self.size, (h >> 32) % self.size

    def add(self, key: str) -> None:
        for place in self._places(key):
            self.bits[place >> 3] |= 1 << (place & 7)
        self.added += 1

    def __contains__(self, key: str) -> bool:
        a, b = self._places(key)
        return bool(self.bits[a >> 3] & (1 << (a & 7)) and self.bits[b >> 3] & (1 << (b & 7)))

    @property
    def full(self) -> bool:
        return self.added > self.capacity


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
        self.crowded = 0  # of those dropped, how many fell off over `max_entries` rather than by age
        self.dirty: dict[str, bool] | None = None  # key -> existed at the last changes()
        # spilling (see the module docstring): entries saved and no longer in memory
        self.name = ""
        self.cold: Cold | None = None
        self.hot = 0
        self.cold_count = 0
        self.decode: Callable[[Any], V] = _same
        self._probed: dict[str, tuple[float, Any] | None] = {}  # cold lookups since the last save or drop
        self._sieve: KeySieve | None = None  # the keys the cold tier may hold (None: none yet)
        self._gone: set[str] = set()  # cold keys put back in memory or popped since the last save

    def __len__(self) -> int:
        return len(self.items) + self.cold_count

    def __contains__(self, key: str) -> bool:
        return key in self.items or self._in_cold(key) is not None

    def _in_cold(self, key: str) -> tuple[float, Any] | None:
        if not self.cold_count or key in self.items or key in self._gone:
            return None
        if self._sieve is not None and key not in self._sieve:
            return None
        if key not in self._probed:
            self._probed[key] = self.cold.get(self.name, key)
        return self._probed[key]

    def get(self, key: str) -> V | None:
        entry = self.items.get(key)
        if entry is not None:
            return entry[1]
        cold = self._in_cold(key)
        return None if cold is None else self.decode(cold[1])

    def mark(self, key: str) -> None:
        """`key` is about to change (or its value was changed in place)."""
        if self.dirty is not None and key not in self.dirty:
            self.dirty[key] = key in self.items or self._in_cold(key) is not None

    def _leave_cold(self, key: str) -> None:
        """`key` is about to be in memory again, or gone: its cold copy no longer counts."""
        if self._in_cold(key) is not None:
            self.cold_count -= 1
            self._gone.add(key)
            del self._probed[key]

    def put(self, key: str, value: V, time: float) -> None:
        """Set and move to the back; over `max_entries`, the oldest 1% falls off (in one walk)."""
        self.mark(key)
        self._leave_cold(key)
        self.items.pop(key, None)
        self.items[key] = (time, value)
        if len(self) > self.max_entries:
            self._drop_oldest(len(self) - self.max_entries + self.max_entries // 100)

    def pop(self, key: str) -> V | None:
        self.mark(key)
        cold = self._in_cold(key)
        if cold is not None:  # its saved row goes at the next save, as `gone`
            self._leave_cold(key)
            return self.decode(cold[1])
        entry = self.items.pop(key, None)
        return None if entry is None else entry[1]

    def clear(self) -> None:
        """Every entry gone (not counted as dropped: the holder is done with them)."""
        for key in list(self.items):
            self.pop(key)
        if self.cold_count:
            self.cold.drop_all(self.name)
            self.cold_count, self._probed, self._sieve = 0, {}, None

    def _drop_oldest(self, n: int) -> None:
        """The `n` oldest entries fall off, the cold ones first (they are the oldest); counted as crowded out."""
        before = self.dropped
        if self.cold_count:
            n -= self._cold_dropped(self.cold.drop_oldest(self.name, min(n, self.cold_count)), ())
        if n > 0:
            self._drop(list(islice(self.items, n)))
        self.crowded += self.dropped - before

    def _cold_dropped(self, keys: list[str], expired: Iterable[str]) -> int:
        """The cold tier deleted the saved rows of `keys`: count the cold entries among them as fallen off.
        The others were `expired` from memory just now, or left the cold tier since the last save, or are
        still in memory (touched out of time order): saved again at the next save."""
        expired = set(expired)
        gone = 0
        for key in keys:
            if key in self.items:
                if self.dirty is not None:
                    self.dirty[key] = False
            elif key not in expired and key not in self._gone:
                gone += 1
        self.cold_count -= gone
        self.dropped += gone
        self._probed = {}
        return gone

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
        expired = [k for k, _ in takewhile(lambda kv: kv[1][0] < cutoff, self.items.items())]
        values = self._drop(expired)
        if self.cold_count:
            self._cold_dropped(self.cold.drop_before(self.name, cutoff), expired)
        return values

    def evict(self) -> None:
        """Right after a save: the oldest entries beyond `hot` (and a tenth more, so that this happens
        once in a while, not at every save) leave memory; they stay in the cold tier."""
        if self.cold is None or self.dirty is None or self.dirty or len(self.items) <= self.hot:
            return
        leaving = list(islice(self.items, len(self.items) - self.hot + self.hot // 10))
        if self._sieve is None or self._sieve.full:  # built anew over what the tier holds, with room to grow
            self._sieve = KeySieve(self.cold.keys(self.name), 2 * (self.cold_count + len(leaving) + self.hot))
        for key in leaving:
            del self.items[key]
            self._sieve.add(key)
            self.cold_count += 1
        self._probed = {}

    # ------------------------------------------------------------ saving

    def rows(self, encode: Callable[[V], Any]) -> list[list[Any]]:
        """Every entry in memory (cold ones are in the cold tier already)."""
        return [[k, t, encode(v)] for k, (t, v) in self.items.items()]

    def changes(self, encode: Callable[[V], Any]) -> dict[str, Any]:
        """Rows put and keys gone since the last call; everything (`full`) on the first call."""
        if self.dirty is None:
            self.dirty = {}
            return {"full": True, "put": self.rows(encode), "gone": []}
        items = self.items
        put = [[k, entry[0], encode(entry[1])] for k in self.dirty if (entry := items.get(k)) is not None]
        gone = [k for k, existed in self.dirty.items()
                if existed and k not in self.items and self._in_cold(k) is None]
        self.dirty, self._gone, self._probed = {}, set(), {}
        return {"full": False, "put": put, "gone": gone}

    def load(self, rows: Iterable[list[Any]], decode: Callable[[Any], V], cold: int = 0) -> None:
        """`rows` into memory; `cold` more entries saved in the cold tier (then every entry is saved:
        nothing is dirty; else the next `changes()` is `full`, as on a first save)."""
        self.items = {k: (t, decode(v)) for k, t, v in sorted(rows, key=lambda r: r[1])}
        self.cold_count, self._probed = cold, {}
        self._sieve = KeySieve(self.cold.keys(self.name), 2 * (cold + self.hot)) if cold else None
        self.dirty = {} if cold else None


class Space(Protocol):
    """What the horizon sweep needs of each piece of open state."""

    dropped: int

    def __len__(self) -> int: ...

    def expire(self, now: float) -> list[Any]: ...


FRESH = ".fresh"  # the saved name's suffix of a Deadlines' items not judged yet


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

    def next_due(self) -> float | None:
        """When the oldest item not judged yet comes due (None: every item is judged)."""
        first = next(iter(self.fresh.items.values()), None)
        return None if first is None else first[0] + self.grace

    @property
    def dropped(self) -> int:
        return self.fresh.dropped + self.overdue.dropped


BINLOG, KAFKA, STREAMS = "binlog", "kafka", "streams"
CDC = "cdc"  # the CDC topics' delivered commit times (checks.pipeline), apart from the announcements' Kafka clock
AGE, COUNT = "age", "count"  # why an entry fell off: older than the horizon, or over max_entries


def verdicts_lost(by_space: dict[str, dict[str, int]]) -> int:
    """Of `Memory.dropped_by_space()`, the drops that lost something a rule still needed: anything pushed
    out over `max_entries`, and items not judged yet (`Deadlines.fresh`) that aged out. The rest is the
    horizon doing its job: memory for duplicate checks, and overdue items already reported."""
    return sum(n[COUNT] + (n[AGE] if name.endswith(FRESH) else 0) for name, n in by_space.items())


def _same(value: Any) -> Any:
    return value


class Memory:
    """All open state of the engine by name: what the engine saves and the horizon sweeps.

    Each space ages on the clock of the stream it comes from (`BINLOG` commit time, `KAFKA`
    event time, or `STREAMS`, the later of the two; `CDC`, the commit times the CDC topics
    delivered), so a stalled stream does not make the other one's state fall off. `plain` dicts
    hold small JSON-able values (counters, a histogram) saved as they are and refilled in place
    on load, so holders keep their reference.
    """

    def __init__(self, horizon: float, max_entries: int):
        self.horizon = horizon
        self.max_entries = max_entries
        self.spaces: dict[str, tuple[Space, str]] = {}
        # name -> (aging, encode, decode): what is saved, one flat map per Aging
        self.saved: dict[str, tuple[Aging[Any], Callable[[Any], Any], Callable[[Any], Any]]] = {}
        self.plain: dict[str, dict[str, Any]] = {}
        self.spillable: list[Aging[Any]] = []

    def aging(self, name: str, clock: str, encode: Callable[[Any], Any] = _same,
              decode: Callable[[Any], Any] = _same, *, spill: bool = False) -> Aging[Any]:
        """`spill`: the space is only ever looked up by key, so its older entries may wait in the cold tier."""
        aging: Aging[Any] = Aging(self.horizon, self.max_entries)
        aging.name, aging.decode = name, decode
        self.spaces[name] = (aging, clock)
        self.saved[name] = (aging, encode, decode)
        if spill:
            self.spillable.append(aging)
        return aging

    def spill_to(self, cold: Cold, hot: int) -> None:
        """Keep at most about `hot` entries of each spillable space in memory, the rest in `cold`."""
        for aging in self.spillable:
            aging.cold, aging.hot = cold, hot

    def hot_limits(self) -> dict[str, int]:
        """Spilled space -> entries to load into memory on restore (the rest stay cold)."""
        return {aging.name: aging.hot for aging in self.spillable if aging.cold is not None}

    def evict(self) -> None:
        for aging in self.spillable:
            aging.evict()

    def deadlines(self, name: str, clock: str, grace: float) -> Deadlines:
        deadlines = Deadlines(grace, self.horizon, self.max_entries)
        self.spaces[name] = (deadlines, clock)
        self.saved[f"{name}{FRESH}"] = (deadlines.fresh, _same, _same)
        self.saved[f"{name}.overdue"] = (deadlines.overdue, _same, _same)
        return deadlines

    def undecided(self, change_clock_moves: bool = True) -> tuple[int, float | None]:
        """(keys whose items wait for their verdict on the binlog or the Kafka clock, when the first comes due).
        Items on the CDC clock are left out: it moves only with what the CDC topics deliver, so a stopped
        pipeline's rows wait for as long as it stays stopped (checks.pipeline), which no one can wait out. So are
        those on the binlog clock when `change_clock_moves` is False: a change source without heartbeats (Canal)
        moves it only with the commits it delivers, and a quiet shop's last ones wait for the next."""
        frozen = (CDC,) if change_clock_moves else (CDC, BINLOG)
        waiting = [space for space, clock in self.spaces.values()
                   if isinstance(space, Deadlines) and clock not in frozen and space.fresh.items]
        return sum(len(space.fresh.items) for space in waiting), min((s.next_due() for s in waiting), default=None)

    def counters(self, name: str, initial: dict[str, Any]) -> dict[str, Any]:
        self.plain[name] = initial
        return initial

    def expire(self, binlog_time: float, kafka_time: float, cdc_time: float = 0.0) -> dict[str, list[Any]]:
        now = {BINLOG: binlog_time, KAFKA: kafka_time, STREAMS: max(binlog_time, kafka_time), CDC: cdc_time}
        gone = {name: space.expire(now[clock]) for name, (space, clock) in self.spaces.items()}
        return {name: values for name, values in gone.items() if values}

    def dropped(self) -> int:
        return sum(space.dropped for space, _ in self.spaces.values())

    def dropped_by_space(self) -> dict[str, dict[str, int]]:
        """Saved space -> {"age": n, "count": n}: what fell off the horizon, and what over `max_entries`."""
        return {name: {AGE: a.dropped - a.crowded, COUNT: a.crowded} for name, (a, _, _) in self.saved.items()}

    def held(self) -> int:
        """Entries held over all spaces (keys, not the items under them)."""
        return sum(len(space) for space, _ in self.spaces.values())

    def _head(self) -> dict[str, Any]:
        return {"plain": self.plain, "dropped": {name: a.dropped for name, (a, _, _) in self.saved.items()},
                "crowded": {name: a.crowded for name, (a, _, _) in self.saved.items()}}

    def dump(self) -> dict[str, Any]:
        return {**self._head(), "entries": {name: a.rows(enc) for name, (a, enc, _) in self.saved.items()}}

    def delta(self) -> dict[str, Any]:
        return {**self._head(), "changes": {name: a.changes(enc) for name, (a, enc, _) in self.saved.items()}}

    def load(self, d: dict[str, Any]) -> None:
        """`d` as `dump` gives it; `d["cold"]` may count, per space, entries left in the cold tier."""
        for name, (aging, _, decode) in self.saved.items():
            # a space added since the state was saved starts empty
            aging.load(d["entries"].get(name, []), decode, d.get("cold", {}).get(name, 0))
            aging.dropped = d["dropped"].get(name, 0)
            aging.crowded = d.get("crowded", {}).get(name, 0)
        for name, values in self.plain.items():
            values.clear()
            values.update(d["plain"].get(name, {}))  # a space added since the state was saved starts empty
