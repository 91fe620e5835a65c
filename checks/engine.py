"""The engine: feeds committed transactions, Kafka events and offset readings to rules F1-F16.

Pure and single-threaded: no I/O, no wall clock. Times come from the records and from the
caller's `tick`, so the same input gives the same findings in any interleaving of the two
streams, and after a restart from `state()` at any point.

API (the monitor loop calls these):

- `Engine(settings)`: `settings` is a `checks.settings.Settings` (`Settings.from_config(cfg)`).
  `Engine(settings, Shard(index, count))`: one of several engines that judge as one (checks.shards), fed the
  parts `Router.split` gives its shard, `start_watch(at)` with `Split.watch_start` on every shard, and the
  events of its keys; its leader (shard 0) alone judges F11 (`tick(..., backlog_elsewhere)`), F12, F15, F16.
- `restore(state)` / `state() -> dict`: the whole open state, JSON-able through
  `oncewatch.core.records.to_json` (Decimal, datetime allowed). Save it in the same store
  transaction as the checkpoints and the drained findings; it includes findings changed but
  not yet drained. `restore` raises `StateMismatchError` if [domain]/[[announce]] changed
  since it was saved (thresholds may change freely).
- `state_delta() -> dict`: the same, but for `entries` only what changed since the previous
  call, as `changes: {space: {"full": bool, "put": [[key, time, value]], "gone": [key]}}` (the
  first call gives everything, `full`). For a large state, where writing `state()` at every
  checkpoint costs too much: keep the entries as rows keyed (space, key), replace a space's
  rows when `full`, upsert `put`, delete `gone`, and keep everything else of the delta as
  the head. `merge_delta(saved, delta)` is the reference for that bookkeeping; to restore,
  pass `{**head, "entries": {space: [[key, time, value], ...]}}` to `restore`.
- `memory.spill_to(cold, hot)`: let the spaces only looked up by key keep about `hot` entries
  each in memory and the rest in `cold`, the store that holds the saved entries (checks.horizon):
  memory then stays bounded whatever the size of the tables or of one transaction. Restore then
  takes only the newest `memory.hot_limits()` entries of those spaces, plus `"cold": {space: n}`
  counting those left in the store; `state()` holds what is in memory.
- `on_transaction(tx)`: one committed `Transaction`, rows in binlog order, or one fragment of a
  transaction too large to hold (`tx.complete` False on all but the last), in order: the rules
  see the same rows, and F6 keeps what it needs of the earlier fragments until the last. Rows
  with `snapshot=True` (bootstrap) seed state (pending orders, effect rows, payments, the announcements
  made before the start) but are not transitions and are not expected on Kafka; the snapshot's last part
  (`complete`) starts the watch of F8 and F9 at its time (checks.announcements).
- `on_events(events)`: `EmittedEvent`s in the order read (per partition in offset order).
- `on_offsets(snapshot)`: one `OffsetsSnapshot` of the offsets collector.
- `on_cdc_copy(tx)`: CDC check mode, a `Transaction` as the CDC topics delivered it (checks.pipeline:
  F13-F16 against the binlog's); in CDC source mode the transactions themselves carry their delivery
  (`tx.cdc`), which F15 and F16 judge.
- `tick(now, binlog_time, kafka_time)`: the timer. Judges absence (F3 on `binlog_time`,
  F7 on `kafka_time`, F8 on `binlog_time`) and the backlog (F11), then sweeps the horizon.
  `binlog_time`: commit time of the newest transaction read, or `now` when the binlog is
  read to its end; `kafka_time`: `checks.clocks.kafka_watermark`, or `now` when every
  partition is read to its end. An event is never "missing" while Kafka
  has not been read up to where it should be.
- `undecided() -> (n, due)`: facts read whose verdict is still to come on the binlog or Kafka clock
  (an order not yet stuck, a change waiting for its event, an event for its change, a partition skew
  not yet held), and the time the first of them comes due; `--until-idle` waits for them.
- `drain() -> list[Finding]`: findings created or changed since the last drain (new, more
  evidence, resolved): upsert them by id (ids and lifecycle: checks.findings).
- `drain_verdicts() -> list[TradeVerdict]`: the verdicts per trade reached or changed since the last call
  (checks.verdicts; one engine only, not a group's shards): write them forward only (store.verdicts).
- `stats() -> dict` for /metrics:
  {"backlog_by_table": {"schema.table": changes waiting for their event, committed before the Kafka
                        clock: what F11 judged at the last tick (Announcements.backlog_as_of); before
                        any tick, all of them},
   "delay": {commit_clock: {"buckets": {"0.005": n, ..., "+Inf": n} (cumulative, upper bounds
             in seconds), "sum": seconds, "count": n}},
   "found_total": {"F1": n, ..., "F12": n},
   "truncated_total": {"schema.table": TRUNCATEs of a watched table seen},
   "horizon_dropped_total": n, "horizon_dropped": {space: {"age": n, "count": n}}}

Bounded memory: every piece of open state ages out after `rules.horizon_seconds` of its
stream's time, or when a kind holds more than `rules.horizon_max_entries`; what falls off is
counted per space and reason in `horizon_dropped` and logged, and later facts about it are judged
without it. At steady state memory for duplicate checks ages out all the time: the log line is a
warning only when a drop lost something a rule still needed (checks.horizon.verdicts_lost).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from oncewatch.checks import shape
from oncewatch.checks.announcements import Announcements
from oncewatch.checks.effects import DuplicateEffects
from oncewatch.checks.findings import Findings, from_dict, to_dict
from oncewatch.checks.horizon import Memory, verdicts_lost
from oncewatch.checks.offsets import OffsetChecks
from oncewatch.checks.orders import OrderLife
from oncewatch.checks.payments import PaymentChecks
from oncewatch.checks.pipeline import PipelineChecks
from oncewatch.checks.settings import Settings
from oncewatch.checks.shards import WHOLE, Shard, check_shardable, owned, routes
from oncewatch.checks.verdicts import Verdicts, verdict_from_dict, verdict_to_dict
from oncewatch.core.records import (EmittedEvent, Finding, OffsetsSnapshot, RowChange, SchemaChange, TradeVerdict,
                                    Transaction)
from oncewatch.core.tables import is_pattern

log = logging.getLogger("oncewatch.checks.engine")

STATE_VERSION = 3  # 2: entries as [key, time, value] rows per space (state_delta); 3: effect rows and truncates
HORIZON_LOG_EVERY = 60.0  # seconds of `now` between two horizon log lines (it happens every tick at steady state)
ROUTES_LIMIT = 100_000  # real tables whose handlers are remembered (a shop of more shards looks them up again)
BACKLOG_EVERY = 1.0  # seconds of `now` between two F11 backlog judgements (each may walk the changes not yet due)


class StateMismatchError(ValueError):
    """Saved engine state does not fit the current config."""


def shape_digest(settings: Settings) -> str:
    """What saved state depends on: the shop's shape and the announcements, not the thresholds."""
    return hashlib.sha256(repr((settings.domain, settings.announce)).encode()).hexdigest()


