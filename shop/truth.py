"""Ground truth: the faults a run injected, with the keys the monitor's findings will carry.

Every run writes it as JSON so that a scoring test can say, for each fault, whether the
monitor found it and, for each finding, whether a fault is behind it:

    {"seed": 7, "style": "after_commit", "run_tag": "k3x9a", "orders": 3000,
     "mix": {"send_lost": 0.02, ...},
     "faults": [{"mode": "send_lost", "rule": "F7",
                 "keys": {"event_type": "order.paid", "entity_id": "Ok3x9a0000042",
                          "order_no": "Ok3x9a0000042", "trade_no": "APk3x9a00000421",
                          "table": "shop.orders"},
                 "also": [], "detail": {"kind": "lost", "event_id": "..."}}, ...],
     "start": {"binlog_gtid": "0-1-4242", "kafka_end_offsets": {"0": 0, "1": 0, "2": 0}},
     "consumers": {"shipping-service": {"lag": {"0": 0, ...}, "total": 0, "stddev": 0.0}, ...},
     "stats": {"orders_per_second": 61.2, "events_sent": 9120, ...},
     "incidents": []}

`keys` use the shop's names (order_no, trade_no, event_type, entity_id, table, group,
topic); the monitor's names order / order_key and key / effect_id are read as aliases.
A finding matches a fault (`Fault.matches`) when its rule is the fault's rule or one of
`also` (effects the fault really causes under another rule), every key both carry has the
same value, and they share at least one key. `incidents` lists anything the shop did that
no fault explains (an unexpected send failure): a run with incidents cannot be scored.

`late_sends` are no faults: clean sends the shop itself made LATE_SECONDS or more after their row's
time, on a machine too busy to send sooner (mode "late_send", rule F10, the measured delay in
`detail`). The shop stamps each record with its send time and knows its row's time column, so this
is exactly the delay the monitor judges; an F10 on such a send is right and explained (`explains`),
but nobody placed it, so it counts in no recall.

`slow_pendings` are no faults either: clean orders the shop itself left pending SLOW_PENDING_SECONDS or more, from
the commit that placed them to the one that moved them on, on a machine too busy to go sooner (mode "slow_pending",
rule F3, the measured time in `detail`). An F3 on such an order is right and explained, and counts in no recall.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

LATE_SECONDS = 0.25  # half the lowest event_delay_seconds any run here judges with
LATE_MODE = "late_send"
SLOW_PENDING_SECONDS = 3.0  # half the lowest stuck_pending_seconds any run here judges with
SLOW_PENDING_MODE = "slow_pending"

# Key names the monitor uses (checks' finding keys, examples/shop.toml paths) -> the shop's names.
KEY_ALIASES = {"order": "order_no", "order_key": "order_no", "key": "entity_id", "effect_id": "entity_id"}


@dataclass(frozen=True)
class Fault:
    mode: str
    rule: str
    keys: dict[str, str]
    also: tuple[str, ...] = ()
    detail: dict[str, Any] = field(default_factory=dict)

    def matches(self, rule: str, keys: dict[str, Any]) -> bool:
        if rule != self.rule and rule not in self.also:
            return False
        theirs = {KEY_ALIASES.get(k, k): str(v) for k, v in keys.items() if v is not None}
        shared = self.keys.keys() & theirs.keys()
        return bool(shared) and all(self.keys[k] == theirs[k] for k in shared)


@dataclass(frozen=True)
class GroundTruth:
    seed: int
    style: str
    run_tag: str
    orders: int
    mix: dict[str, float]
    faults: tuple[Fault, ...]
    start: dict[str, Any]
    consumers: dict[str, Any]
    stats: dict[str, Any]
    incidents: tuple[str, ...] = ()
    late_sends: tuple[Fault, ...] = ()
    slow_pendings: tuple[Fault, ...] = ()

    def by_rule(self, rule: str) -> list[Fault]:
        return [f for f in self.faults if f.rule == rule]

    def fault_for(self, rule: str, keys: dict[str, Any]) -> Fault | None:
        """The fault behind a finding of `rule` with these entity keys, if there is one (the first placed)."""
        return _first_match(self.faults, self._by_key, rule, keys)

    def explains(self, rule: str, keys: dict[str, Any]) -> bool:
        """A fault is behind the finding, or a send the shop itself made late (F10), or an order it itself left
        pending long (F3)."""
        return (self.fault_for(rule, keys) is not None
                or _first_match(self.late_sends, self._late_by_key, rule, keys) is not None
                or _first_match(self.slow_pendings, self._slow_by_key, rule, keys) is not None)

    @cached_property
    def _by_key(self) -> dict[tuple[str, str, str], list[int]]:
        return _index(self.faults)

    @cached_property
    def _late_by_key(self) -> dict[tuple[str, str, str], list[int]]:
        return _index(self.late_sends)

    @cached_property
    def _slow_by_key(self) -> dict[tuple[str, str, str], list[int]]:
        return _index(self.slow_pendings)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def write(self, path: str | Path) -> None:
        """Write the JSON atomically: a scorer polling for the file never reads half of it."""
        target = Path(path)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True))
        os.replace(tmp, target)

    @classmethod
    def load(cls, path: str | Path) -> GroundTruth:
        d = json.loads(Path(path).read_text())
        lists = {name: tuple(Fault(**{**f, "also": tuple(f["also"])}) for f in d.pop(name, ()))
                 for name in ("faults", "late_sends", "slow_pendings")}
        return cls(**{**d, **lists, "incidents": tuple(d["incidents"])})


def _index(faults: tuple[Fault, ...]) -> dict[tuple[str, str, str], list[int]]:
    """(rule, key, value) -> indexes of the faults that carry it: a load run has tens of thousands of
    faults and findings, and trying each fault for each finding took hours."""
    index: dict[tuple[str, str, str], list[int]] = {}
    for i, f in enumerate(faults):
        for rule in (f.rule, *f.also):
            for k, v in f.keys.items():
                index.setdefault((rule, k, v), []).append(i)
    return index


def _first_match(faults: tuple[Fault, ...], index: dict[tuple[str, str, str], list[int]], rule: str,
                 keys: dict[str, Any]) -> Fault | None:
    theirs = {KEY_ALIASES.get(k, k): str(v) for k, v in keys.items() if v is not None}
    candidates = {i for k, v in theirs.items() for i in index.get((rule, k, v), ())}
    return next((faults[i] for i in sorted(candidates) if faults[i].matches(rule, keys)), None)


class Recorder:
    """Collects faults and incidents as they happen, from any thread of the run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._incidents: list[str] = []
        self._late: list[Fault] = []
        self._slow: list[Fault] = []

    def fault(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def incident(self, what: str) -> None:
        with self._lock:
            self._incidents.append(what)

    def sent(self, keys: dict[str, str], delay_seconds: float) -> None:
        """A record was sent `delay_seconds` after its row's time: kept as a late send past LATE_SECONDS."""
        if delay_seconds >= LATE_SECONDS:
            with self._lock:
                self._late.append(Fault(LATE_MODE, "F10", keys, detail={"delay_seconds": round(delay_seconds, 3)}))

    def left_pending(self, order_no: str, seconds: float) -> None:
        """A clean order left pending `seconds` after it was placed: kept as a slow pending past
        SLOW_PENDING_SECONDS."""
        if seconds >= SLOW_PENDING_SECONDS:
            with self._lock:
                self._slow.append(Fault(SLOW_PENDING_MODE, "F3", {"order_no": order_no},
                                        detail={"pending_seconds": round(seconds, 3)}))

    def slow_pendings(self) -> tuple[Fault, ...]:
        with self._lock:
            return tuple(self._slow)

    def late_sends(self) -> tuple[Fault, ...]:
        with self._lock:
            return tuple(self._late)

    def faults(self) -> tuple[Fault, ...]:
        with self._lock:
            return tuple(self._faults)

    def incidents(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._incidents)
