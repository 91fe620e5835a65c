"""F11 offset_drift and F12 partition_skew: readings that open while above a threshold.

F11 has two sources: the backlog of committed changes per table not yet announced on Kafka
(from oncewatch.checks.announcements), and the total lag of each watched consumer group. F12 is the
population standard deviation of the per-partition lag of one group on one topic (the
second seed article's `stddev(partition_lag) > 3.0`) when it is also more than
`partition_skew_relative` of the mean lag: a group stalled on every partition lags unevenly in
records only because its partitions receive unevenly, and that is F11's stall, not skew; and
when it has held for `partition_skew_seconds`: at the start of a stall the lags are a handful of
records and briefly look uneven. Each finding holds the latest reading as its evidence and
resolves when the reading drops back.
Partitions a group has never committed (lag None) are left out, not read as 0.
A group read again after a reading of it failed (the broker away, or the group's own reading) settles for
`lag_settle_seconds`: its lag is not raised as F11 or F12 meanwhile (a finding open stays open, and resolves if the
reading drops back), since consumers catching up on what was kept while the broker was away is maintenance, and a
skew's hold starts when the settle ends.
"""

from __future__ import annotations

from typing import Any

from oncewatch.checks.findings import EvidenceItem, Findings, finding_id, offsets_evidence
from oncewatch.core.domain import Rules
from oncewatch.core.records import OffsetsSnapshot


class OffsetChecks:
    def __init__(self, rules: Rules, findings: Findings):
        self.drift = rules.offset_drift_threshold
        self.skew = rules.partition_skew_threshold
        self.relative = rules.partition_skew_relative
        self.hold = rules.partition_skew_seconds
        self.settle = rules.lag_settle_seconds
        self.findings = findings
        # (group, topic) -> when its lag was first seen skewed, or its group's settle ends, in this process: a restart
        # only makes F12 wait its hold again (offsets are live readings, not a stream to replay).
        self.skewed_since: dict[tuple[str, str], float] = {}
        self.settling: dict[str, float] = {}  # group -> when its settle ends
        self.lag_held: dict[str, float] = {}  # group -> its settle's end, while its lag over the threshold waits it
        self.read_last: set[str] | None = None  # the groups the previous reading had (None: no reading yet)
        self.seen: set[str] = set()  # the groups read in this process
        self.polled_at = 0.0  # the newest reading's time

    def _reading(self, rule: str, identity: tuple[str, ...], above: bool, keys: dict[str, Any], summary: str,
                 time: float, evidence: list[EvidenceItem], why: str) -> None:
        if above:
            self.findings.raise_(rule, identity, keys=keys, summary=summary, time=time, evidence=evidence, replace=True)
        else:
            self.findings.resolve(finding_id(rule, *identity), time, why)

    def on_backlog(self, now: float, backlog: dict[str, int]) -> None:
        for table, n in backlog.items():
            self._reading("F11", ("backlog", table), n > self.drift, {"table": table, "backlog": n},
                          f"{n} committed changes of {table} not yet announced (threshold {self.drift})", now,
                          [offsets_evidence(f"backlog:{table}", now, {"waiting": n})],
                          f"backlog down to {n}")

    def undecided(self) -> tuple[int, float | None]:
        """(skews seen and not yet held for `partition_skew_seconds`, and lags over the threshold waiting out their
        group's settle; when the first of them is due)."""
        due = [t + self.hold for t in self.skewed_since.values() if self.polled_at - t < self.hold]
        due += [t for t in self.lag_held.values() if t > self.polled_at]
        return len(due), min(due) if due else None

    def on_offsets(self, snapshot: OffsetsSnapshot) -> None:
        at = self.polled_at = snapshot.polled_at
        # A reading that failed (the broker away) watched no skew: a skew's hold starts again at the next reading
        # that shows it, never across the gap (seen: a skew read just before a broker was killed and again as it
        # came back, a consumer catching up, raised F12 at the first reading after 20 s of none).
        read = {group.group for group in snapshot.groups if group.partitions}
        self.skewed_since = {key: since for key, since in self.skewed_since.items() if key[0] in read}
        # A group settles when the reading before failed for it: it had been read in this process, or that reading
        # failed whole. A process's first reading settles nothing: a stall found at a monitor's start pages.
        for name in read - self.read_last if self.read_last is not None else ():
            if name in self.seen or not self.read_last:
                self.settling[name] = at + self.settle
        self.read_last = read
        self.seen |= read
        self.settling = {name: until for name, until in self.settling.items() if until > at}
        self.lag_held = {}
        ends = {(p.topic, p.partition): p.end for p in snapshot.partitions}
        for group in snapshot.groups:
            name, parts = group.group, group.partitions
            evidence = [offsets_evidence(f"{name}:{p.topic}/{p.partition}", at, {
                "committed": p.committed, "end": ends.get((p.topic, p.partition)), "lag": p.lag,
                "lag_seconds": p.lag_seconds, "group_state": group.state}) for p in parts]
            lag, settles = group.total_lag, self.settling.get(name, at)
            if lag > self.drift and settles > at:
                self.lag_held[name] = settles  # a finding still open stays open
            else:
                self._reading("F11", ("lag", name), lag > self.drift, {"group": name, "lag": lag},
                              f"consumer group {name} is {lag} records behind (threshold {self.drift})", at,
                              evidence, f"lag down to {lag}")
            for topic, skew in sorted(group.skew_by_topic().items()):
                skewed = skew.stddev > self.skew and skew.relative > self.relative
                if not skewed:
                    self.skewed_since.pop((name, topic), None)
                elif at - self.skewed_since.setdefault((name, topic), settles) < self.hold:
                    # skewed, but not yet for the hold in this process, after the group's settle: a finding still
                    # open stays open (a restart, or a group member taking the readings over, once resolved it as if
                    # the skew had gone)
                    continue
                self._reading("F12", (name, topic), skewed,
                              {"group": name, "topic": topic, "stddev": round(skew.stddev, 3),
                               "relative": round(skew.relative, 3)},
                              f"lag of {name} on {topic} is uneven across partitions: stddev {skew.stddev:.2f}, "
                              f"{skew.relative:.2f} of the mean (thresholds {self.skew:g} and {self.relative:g})", at,
                              [e for e, p in zip(evidence, parts) if p.topic == topic],
                              f"stddev down to {skew.stddev:.2f}, {skew.relative:.2f} of the mean")
