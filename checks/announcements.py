"""F7 missing_event, F8 orphan_event, F9 duplicate_event, F10 event_delay: changes against events.

Each [[announce]] entry says which committed change must show up as which event; both sides
are reduced to a match key "topic + event_type + key" and paired first in, first out: the
n-th change of a key with its n-th event, however the two streams interleave (a key may be
announced many times: an order paid, refunded, paid again). An F7 is about one committed
change (its transaction id and row index); F8, F9 and F10 are about the announced key (event
type + key), so the orphans and duplicates of one key stay one finding whichever of them was
judged first.

- A change waits in `waiting`. It is *missing* (F7) once Kafka has been read past
  `commit + missing_event_grace_seconds` without its event. The backlog of its table (F11's
  input) counts the changes still within that grace: in flight, not yet judged; a change
  judged missing is an F7 finding and leaves the backlog, even while it waits for a late event.
  F11 judges the backlog as of the Kafka clock (`backlog_as_of`): a change committed after the
  point Kafka has been read to may well have its event on Kafka, unread, and counting it would
  report the monitor's own lag as the shop's.
- An event that finds no change waiting waits in `unmatched`, even when its key was announced
  before: its own change may not have been read yet. Once the binlog has been read past
  `event + orphan_event_grace_seconds` without one, it is a *duplicate* (F9) if an earlier
  event announced the same key (benign when their payloads are equal, conflicting when they
  differ), else an *orphan* (F8). Either way it stays matchable: a change committed later
  still pairs with it, as it would have had the binlog been read first.
- A pair gives a delay (event time - commit time), observed per commit clock; above
  `event_delay_seconds` it is an F10. A pair that is late beyond a grace period settles the
  F7/F8 (resolved, with why), or raises the F9, whether or not the timer had already judged
  it: the result depends on the data, not on how the two streams interleaved.
- The watch starts where the change stream starts: the snapshot the monitor began from (the
  bootstrap's, or the CDC connector's; `watch_start` is its time, `Engine.on_transaction` sets it
  with the snapshot's last part). Every event from then on is judged, whether or not a change was
  announced before it. Events from before it are never judged as orphans or duplicates: their change
  may simply predate us; they stay matchable until the horizon. Until the watch starts, no event is
  judged (a data-defined start, so the result does not depend on when the timer ran). A store whose
  stream began with no snapshot (CDC topics trimmed) starts its watch at the first announced change.
- A change committed before the snapshot is not in the stream, but the snapshot shows its result:
  each snapshot row that an entry's change could have left (a row its `on = "insert"` made, an order
  in the status it `becomes`) is an announcement made before the start (`BEFORE_START` in
  `announced`), which explains the first event of its key, whenever it is read, as a change would.
  A delete leaves no row to show: the events of `on = "delete"` entries within the missing-event
  grace after the start are not judged.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

from oncewatch.checks.findings import Findings, event_evidence, finding_id, row_evidence, warn_null_key
from oncewatch.checks.horizon import BINLOG, KAFKA, Memory
from oncewatch.core.domain import Announce, Rules
from oncewatch.core.names import key_of, key_text
from oncewatch.core.paths import compile_path, lookup, without
from oncewatch.core.records import OP_DELETE, EmittedEvent, RowChange

log = logging.getLogger("oncewatch.checks.announcements")

# In `announced`: the key's change was committed before the watch started (a snapshot row shows its result) and no
# event read has announced it yet; its first event is that change's.
BEFORE_START = "changed before the start"

# Upper bounds (seconds) of the delay histogram: Prometheus' defaults, stretched to minutes.
DELAY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def payload_digest(payload: Any) -> str:
    """Stable across processes. A replay carries the same bytes, so its parsed payload has the same
    key order and repr; payloads that differ only in key order count as different (cheap, and rare)."""
    return hashlib.blake2b(repr(payload).encode(), digest_size=12).hexdigest()


def comparer(a: Announce) -> Callable[[Any], str]:
    """What F9 compares of an event's payload, as a digest: the whole payload, only the values at
    `a.compare`, or all but those at `a.ignore` (an envelope's own id, time and trace id differ between two
    sends of one business fact, which are then equal)."""
    if a.compare:
        paths = tuple(map(compile_path, a.compare))
        return lambda payload: payload_digest([lookup(payload, p) for p in paths])
    if a.ignore:
        paths = tuple(map(compile_path, a.ignore))
        return lambda payload: payload_digest(without(payload, paths))
    return payload_digest


def match_key(a: Announce, key: Any) -> str:
    return f"{a.topic}\x1f{a.event_type}\x1f{key_text(key)}"


class Announcements:
    def __init__(self, announce: tuple[Announce, ...], rules: Rules, memory: Memory, findings: Findings):
        self.rules = rules
        self.by_table: dict[str, list[Announce]] = {}
        for a in announce:
            self.by_table.setdefault(a.table, []).append(a)
        self.by_event = {(a.topic, a.event_type): a for a in announce}
        self.digest = {(a.topic, a.event_type): comparer(a) for a in announce}
        # what the summary of an F9 says was compared, where not the whole payload
        self.compared = {(a.topic, a.event_type): f" (compared: {', '.join(a.compare)})" if a.compare
                         else f" (all but {', '.join(a.ignore)})" if a.ignore else "" for a in announce}
        # match key -> [{"t": commit time, "clock", "table", "tx", "row", "ev"}]
        self.waiting = memory.deadlines("waiting_changes", BINLOG, rules.missing_event_grace_seconds)
        # match key -> [{"t": event time, "h": payload digest, "ev", "p": (digest, evidence) of the key's
        #                event before it, if any}]
        self.unmatched = memory.deadlines("unmatched_events", KAFKA, rules.orphan_event_grace_seconds)
        # match key -> (payload digest, evidence) of the last event read that announced it, or BEFORE_START
        self.announced = memory.aging("announced", KAFKA, spill=True)
        self.delay = memory.counters("delay", {})
        # snapshot_done: the snapshot the stream began with has been read whole (its rows seed no more)
        self.marks = memory.counters("marks", {"watch_start": None, "snapshot_done": False})
        self.backlog: dict[str, int] = {}
        self.recount()
        self.findings = findings

    def recount(self) -> None:
        """Backlog per table, rebuilt from the changes still within their grace (after a restore)."""
        self.backlog = dict.fromkeys(self.by_table, 0)
        for items in self.waiting.fresh.values():
            for item in items:
                self.backlog[item["table"]] += 1

    def backlog_as_of(self, kafka_time: float) -> dict[str, int]:
        """The backlog without the changes committed after `kafka_time` (a walk from the newest change back to
        that time: nothing once Kafka is read to its end)."""
        unread = dict.fromkeys(self.backlog, 0)
        for t, items in reversed(self.waiting.fresh.items.values()):
            if t <= kafka_time:
                break
            for item in items:
                unread[item["table"]] += item["t"] > kafka_time
        return {table: n - unread[table] for table, n in self.backlog.items()}

    def forget(self, changes: Iterable[dict[str, Any]]) -> None:
        """Waiting changes that fell off the horizon leave the backlog (those judged missing left it then)."""
        for item in changes:
            if not item.get("missing"):
                self.backlog[item["table"]] -= 1

    # ------------------------------------------------------------ input

    def snapshot_done(self, at: float) -> None:
        """The snapshot the change stream began with is read whole; `at`, its time, starts the watch."""
        self.marks["snapshot_done"] = True
        if self.marks["watch_start"] is None:
            self.marks["watch_start"] = at

    def _before_start(self, entries: list[Announce], row: RowChange) -> None:
        """A snapshot row: the announcements its row shows were made before the start (module docstring)."""
        for a in entries:
            key = key_of(row.after, a.key_columns) if a.left(row.after) else None
            if key is None:
                continue
            mk = match_key(a, key)
            if self.unmatched.take(mk) is None:  # else the event read while the snapshot was, explained
                self.announced.put(mk, BEFORE_START, row.commit_time)

    def on_change(self, entries: list[Announce], change: RowChange) -> None:
        """`entries`: the [[announce]] entries of the change's table."""
        if change.snapshot:
            if not self.marks.get("snapshot_done"):  # a later re-snapshot repeats what the stream has shown
                self._before_start(entries, change)
            return
        if self.marks["watch_start"] is None:
            self.marks["watch_start"] = change.commit_time
        for a in entries:
            if not a.selects(change.op, change.before, change.after):
                continue
            columns = a.key_columns
            key = change.row.get(columns[0]) if len(columns) == 1 else key_of(change.row, columns)
            if key is None:
                warn_null_key("announced change", change.coordinates)
                continue
            mk = match_key(a, key)
            item = {"t": change.commit_time, "clock": change.commit_clock, "table": a.table, "tx": change.txid,
                    "row": change.row_index, "ev": row_evidence(change, a.columns)}
            taken = self.unmatched.take(mk)
            if taken is None:
                self.waiting.add(mk, item)
                self.backlog[a.table] += 1
            else:
                self._pair(a, key_text(key), item, False, *taken)

    def on_event(self, event: EmittedEvent) -> None:
        a = self.by_event.get((event.topic, event.keys.get("event_type")))
        if a is None:
            return
        key = event.keys.get(a.event_key)
        if key is None:
            warn_null_key("announcing event", event.coordinates)
            return
        mk = match_key(a, key)
        t = event.timestamp_ms / 1000.0
        item = {"t": t, "h": self.digest[event.topic, a.event_type](event.payload), "ev": event_evidence(event)}
        announced = self.announced
        before = announced.get(mk)
        announced.put(mk, (item["h"], item["ev"]), t)
        if before == BEFORE_START:  # the event of a change committed before the start: older than any waiting
            return
        if before is not None:
            item["p"] = before
        taken = self.waiting.take(mk)
        if taken is None:
            self.unmatched.add(mk, item)
        else:
            if not taken[1]:  # judged missing already: it left the backlog then
                self.backlog[a.table] -= 1
            self._pair(a, key_text(key), *taken, item, False)

    # ------------------------------------------------------------ verdicts

    def _pair(self, a: Announce, key: str, change: dict[str, Any], change_overdue: bool,
              event: dict[str, Any], event_overdue: bool) -> None:
        """Match one change with one event; `*_overdue` says the timer already judged that side."""
        r, keys = self.rules, {"event_type": a.event_type, "key": key, "table": a.table}
        c, e = change["t"], event["t"]
        delay = e - c
        self._observe(change["clock"], delay)
        evidence = [change["ev"], event["ev"]]
        if change_overdue or delay > r.missing_event_grace_seconds:
            self.findings.settle("F7", (change["tx"], change["row"]), keys=keys, summary=self._missing(a, key),
                                 since=c + r.missing_event_grace_seconds, evidence=evidence, at=e,
                                 why=f"event arrived {delay:.3f}s after the commit at {event['ev'][1]}")
        if (event_overdue or -delay > r.orphan_event_grace_seconds) and self._watched(a, e):
            # The event outwaited its grace: a duplicate of the one before it, or an orphan until now.
            if "p" in event:
                self._duplicate(a, key, event)
            else:
                self.findings.settle("F8", (a.event_type, key), keys=keys, summary=self._orphan(a, key),
                                     since=e + r.orphan_event_grace_seconds, evidence=evidence, at=c,
                                     why=f"change committed {-delay:.3f}s after the event at {change['ev'][1]}")
        if delay > r.event_delay_seconds:
            self.findings.raise_("F10", (a.event_type, key), keys={**keys, "delay_seconds": round(delay, 6),
                                                                   "clock": change["clock"]},
                                 summary=f"{a.event_type} {key} reached Kafka {delay:.3f}s after its commit "
                                         f"({change['clock']} clock)", time=e, evidence=evidence)

    def _duplicate(self, a: Announce, key: str, event: dict[str, Any]) -> None:
        """`event` found no change of its own within the grace, and an earlier event announced its key."""
        digest, first = event["p"]
        old = self.findings.get(finding_id("F9", a.event_type, key))
        conflicting = event["h"] != digest or (old is not None and old.severity == "critical")
        self.findings.raise_(
            "F9", (a.event_type, key), keys={"event_type": a.event_type, "key": key, "table": a.table},
            severity="critical" if conflicting else "info",
            summary=f"{a.event_type} {key} announced more than once; payloads{self.compared[a.topic, a.event_type]} "
                    + ("differ (conflicting)" if conflicting else "equal (at-least-once replay)"),
            time=event["t"], evidence=[first, event["ev"]])

    def _watched(self, a: Announce, t: float) -> bool:
        """An event of `a` at `t` is judged: read after the watch started (and, of a delete, after the grace
        within which a delete committed before the start may still be announced)."""
        start = self.marks["watch_start"]
        return t >= start + self.rules.missing_event_grace_seconds if a.on == OP_DELETE else t >= start

    def _split(self, mk: str) -> tuple[Announce, str]:
        topic, event_type, key = mk.split("\x1f", 2)
        return self.by_event[topic, event_type], key

    def _missing(self, a: Announce, key: str) -> str:
        grace = self.rules.missing_event_grace_seconds
        return f"{a.event_type} {key}: committed change not announced within {grace:g}s"

    def _orphan(self, a: Announce, key: str) -> str:
        grace = self.rules.orphan_event_grace_seconds
        return f"{a.event_type} {key}: event without a committed change within {grace:g}s"

    def _observe(self, clock: str, delay: float) -> None:
        h = self.delay.setdefault(clock, {"counts": [0] * (len(DELAY_BUCKETS) + 1), "sum": 0.0, "count": 0})
        h["counts"][bisect.bisect_left(DELAY_BUCKETS, delay)] += 1
        h["sum"] += delay
        h["count"] += 1

    # ------------------------------------------------------------ timer

    def tick(self, binlog_time: float, kafka_time: float) -> None:
        r = self.rules
        for mk, item in self.waiting.due(kafka_time):
            a, key = self._split(mk)
            item["missing"] = True
            self.backlog[a.table] -= 1
            self.findings.raise_("F7", (item["tx"], item["row"]), keys={"event_type": a.event_type, "key": key,
                                                                       "table": a.table},
                                 summary=self._missing(a, key), time=item["t"] + r.missing_event_grace_seconds,
                                 evidence=[item["ev"]])
        if self.marks["watch_start"] is None:
            return
        before_watch = 0
        for mk, item in self.unmatched.due(binlog_time):
            a, key = self._split(mk)
            if not self._watched(a, item["t"]):
                before_watch += 1
            elif "p" in item:
                self._duplicate(a, key, item)
            else:
                self.findings.raise_("F8", (a.event_type, key), keys={"event_type": a.event_type, "key": key,
                                                                      "table": a.table},
                                     summary=self._orphan(a, key), time=item["t"] + r.orphan_event_grace_seconds,
                                     evidence=[item["ev"]])
        if before_watch:
            log.info("events from before the binlog watch started, not judged", extra={
                "event": "events_before_watch", "count": before_watch, "watch_start": self.marks["watch_start"]})

    def stats(self) -> dict[str, Any]:
        delay = {}
        for clock, h in self.delay.items():
            running, buckets = 0, {}
            for bound, n in zip((*map(str, DELAY_BUCKETS), "+Inf"), h["counts"]):
                running += n
                buckets[bound] = running
            delay[clock] = {"buckets": buckets, "sum": h["sum"], "count": h["count"]}
        return {"delay": delay}
