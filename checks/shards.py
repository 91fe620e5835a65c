"""Sharded judgement: which of `count` shards judges each key, and which part of a transaction each one is sent.

Every rule needs all the evidence of its key in one place: F1 a trade_no's effect rows; F2-F6 an order's rows
and its payments; F7-F10 an announced key's changes and events. A key's shard is a hash of its value (its
`key_text`), not of its space: an order number that is both an order's key and an announced key lands on one
shard for both. `count` is fixed for a deployment, whatever the number of instances sharing the shards, so each
shard's input, state and findings are the same with one instance or several.

- `routes(settings)`: per watched entry, the handlers the engine runs on its rows (in that order) and the key
  each one judges a row by. The engine (checks.engine) and the router read the same list.
- `Router(settings, count).split(tx)`: the part of a transaction each shard needs. A row goes, once and in
  binlog order, to every shard one of its keys lands on; a DDL on a watched table to every shard (rules go
  blind everywhere, a TRUNCATE ends pending orders and duplicated effects everywhere, the leader counts it);
  the group-level facts to the leader, shard 0: the CDC delivery (F15 replays and F16 END counts, with
  `delivered_until`, the newest commit the router has seen delivered, which times an F15) and the quarantined
  rows. The last part of the snapshot the stream began with (or, with none, the first change of an announced
  table the router sees) starts every shard's watch (`Split.watch_start`, with a part for every shard:
  `Engine.start_watch` before the part): F8 and F9 judge no event from before it, on every shard alike.
- `Router.shard_of_event(event)`: the shard of the key an event announces (None: no entry announces it).
- `merge_stats`: the shards' `Engine.stats()` as one engine's, for /metrics.

A callback log (`[domain.callbacks]`) finds its order through the payment of its trade_no: the router learns
each trade_no's shard from the payment rows it splits (the newest TRADES_KEPT), and sends a callback row to the
shard of its payment's order, with the transaction's other rows of that shard (F6 judges a callback with the order
it moved); a callback whose payment the router has not seen (read before it, or before this router started) goes
to every shard, where the one that has or gets the payment judges it and the others let it age out.

The leader also owns the other group-level rules, F11 (the backlog summed over every shard) and F12 (the
offsets), which the other shards never judge. Not shardable, refused by `check_shardable`: CDC check mode (the
binlog and the CDC copy of each transaction are lined up as a whole).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from oncewatch.checks.settings import Settings
from oncewatch.core.domain import Announce, Effect
from oncewatch.core.names import key_of, key_text
from oncewatch.core.records import EmittedEvent, RowChange, Transaction

LEADER = 0
TRADES_KEPT = 200_000  # trade_no -> its order's shard, the newest kept by a router for the callback log's rows
IGNORED = object()  # the key of a row its handler does nothing with: sent to no shard for that handler


class ShardingError(ValueError):
    """The config holds something the shards cannot judge apart."""


class Shard(NamedTuple):
    index: int = 0
    count: int = 1

    @property
    def leads(self) -> bool:
        return self.index == LEADER

    def owns(self, key: Any) -> bool:
        return shard_of(key, self.count) == self.index


WHOLE = Shard()


def shard_of(key: Any, count: int) -> int:
    """The shard of a key's value; a NULL key goes to the leader, so that one shard alone warns of it."""
    if count == 1 or key is None:
        return LEADER
    return zlib.crc32(key_text(key).encode("utf-8", "surrogatepass")) % count


class Route(NamedTuple):
    table: str  # the watched entry (a table or a pattern)
    handler: str  # which of the engine's handlers: effect, order, payment, callback, order_amount, announce
    config: Effect | Announce | None  # the effect or the [[announce]] entry it serves
    key: Callable[[RowChange], Any]  # the key it judges a row by, or IGNORED


def _columns(columns: tuple[str, ...]) -> Callable[[RowChange], Any]:
    return lambda change: key_of(change.row, columns)


def _announced(a: Announce) -> Callable[[RowChange], Any]:
    def key(change: RowChange) -> Any:
        # a snapshot row goes to the shard of the announcement made before the start that it shows, if any
        if not (a.left(change.after) if change.snapshot else a.selects(change.op, change.before, change.after)):
            return IGNORED
        return key_of(change.row, a.key_columns)
    return key


def routes(settings: Settings) -> list[Route]:
    d = settings.domain
    found = [Route(e.table, "effect", e, _columns((e.trade_no_column,))) for e in d.effects]
    if d.orders:
        found.append(Route(d.orders.table, "order", None, _columns(d.orders.key_columns)))
    if d.payments:
        found.append(Route(d.payments.table, "payment", None, _columns(d.payments.order_columns)))
        if d.callbacks:  # its rows find their order through the payment of their trade_no: Router sends them
            found.append(Route(d.callbacks.table, "callback", None, lambda change: IGNORED))
        if d.orders:
            found.append(Route(d.orders.table, "order_amount", None, _columns(d.orders.key_columns)))
    found += [Route(a.table, "announce", a, _announced(a)) for a in settings.announce]
    return found


def check_shardable(settings: Settings) -> None:
    if settings.cdc_check:
        raise ShardingError("cdc.mode: \"check\" lines up the binlog and the CDC topics transaction by transaction "
                            "on one instance; several instances need cdc.mode = \"source\"")


def owned(handler: Callable[[RowChange], None], key: Callable[[RowChange], Any],
          shard: Shard) -> Callable[[RowChange], None]:
    """`handler`, run only on the rows whose key is this shard's."""
    index, count = shard

    def run(change: RowChange) -> None:
        k = key(change)
        if k is not IGNORED and shard_of(k, count) == index:
            handler(change)
    return run


