"""One health verdict for the whole monitor: healthy, degraded or failing, with its reasons.

- failing: a part of the monitor cannot see its stream: a reader is down (failed, restarting) or
  has shown no life for STALE_SECONDS, or a collector is disconnected. Rules fed by that stream
  cannot judge, so nothing the monitor says about it is to be trusted until this clears;
- degraded: it sees everything but late or partly: the first bootstrap still reading the watched
  tables (the binlog tail starts after it), a stream read more than `rules.caught_up_seconds` behind,
  an offsets poll that failed;
- healthy: none of these;
- stopped: the last word of a monitor that stops cleanly (what else was wrong still said).

A watched consumer group far behind is the shop's state, not the monitor's (F11 says it, and the dashboard's
verdict on the shop, oncewatch.dashboards.views.shop_state): the two verdicts are never mixed (docs/architecture.md §4).

A rule that reads a stream its monitor cannot see (a failing reader or collector, or a failed
offsets poll) cannot judge: it is *blind* (unknown on /metrics), never green. A shape problem
(checks.shape) blinds the rules that read the broken column for that table only (`blind_tables`):
they go on judging the others.

"Caught up" is the reading of people and alerts: no bootstrap under way, and both streams read
to within `caught_up_seconds`. (The absence rules' own clocks stay exact: oncewatch.monitor.writer.)
Plain data in, plain data out, so it is tested without servers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from oncewatch.checks.shape import blinds
from oncewatch.core.names import BINLOG, CDC, DEGRADED, FAILING, HEALTHY, KAFKA_EVENTS, KAFKA_OFFSETS, STOPPED
from oncewatch.core.protocol import BootstrapStatus, CdcStatus, ComponentHealth, StoreSpace
from oncewatch.core.records import OffsetsSnapshot

STOPPED_REASON = "stopped: nothing is read until `oncewatch run` starts again"
# A reader silent this long is stuck (heartbeats come every few seconds, polls every half second).
STALE_SECONDS = 60.0


NO_HEARTBEATS = ("; no heartbeat of the CDC connector is read (cdc.heartbeat_topic): its change clock moves only "
                 "with the commits it delivers, so F3, F8 and F9 wait for the next one")


def _without_heartbeats(row: ComponentHealth | None) -> bool:
    """A CDC source (its health row) that has read no heartbeat of its connector."""
    return row is not None and isinstance(row.status, CdcStatus) and not row.status.heartbeats_read


def _bootstrapping(row: ComponentHealth) -> bool:
    return isinstance(row.status, BootstrapStatus) and row.status.bootstrapping


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reasons: tuple[str, ...]
    caught_up: bool
    lag_seconds: dict[str, float]  # stream -> how far behind it is read (0 when read to its end)
    blind: tuple[str, ...] = ()  # the rules that cannot judge now: a stream they need is not seen
    # rule -> the watched tables a shape problem blinds it for (it judges the others)
    blind_tables: dict[str, tuple[str, ...]] = field(default_factory=dict)


# How long after raw records were last pruned for the budget the verdict still says so.
BUDGET_RECENT_SECONDS = 600.0

# What each rule reads: a rule whose collector is failing cannot judge (it is unknown, never green).
RULE_INPUTS: dict[str, tuple[str, ...]] = {
    **{rule: (BINLOG,) for rule in ("F1", "F2", "F3", "F4", "F5", "F6")},
    **{rule: (BINLOG, KAFKA_EVENTS) for rule in ("F7", "F8", "F9", "F10")},
    "F11": (BINLOG, KAFKA_EVENTS, KAFKA_OFFSETS), "F12": (KAFKA_OFFSETS,),
    # the CDC topics are read by the binlog's reader in CDC source mode, by their own in check mode
    **{rule: (BINLOG, CDC) for rule in ("F13", "F14", "F15", "F16")},
}


def budget_reasons(now: float, space: StoreSpace | None) -> list[str]:
    """What the store's budget says, for people: the budget spent on what is never pruned, or raw records pruned
    for it lately (the drill-down then keeps less than store.retention_hours of them)."""
    if space is None:
        return []
    used, budget = space.used_bytes / 2**20, space.max_bytes / 2**20
    if space.exhausted:
        return [f"store.max_bytes: {used:,.1f} MiB in use over a budget of {budget:,.1f} MiB, all of it the engine's "
                f"open state and the findings, which are never pruned: raise store.max_bytes"]
    if space.pruned_at is not None and now - space.pruned_at <= BUDGET_RECENT_SECONDS:
        return [f"store.max_bytes: the store is at {used:,.1f} of its {budget:,.1f} MiB; the oldest raw records are "
                f"pruned to keep it there (last {now - space.pruned_at:,.0f} s ago), so fewer than "
                f"store.retention_hours of them are kept"]
    return []


def judge(now: float, components: Mapping[str, ComponentHealth], lag_seconds: Mapping[str, float], *,
          caught_up_seconds: float, shape: Sequence[Mapping[str, Any]] = (),
          reads: Mapping[str, Sequence[str]] | None = None, stopped: bool = False,
          space: StoreSpace | None = None) -> Verdict:
    """`components`: each collector's health row (its status and its `reader` part); `lag_seconds`:
    per stream, how far behind it is read; `shape`: the engine's standing shape problems
    (checks.shape), each blinding the rules that read the column for its table; `reads`: per rule the tables it
    reads (Engine.reads: a rule that judges across tables is blind for all of them). `stopped`: the last verdict of a
    monitor that stops: STOPPED, every rule blind, its readers' being down no reason (they were stopped),
    what else was wrong still said. `space`: the store against its budget (store.max_bytes), which degrades the
    monitor while it prunes raw records for it, or cannot."""
    failing: list[str] = []
    degraded: list[str] = []
    down: set[str] = set()
    for name, row in components.items():
        reader, status = row.reader, row.status
        alive_at = reader.alive_at
        if not reader.running:
            failing.append(f"{name} reader down ({reader.last_failure or 'not running'})")
        elif alive_at is not None and now - alive_at > STALE_SECONDS:
            failing.append(f"{name} reader silent for {now - alive_at:.0f} s")
        elif isinstance(status, OffsetsSnapshot):
            if status.error:
                degraded.append(f"offsets poll failed: {status.error}")
                down.add(name)
            continue
        elif not status.connected:
            failing.append(f"{name} disconnected ({status.last_error or 'connecting'})")
        else:
            if isinstance(status, BootstrapStatus) and status.bootstrapping:
                degraded.append(f"bootstrapping: {status.bootstrap_rows} rows of the watched tables read, "
                                f"now {status.bootstrap_table or 'starting'}; the binlog tail starts after it")
            continue
        down.add(name)
    why_behind = {BINLOG: NO_HEARTBEATS} if _without_heartbeats(components.get(BINLOG)) else {}
    for stream, lag in sorted(lag_seconds.items()):
        if lag > caught_up_seconds:
            degraded.append(f"{stream} read {lag:.1f} s behind (caught up means within {caught_up_seconds:g} s)"
                            + why_behind.get(stream, ""))
    degraded += budget_reasons(now, space)
    for problem in shape:
        degraded.append(f"{problem['config_key']}: {problem['what']} ({', '.join(problem['rules'])} cannot judge)")
    blind_tables = {rule: tuple(sorted(tables)) for rule, tables in sorted(blinds(shape, reads or {}).items())}
    if stopped:
        return Verdict(STOPPED, (STOPPED_REASON, *degraded), False, dict(lag_seconds), tuple(RULE_INPUTS), blind_tables)
    verdict = FAILING if failing else DEGRADED if degraded else HEALTHY
    bootstrapping = any(map(_bootstrapping, components.values()))
    caught_up = not failing and not bootstrapping and all(lag <= caught_up_seconds for lag in lag_seconds.values())
    blind = tuple(rule for rule, inputs in RULE_INPUTS.items() if down & {i for i in inputs if i in components})
    return Verdict(verdict, tuple(failing + degraded), caught_up, dict(lag_seconds), blind, blind_tables)
