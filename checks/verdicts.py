"""The verdict per trade (issue 45, docs/architecture.md §4): was one successful payment handled exactly once?

A trade is a payment row in a success status, by its trade_no. It opens *pending* at its commit and is
*verified* once both stream clocks have passed its commit plus the missing-event grace (by then F1 and F2
have seen the effects and successes committed within it, and F7 has judged the changes announced with it),
every configured effect table holds a row of it, and no finding has touched it. An effect row committed
later puts its deadline back to that row's commit; a trade still short of an effect when its deadline
passes waits, pending, for that row (it is then no longer `undecided`: nothing is due).

It is *violated* as soon as a finding of F1-F10 touches it, F9's benign replays (info) excepted:

- its trade_no is in the finding's keys (F1, F5, F6; F2's trade_nos);
- its order is (F2, F3, F4, F5, F6): every successful trade of that order;
- the announced key of F7-F10 (table and key) is one a row of its own announced: its order's row, its
  payment's, or one of its effect rows (a shipment's id names its trade_no through the effect's column).

A key touched before its trade opens (an F5 judged by the payment row's own handler, an F3 on an order paid
late, an F2 of the second success) is remembered, so the trade opens violated. A finding that touches a
verified trade moves it to violated (the store counts the move). The first rule that touched a trade is its
`rule`.

Pure and deterministic: times are the commit time and the stream clocks of the tick (`reached_at` is the
earlier of the binlog and Kafka clocks when it was verified, a finding's time when it was violated), the state
lives in the engine's `Memory` and is saved with it, and the verdicts changed since the last `drain` are in
the engine's head, so a restart neither loses nor repeats one. Snapshot rows open no trade: a payment made
before the watch started has no announcement the monitor saw.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from oncewatch.checks.effects import DuplicateEffects
from oncewatch.checks.horizon import BINLOG, STREAMS, Memory
from oncewatch.checks.payments import money
from oncewatch.checks.settings import Settings
from oncewatch.core.names import OPEN, key_of, key_text
from oncewatch.core.records import (OP_DELETE, VERDICT_PENDING, VERDICT_VERIFIED, VERDICT_VIOLATED, Finding,
                                    RowChange, Transaction, TradeVerdict)

# The rules whose findings are about a trade, its order or a change announced for it.
TRADE_RULES = frozenset(f"F{i}" for i in range(1, 11))
TRADE, ORDER, LINK = "t", "o", "l"


def verdict_to_dict(v: TradeVerdict) -> dict[str, Any]:
    # its fields are plain values: the instance's dict, where dataclasses.asdict, which copies deep, cost 20 times as
    # much (2% of the judge's thread, issue 44)
    return {**v.__dict__, "amount": None if v.amount is None else str(v.amount)}


def verdict_from_dict(d: dict[str, Any]) -> TradeVerdict:
    return TradeVerdict(**{**d, "amount": None if d["amount"] is None else Decimal(d["amount"])})


class Verdicts:
    def __init__(self, settings: Settings, memory: Memory, effects: DuplicateEffects | None):
        d = settings.domain
        if d.payments is None:
            raise ValueError("trade verdicts need [domain.payments]")
        self.p, self.orders = d.payments, d.orders
        self.success = frozenset(self.p.success_statuses)
        self.effects = effects
        self.effect_columns = {e.table: e.trade_no_column for e in d.effects}
        self.watched = settings.watched
        # watched entry -> the key columns of its [[announce]] entries whose key is not the row's order or trade_no
        # itself (an effect's own id): those keys are linked to their trade as the rows come (`links`)
        self.announced: dict[str, list[tuple[str, ...]]] = {}
        # (watched entry, key columns) of the [[announce]] entries keyed by the order or trade_no itself: a finding
        # about such a key names its order or trade without a link
        self.own_keys: dict[tuple[str, tuple[str, ...]], str] = {}
        for a in settings.announce:
            own = (ORDER if self.orders is not None and a.table == self.orders.table
                   and a.key_columns == self.orders.key_columns
                   else TRADE if a.key_columns == (self.effect_columns.get(a.table) or (
                       self.p.trade_no_column if a.table == self.p.table else None),) else None)
            if own is not None:
                self.own_keys[a.table, a.key_columns] = own
            else:
                self.announced.setdefault(a.table, []).append(a.key_columns)
        for (table, columns), kind in list(self.own_keys.items()):
            if table in self.announced:  # a table announced by other keys too: a finding names no key columns
                del self.own_keys[table, columns]
                self.announced[table].append(columns)
        self.own_tables = {table: kind for (table, _), kind in self.own_keys.items()}
        grace = settings.rules.missing_event_grace_seconds
        # trade_no -> [{"t": the time its deadline runs from, "c": commit time, "o": order, "a": amount text}]
        self.pending = memory.deadlines("pending_trades", BINLOG, grace)
        # trade_no -> verdict_to_dict of its verdict once judged: a verified one may still be moved
        self.judged = memory.aging("judged_trades", BINLOG, spill=True)
        # order -> its successful trade_nos
        self.order_trades = memory.aging("order_trades", BINLOG, spill=True)
        # "table\x1fkey" of an announced row -> [TRADE, trade_no] or [ORDER, order]
        self.links = memory.aging("announced_trades", BINLOG, spill=True)
        # "t:trade_no", "o:order", "l:table\x1fkey" -> [rule, time] of the first finding that touched it
        self.touched = memory.aging("touched_keys", STREAMS, spill=True)
        self.changed: list[TradeVerdict] = []  # in the order reached: a verified one, then its move

    # ------------------------------------------------------------ input

    def on_transaction(self, tx: Transaction) -> None:
        """After the rules' handlers have run on `tx`: its findings are already known."""
        entry_of = self.watched.entry
        for change in tx.rows:
            if change.snapshot or change.op == OP_DELETE:
                continue
            entry = entry_of(change.schema, change.table)
            if entry is None:
                continue
            target = self._target(entry, change)
            if target is None:
                continue
            if entry == self.p.table:
                self._payment(change)  # its trade opens at this row's commit, or did earlier
            elif target[0] == TRADE:
                self._postpone((target[1],), change.commit_time)
            else:
                self._postpone(self.order_trades.get(target[1]) or (), change.commit_time)
            for columns in self.announced.get(entry, ()):
                key = key_of(change.row, columns)
                if key is not None:
                    self._link(f"{entry}\x1f{key_text(key)}", target, change.commit_time)

    def _target(self, entry: str, change: RowChange) -> list[str] | None:
        """What a row of `entry` is about: [TRADE, trade_no] (a payment or effect row), [ORDER, order], or None."""
        column = self.effect_columns.get(entry) or (self.p.trade_no_column if entry == self.p.table else None)
        if column is not None:
            value = change.row.get(column)
            return None if value is None else [TRADE, key_text(value)]
        if self.orders is not None and entry == self.orders.table:
            order = key_of(change.row, self.orders.key_columns)
            return None if order is None else [ORDER, key_text(order)]
        return None

    def _payment(self, change: RowChange) -> None:
        row = change.row
        if row.get(self.p.status_column) not in self.success:
            return
        trade_no, order = row.get(self.p.trade_no_column), key_of(row, self.p.order_columns)
        if trade_no is None or order is None:
            return  # the payment rules warn of it
        trade_no, order = key_text(trade_no), key_text(order)
        if self.pending.has(trade_no) or trade_no in self.judged:
            return
        at = change.commit_time
        amount = money(row.get(self.p.amount_column), self.p.amount_scale) if self.p.amount_column else None
        trades = self.order_trades.get(order) or []
        self.order_trades.put(order, [*trades, trade_no], at)
        item = {"t": at, "c": at, "o": order, "a": None if amount is None else str(amount)}
        touched = self.touched.get(f"{TRADE}:{trade_no}") or self.touched.get(f"{ORDER}:{order}")
        if touched is not None:
            self._judge(trade_no, item, VERDICT_VIOLATED, touched[0], max(at, touched[1]))
            return
        self.pending.add(trade_no, item)
        self._emit(trade_no, item, VERDICT_PENDING, None, None)

    def _postpone(self, trade_nos: Iterable[str], at: float) -> None:
        """A row of these trades committed at `at`: a pending one's deadline runs from it, if later."""
        for trade_no in trade_nos:
            fresh = self.pending.fresh.get(trade_no)
            if fresh is not None and fresh[0]["t"] >= at:
                continue  # most rows of a trade come in its payment's transaction
            taken = self.pending.take(trade_no) if fresh is not None or self.pending.has(trade_no) else None
            if taken is not None:
                item = taken[0]
                item["t"] = max(item["t"], at)
                self.pending.add(trade_no, item)

    def _link(self, link: str, target: list[str], at: float) -> None:
        self.links.put(link, target, at)
        touched = self.touched.get(f"{LINK}:{link}")
        if touched is not None:
            self._touch(target, touched[0], touched[1])

    # ------------------------------------------------------------ findings

    def on_finding(self, f: Finding) -> None:
        """A finding was raised or changed (checks.findings calls this)."""
        if f.rule not in TRADE_RULES or f.status != OPEN or f.severity == "info":
            return
        keys, at = f.keys, f.last_seen
        targets = [[TRADE, key_text(t)] for t in (keys.get("trade_nos") or ())]
        if keys.get("trade_no") is not None:
            targets.append([TRADE, key_text(keys["trade_no"])])
        if keys.get("order") is not None:
            targets.append([ORDER, key_text(keys["order"])])
        if keys.get("table") is not None and keys.get("key") is not None:
            own = self.own_tables.get(keys["table"])
            if own is not None:  # an order's or a payment's own change: its key is the order or the trade_no
                targets.append([own, key_text(keys["key"])])
            else:
                link = f"{keys['table']}\x1f{key_text(keys['key'])}"
                self._remember(f"{LINK}:{link}", f.rule, at)
                found = self.links.get(link)
                if found is not None:
                    targets.append(found)
        for target in targets:
            self._touch(target, f.rule, at)

    def _remember(self, touched: str, rule: str, at: float) -> None:
        if self.touched.get(touched) is None:
            self.touched.put(touched, [rule, at], at)

    def _touch(self, target: list[str], rule: str, at: float) -> None:
        kind, value = target
        self._remember(f"{kind}:{value}", rule, at)
        for trade_no in [value] if kind == TRADE else list(self.order_trades.get(value) or ()):
            self._violate(trade_no, rule, at)

    def _violate(self, trade_no: str, rule: str, at: float) -> None:
        taken = self.pending.take(trade_no) if self.pending.has(trade_no) else None
        if taken is not None:
            item = taken[0]
            self._judge(trade_no, item, VERDICT_VIOLATED, rule, max(at, item["c"]))
            return
        judged = self.judged.get(trade_no)
        if judged is not None and judged["verdict"] == VERDICT_VERIFIED:
            item = {"c": judged["committed_at"], "o": judged["order_id"], "a": judged["amount"]}
            self._judge(trade_no, item, VERDICT_VIOLATED, rule, max(at, judged["reached_at"]))

    # ------------------------------------------------------------ timer

    def tick(self, binlog_time: float, kafka_time: float) -> None:
        """Verify the trades whose deadline both clocks have passed, each of whose effects exists."""
        now = min(binlog_time, kafka_time)
        for trade_no, item in self.pending.due(now):
            if self.effects is not None and any(self.effects.count(table, trade_no) == 0
                                                for table in self.effect_columns):
                continue  # waits, overdue, for its missing effect's row (_postpone)
            self.pending.take(trade_no)
            self._judge(trade_no, item, VERDICT_VERIFIED, None, now)

    # ------------------------------------------------------------ output

    def _judge(self, trade_no: str, item: dict[str, Any], verdict: str, rule: str | None, at: float) -> None:
        v = self._emit(trade_no, item, verdict, rule, at)
        self.judged.put(trade_no, verdict_to_dict(v), item["c"])

    def _emit(self, trade_no: str, item: dict[str, Any], verdict: str, rule: str | None,
              at: float | None) -> TradeVerdict:
        amount = None if item["a"] is None else Decimal(item["a"])
        v = TradeVerdict(trade_no=trade_no, order_id=item["o"], amount=amount, verdict=verdict, rule=rule,
                         committed_at=item["c"], reached_at=at,
                         verified_at=at if verdict == VERDICT_VERIFIED else None)
        self.changed.append(v)
        return v

    def drain(self) -> list[TradeVerdict]:
        out, self.changed = self.changed, []
        return out