def merge_delta(saved: dict[str, Any] | None, delta: dict[str, Any]) -> dict[str, Any]:
    """The full state that results from applying `delta` (from `state_delta`) to `saved`."""
    entries = {} if saved is None else {space: {k: [t, v] for k, t, v in rows}
                                        for space, rows in saved["entries"].items()}
    for space, change in delta["changes"].items():
        rows = {} if change["full"] else entries.get(space, {})
        rows.update({k: [t, v] for k, t, v in change["put"]})
        for k in change["gone"]:
            rows.pop(k, None)
        entries[space] = rows
    head = {k: v for k, v in delta.items() if k != "changes"}
    return {**head, "entries": {space: [[k, t, v] for k, (t, v) in rows.items()] for space, rows in entries.items()}}


class Engine:
    def __init__(self, settings: Settings, shard: Shard = WHOLE):
        """`shard`: judge only the keys of this one of `shard.count` shards (checks.shards); the leader alone
        judges the group-level rules (F11, F12, F15, F16)."""
        if shard.count > 1:
            check_shardable(settings)
        self.settings, self.shard = settings, shard
        rules, domain = settings.rules, settings.domain
        self.memory = Memory(rules.horizon_seconds, rules.horizon_max_entries)
        self.findings = Findings(self.memory)
        # watched entry (a table or a pattern) -> its handlers; (schema, table) of a real table -> its entry's:
        # a tuple key spares building "schema.table" for every row
        self._handlers: dict[str, list[Callable[[RowChange], None]]] = {}
        self.routes: dict[tuple[str, str], list[Callable[[RowChange], None]]] = {}
        self.callbacks: PaymentChecks | None = None
        self.orders: OrderLife | None = None
        # real table -> TRUNCATEs of it seen: the effect rows of before the last one are gone (checks.effects)
        self.truncated: dict[str, int] = self.memory.counters("truncated", {})
        self.effects: DuplicateEffects | None = None
        if domain.effects:
            self.effects = DuplicateEffects(self.memory, self.findings, tuple(e.table for e in domain.effects),
                                            self.truncated)
        if domain.orders:
            self.orders = OrderLife(domain.orders, domain.state_machine, rules.stuck_pending_seconds, self.memory,
                                    self.findings)
        payments = None
        if domain.payments:
            payments = PaymentChecks(domain.payments, domain.orders, domain.callbacks, settings.watched, self.memory,
                                     self.findings, None if shard.count == 1 else shard.owns)
            if domain.orders and (domain.payments.callback_status_column or domain.callbacks):
                self.callbacks = payments
        self.announcements = Announcements(settings.announce, rules, self.memory, self.findings)
        # the verdict per trade sees a trade's payment, effects, order and announced rows together: one engine only
        self.verdicts: Verdicts | None = None
        if domain.payments and shard.count == 1:
            self.verdicts = Verdicts(settings, self.memory, self.effects)
            self.findings.listener = self.verdicts.on_finding
        handlers = {"effect": lambda e: partial(self.effects.on_row, e), "order": lambda _: self.orders.on_row,
                    "payment": lambda _: payments.on_payment, "callback": lambda _: payments.on_callback,
                    "order_amount": lambda _: payments.on_order,
                    "announce": lambda a: partial(self.announcements.on_change, (a,))}
        for route in routes(settings):
            handler = handlers[route.handler](route.config)
            # a callback log's rows are sent by the router to their payment's shard (or every shard): run on all
            self._handlers.setdefault(route.table, []).append(
                handler if shard.count == 1 or route.handler == "callback" else owned(handler, route.key, shard))
        self.offsets = OffsetChecks(rules, self.findings)
        self.pipeline = PipelineChecks(rules, self.memory, self.findings, settings.cdc_check)
        self.watched = settings.watched
        self.needs = shape.needs(settings)
        # table -> its shape problems (ShapeProblem.to_dict), as the last DDL on it left them
        self.shape_problems = self.memory.counters("shape_problems", {})
        self._dropped_logged = self._lost_logged = 0
        self._expired: dict[str, int] = {}
        self._logged_at = float("-inf")
        self.backlog: dict[str, int] | None = None  # per table, as F11 last judged it (backlog_as_of)
        self._backlog_at = float("-inf")

    def _handlers_of(self, schema: str, table: str) -> list[Callable[[RowChange], None]]:
        """The handlers of a real table: its entry's, once looked up (a new shard of a pattern is one more)."""
        entry = self.watched.entry(schema, table)
        handlers = self._handlers.get(entry, []) if entry is not None else []
        if len(self.routes) < ROUTES_LIMIT:
            self.routes[(schema, table)] = handlers
        return handlers

    # ------------------------------------------------------------ state

    def _head(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "shape": shape_digest(self.settings), "shard": list(self.shard),
                "changed": [to_dict(f) for f in self.findings.changed.values()],
                "verdicts": [verdict_to_dict(v) for v in self.verdicts.changed] if self.verdicts else []}

    def state(self) -> dict[str, Any]:
        return {**self._head(), **self.memory.dump()}

    def state_delta(self) -> dict[str, Any]:
        """Also lets spilled spaces forget, in memory, the entries this delta has saved (checks.horizon)."""
        delta = {**self._head(), **self.memory.delta()}
        self.memory.evict()
        return delta

    def restore(self, state: dict[str, Any]) -> None:
        if state.get("shard", [0, 1]) != list(self.shard):
            raise StateMismatchError(f"the saved engine state is shard {state['shard'][0]} of {state['shard'][1]}, "
                                     f"this engine judges shard {self.shard.index} of {self.shard.count}: restore "
                                     "each shard from its own state, with the shard count it was saved under")
        if state.get("version") != STATE_VERSION or state.get("shape") != shape_digest(self.settings):
            raise StateMismatchError("the saved engine state was made under another [domain]/[[announce]] config "
                                     "(or oncewatch version); start from a fresh state (re-bootstrap) to use this one")
        self.memory.load(state)
        self.findings.changed = {f["id"]: from_dict(f) for f in state["changed"]}
        if self.verdicts is not None:
            self.verdicts.changed = [verdict_from_dict(v) for v in state.get("verdicts", ())]
        self.announcements.recount()
        self.findings.blind = self.blind_tables()
        self._dropped_logged = self.memory.dropped()
        self._lost_logged = verdicts_lost(self.memory.dropped_by_space())

    # ------------------------------------------------------------ input

    def on_transaction(self, tx: Transaction) -> None:
        routes = self.routes
        for row in tx.rows:
            handlers = routes.get((row.schema, row.table))
            for handler in self._handlers_of(row.schema, row.table) if handlers is None else handlers:
                handler(row)
        if self.callbacks is not None:
            self.callbacks.check_callbacks(tx)
        if self.verdicts is not None:
            self.verdicts.on_transaction(tx)
        for change in tx.schema_changes:
            self.on_schema_change(change, tx.commit_time)
        if tx.snapshot and tx.complete:
            self.announcements.snapshot_done(tx.commit_time)
        if tx.cdc is not None:  # CDC mode: what the delivery says of the pipeline
            self.pipeline.on_delivery(tx)
        elif self.pipeline.against_binlog:
            self.pipeline.on_binlog(tx)

    def on_cdc_copy(self, tx: Transaction) -> None:
        """CDC check mode: a transaction the CDC topics delivered, lined up with the binlog's (not for the rules)."""
        self.pipeline.on_copy(tx)

    def on_schema_change(self, change: SchemaChange, at: float) -> None:
        """A DDL on a watched table: the rules that read a column it broke go blind until a later
        DDL puts it right. A TRUNCATE changes no column (CDC and Canal give none with it)."""
        if change.kind == "truncate":
            self._truncated(change, at)
            return
        entry = self.watched.qualified(change.table)
        found = shape.problems(change, self.needs, entry)
        if found:
            self.shape_problems[change.table] = [p.to_dict() for p in found]
            log.warning("a watched table changed shape; the rules that read it are blind", extra={
                "event": "shape_problem", "table": change.table, "ddl": change.kind, "gtid": change.txid,
                "problems": [p.reason for p in found]})
        elif self.shape_problems.pop(change.table, None) is not None:
            log.info("a watched table has the shape the config needs again", extra={
                "event": "shape_restored", "table": change.table, "gtid": change.txid})
        self.findings.blind = self.blind_tables()

    def _truncated(self, change: SchemaChange, at: float) -> None:
        """Every row of the table is gone: counted, logged (once: by the leader of sharded engines, which each
        see it), and facts that stood on its rows end: pending orders, duplicated effects."""
        self.truncated[change.table] = self.truncated.get(change.table, 0) + 1
        where = f"{change.binlog_file}:{change.pos}"
        if self.shard.leads:
            log.warning("a watched table was truncated: every row of it is gone", extra={
                "event": "table_truncated", "table": change.table, "gtid": change.txid, "at": where})
        entry = self.watched.qualified(change.table)
        orders = self.orders
        if orders is not None and entry == orders.orders.table:
            orders.truncated(at, where, change.table if is_pattern(entry) else None)
        if self.effects is not None and entry in self.effects.tables:
            self.effects.truncated(change.table, at, where)

    def blind_tables(self) -> dict[str, frozenset[str]]:
        """Rule -> the watched tables (config entries) the standing shape problems blind it for."""
        return shape.blinds(self.shape(), self.reads())

    def reads(self) -> dict[str, list[str]]:
        """Rule -> the watched tables (config entries) whose configured columns it reads (checks.shape.needs)."""
        return shape.reads(self.needs)

    def shape(self) -> list[dict[str, Any]]:
        """The shape problems that stand, for health."""
        return [p for _, problems in sorted(self.shape_problems.items()) for p in problems]

    def on_events(self, events: Iterable[EmittedEvent]) -> None:
        on_event = self.announcements.on_event
        for event in events:
            on_event(event)

    def on_offsets(self, snapshot: OffsetsSnapshot) -> None:
        if self.shard.leads:
            self.offsets.on_offsets(snapshot)

    def start_watch(self, at: float) -> None:
        """Sharded: the watch start the router saw (checks.shards.Split.watch_start: the time of the snapshot the
        stream began with, else its first announced change, which may have gone to another shard); no event from
        before it is judged an orphan or a duplicate."""
        marks = self.announcements.marks
        if marks["watch_start"] is None:
            marks["watch_start"] = at

    def tick(self, now: float, binlog_time: float, kafka_time: float,
             backlog_elsewhere: dict[str, int] | None = None) -> None:
        """`backlog_elsewhere`: sharded, the leader's F11 judges its own backlog plus the other shards' (per table,
        as their last ticks left it in `stats()["backlog_by_table"]`)."""
        if self.orders is not None:
            self.orders.tick(binlog_time)
        self.announcements.tick(binlog_time, kafka_time)
        if self.verdicts is not None:
            self.verdicts.tick(binlog_time, kafka_time)
        cdc_time = self.pipeline.marks["cdc_time"]  # what the CDC topics delivered, never the wall clock
        if self.pipeline.against_binlog:
            self.pipeline.tick(binlog_time, cdc_time)
        gone = self.memory.expire(binlog_time, kafka_time, cdc_time)
        self.announcements.forget(gone.get("waiting_changes", ()))
        if now - self._backlog_at >= BACKLOG_EVERY:
            self.backlog = self.announcements.backlog_as_of(kafka_time)
            self._backlog_at = now
            if self.shard.leads:
                group = self.backlog if not backlog_elsewhere else {
                    table: n + backlog_elsewhere.get(table, 0) for table, n in self.backlog.items()}
                self.offsets.on_backlog(now, group)
        for name, values in gone.items():
            self._expired[name] = self._expired.get(name, 0) + len(values)
        self._log_horizon(now)

    def _log_horizon(self, now: float) -> None:
        dropped = self.memory.dropped()
        if dropped == self._dropped_logged or now - self._logged_at < HORIZON_LOG_EVERY:
            return
        lost = verdicts_lost(self.memory.dropped_by_space())
        level = logging.WARNING if lost > self._lost_logged else logging.INFO
        log.log(level, "open state fell off the horizon; later facts about it are judged without it", extra={
            "event": "horizon_dropped", "dropped": dropped - self._dropped_logged, "expired": self._expired,
            "horizon_seconds": self.settings.rules.horizon_seconds,
            "max_entries": self.settings.rules.horizon_max_entries})
        self._dropped_logged, self._lost_logged, self._expired, self._logged_at = dropped, lost, {}, now

    # ------------------------------------------------------------ output

    def undecided(self, change_clock_moves: bool = True) -> tuple[int, float | None]:
        (n, due), (skews, held_at) = self.memory.undecided(change_clock_moves), self.offsets.undecided()
        return n + skews, min((t for t in (due, held_at) if t is not None), default=None)

    def drain(self) -> list[Finding]:
        return self.findings.drain()

    def drain_verdicts(self) -> list[TradeVerdict]:
        """The trade verdicts reached or changed since the last call (checks.verdicts): write them with the state."""
        return self.verdicts.drain() if self.verdicts is not None else []

    def stats(self) -> dict[str, Any]:
        backlog = self.announcements.backlog if self.backlog is None else self.backlog
        return {**self.announcements.stats(), "backlog_by_table": dict(backlog),
                "found_total": dict(self.findings.found_total),
                "suppressed_total": dict(self.findings.suppressed), "shape_problems": self.shape(),
                # every shard counts a truncate (it reaches them all): the leader's count is the group's
                "truncated_total": dict(self.truncated) if self.shard.leads else {},
                "horizon_dropped_total": self.memory.dropped(), "horizon_dropped": self.memory.dropped_by_space(),
                "pipeline": self.pipeline.stats()}
