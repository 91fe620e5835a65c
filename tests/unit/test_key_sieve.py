"""The cold tier's key sieve (checks.horizon.KeySieve, issue 44): a key new to the engine costs no store read."""

from __future__ import annotations

from typing import Any

from oncewatch.checks.horizon import Aging, KeySieve


class CountedCold:
    """checks.horizon.Cold over a dict, counting the reads of a key."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, tuple[float, Any]]] = {}
        self.gets = 0

    def save(self, space: str, put: list[list[Any]]) -> None:
        self.rows.setdefault(space, {}).update({k: (t, v) for k, t, v in put})

    def get(self, space: str, key: str) -> tuple[float, Any] | None:
        self.gets += 1
        return self.rows.get(space, {}).get(key)

    def drop_before(self, space: str, cutoff: float) -> list[str]:
        gone = [k for k, (t, _) in self.rows.get(space, {}).items() if t < cutoff]
        for k in gone:
            del self.rows[space][k]
        return gone

    def drop_oldest(self, space: str, n: int) -> list[str]:
        oldest = sorted(self.rows.get(space, {}), key=lambda k: self.rows[space][k][0])[:n]
        for k in oldest:
            del self.rows[space][k]
        return oldest

    def drop_all(self, space: str) -> None:
        self.rows.pop(space, None)

    def keys(self, space: str) -> list[str]:
        return list(self.rows.get(space, {}))


def spilled(hot: int, entries: int) -> tuple[Aging[int], CountedCold]:
    """An Aging holding `entries`, saved, with all but about `hot` of them evicted to the cold tier."""
    cold = CountedCold()
    aging: Aging[int] = Aging(horizon=1e9, max_entries=10**9)
    aging.name, aging.cold, aging.hot = "space", cold, hot
    aging.changes(lambda v: v)
    for i in range(entries):
        aging.put(f"K{i}", i, float(i))
    cold.save("space", aging.changes(lambda v: v)["put"])
    aging.evict()
    return aging, cold


def test_keys_never_spilled_are_answered_without_a_read_and_spilled_ones_are_read_back() -> None:
    aging, cold = spilled(hot=1000, entries=5000)
    assert aging.cold_count > 3000 and cold.gets == 0
    assert [aging.get(f"new{i}") for i in range(10_000)] == [None] * 10_000
    assert cold.gets < 400  # about 1.4% false positives: without the sieve, 10,000 reads
    assert aging.get("K0") == 0 and aging.get("K10") == 10  # evicted, still there
    assert len(aging) == 5000


def test_a_restored_space_sieves_the_keys_its_cold_tier_holds() -> None:
    aging, cold = spilled(hot=1000, entries=5000)
    rows = [[k, t, v] for k, (t, v) in cold.rows["space"].items()]
    restored: Aging[int] = Aging(horizon=1e9, max_entries=10**9)
    restored.name, restored.cold, restored.hot = "space", cold, 1000
    newest = sorted(rows, key=lambda r: r[1])[-1000:]
    restored.load(newest, lambda v: v, cold=len(rows) - len(newest))
    cold.gets = 0
    assert restored.get("K5") == 5 and restored.get("absent") is None
    assert cold.gets <= 2


def test_a_sieve_says_present_for_every_key_it_was_given() -> None:
    sieve = KeySieve((f"k{i}" for i in range(2000)), 2000)
    assert all(f"k{i}" in sieve for i in range(2000)) and not sieve.full
    sieve.add("one more")
    assert sieve.full