class Split(NamedTuple):
    parts: dict[int, Transaction]  # shard -> its part, in no particular order (every shard's, with a watch start)
    watch_start: float | None  # set once: the commit time that starts every shard's watch


class Router:
    def __init__(self, settings: Settings, count: int):
        check_shardable(settings)
        self.count = count
        self.watched = settings.watched
        self.keys: dict[str, list[Callable[[RowChange], Any]]] = {}
        for r in routes(settings):
            self.keys.setdefault(r.table, []).append(r.key)
        self.announced_tables = {a.table for a in settings.announce}
        self._real: dict[tuple[str, str], tuple[list[Callable[[RowChange], Any]], bool]] = {}
        self.by_event = {(a.topic, a.event_type): a for a in settings.announce}
        d = settings.domain
        # the callback log's and the payments' entries and columns, when there is a callback log
        self.callbacks = (d.callbacks.table, d.callbacks.trade_no_column, d.payments.table,
                          d.payments.trade_no_column, d.payments.order_columns) \
            if d.callbacks is not None and d.payments is not None else None
        self.trades: dict[str, int] = {}  # trade_no -> its order's shard, oldest first (TRADES_KEPT of them)
        self.watch_start: float | None = None
        self.delivered_until = 0.0
        self._fragmented: set[int] = set()  # shards sent a fragment of the transaction not complete yet

    def _of(self, schema: str, table: str) -> tuple[list[Callable[[RowChange], Any]], bool]:
        found = self._real.get((schema, table))
        if found is None:
            entry = self.watched.entry(schema, table)
            found = self._real[(schema, table)] = (self.keys.get(entry, []), entry in self.announced_tables)
        return found

    def _learn_trades(self, tx: Transaction) -> None:
        """The shards of the trade_nos the transaction's payment rows name, before its callback rows are sent."""
        assert self.callbacks is not None
        _, _, payments, trade_column, order_columns = self.callbacks
        entry, trades = self.watched.entry, self.trades
        for row in tx.rows:
            if entry(row.schema, row.table) == payments:
                trade_no, order = row.row.get(trade_column), key_of(row.row, order_columns)
                if trade_no is not None and order is not None:
                    trades.pop(key_text(trade_no), None)  # the newest last: the oldest goes first
                    trades[key_text(trade_no)] = shard_of(order, self.count)
        while len(trades) > TRADES_KEPT:
            del trades[next(iter(trades))]

    def _callback_shards(self, row: RowChange) -> Iterable[int]:
        assert self.callbacks is not None
        trade_no = row.row.get(self.callbacks[1])
        shard = None if trade_no is None else self.trades.get(key_text(trade_no))
        return range(self.count) if shard is None else (shard,)

    def split(self, tx: Transaction) -> Split:
        count, rows, start = self.count, {}, None
        callbacks = self.callbacks[0] if self.callbacks is not None else None
        if callbacks is not None:
            self._learn_trades(tx)
        for row in tx.rows:
            if callbacks is not None and self.watched.entry(row.schema, row.table) == callbacks:
                for s in self._callback_shards(row):
                    rows.setdefault(s, []).append(row)
                continue
            keys, announced = self._of(row.schema, row.table)
            if announced and self.watch_start is None and not row.snapshot:  # a stream that began with no snapshot
                self.watch_start = start = row.commit_time
            for key in keys:
                k = key(row)
                if k is IGNORED:
                    continue
                bucket = rows.setdefault(shard_of(k, count), [])
                if not bucket or bucket[-1] is not row:
                    bucket.append(row)
        if tx.snapshot and tx.complete and self.watch_start is None:
            self.watch_start = start = tx.commit_time
        targets = set(rows)
        if tx.schema_changes or start is not None:
            targets.update(range(count))
        if not tx.complete:
            self._fragmented |= targets
        elif self._fragmented:  # the last fragment closes what the earlier ones opened (F6 waits for it)
            targets |= self._fragmented
            self._fragmented = set()
        d = tx.cdc
        if d is not None:
            self.delivered_until = max(self.delivered_until, tx.commit_time)
        leader_cdc = d is not None and bool(d.replays or d.incomplete)
        if leader_cdc or tx.quarantined:
            targets.add(LEADER)
        parts = {}
        for s in targets:
            leads = s == LEADER
            parts[s] = dataclasses.replace(
                tx, rows=tuple(rows.get(s, ())), quarantined=tx.quarantined if leads else (),
                cdc=dataclasses.replace(d, delivered_until=self.delivered_until) if leads and leader_cdc else None)
        return Split(parts, start)

    def shard_of_event(self, event: EmittedEvent) -> int | None:
        a = self.by_event.get((event.topic, event.keys.get("event_type")))
        return None if a is None else shard_of(event.keys.get(a.event_key), self.count)


def merge_stats(shards: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The shards' `Engine.stats()` as one engine's: counts, histograms and backlogs summed; what every shard
    holds alike (the shape problems: a DDL goes to every shard) taken from the first that has it."""
    merged: dict[str, Any] = {}
    for stats in shards:
        _add(merged, stats)
    return merged


def _add(into: dict[str, Any], stats: dict[str, Any]) -> None:
    for key, value in stats.items():
        if isinstance(value, dict):
            _add(into.setdefault(key, {}), value)
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            if not into.get(key):
                into[key] = value
        else:
            into[key] = into.get(key, 0) + value
