"""Which drill-down entities ('trade_no:T1', 'order_key:O1', 'pk:schema.table:1', 'key:schema.table:S1')
a record belongs to.

The writer stores these keys beside every row change and event (the store's entity index), so
the drill-down finds everything about a trade_no or an order without scanning. An announced row
and its event also share `key:TABLE:KEY` (the [[announce]] table and key), which is what the
findings about announcements (F7-F10) name: a shipment's id alone could be any table's id.
"""

from __future__ import annotations

from oncewatch.checks.settings import Settings
from oncewatch.core.names import key_of, key_text
from oncewatch.core.records import EmittedEvent, RowChange
from oncewatch.core.tables import is_pattern


class EntityIndex:
    def __init__(self, settings: Settings):
        d = settings.domain
        # watched entry -> (kind, the columns of the key it holds)
        self.columns: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
        if d.orders:
            self.columns.setdefault(d.orders.table, []).append(("order_key", d.orders.key_columns))
        if d.payments:
            self.columns.setdefault(d.payments.table, []).extend(
                [("trade_no", (d.payments.trade_no_column,)), ("order_key", d.payments.order_columns)])
        if d.callbacks:
            self.columns.setdefault(d.callbacks.table, []).append(("trade_no", (d.callbacks.trade_no_column,)))
        for effect in d.effects:
            self.columns.setdefault(effect.table, []).append(("trade_no", (effect.trade_no_column,)))
        for a in settings.announce:
            if (f"key:{a.table}", a.key_columns) not in self.columns.get(a.table, ()):
                self.columns.setdefault(a.table, []).append((f"key:{a.table}", a.key_columns))
        # (topic, event type) -> (table, the event's key field) of the announcements it answers
        self.announced = {(a.topic, a.event_type): (a.table, a.event_key) for a in settings.announce}
        self.watched = settings.watched

    def of_row(self, row: RowChange) -> list[str]:
        image, pk = row.row, "/".join(str(v) for v in row.pk)
        entry = self.watched.entry(row.schema, row.table)
        out = [f"pk:{row.qualified_table}:{pk}"]
        if entry is not None and is_pattern(entry):
            out.append(f"pk:{entry}:{pk}")  # what a finding about a shard's announced row names (its entry)
        for kind, columns in self.columns.get(entry, ()) if entry is not None else ():
            key = key_of(image, columns)
            if key is not None:
                out.append(f"{kind}:{key_text(key)}")
        return out

    def of_event(self, event: EmittedEvent) -> list[str]:
        out = [f"{kind}:{key_text(event.keys[kind])}" for kind in ("trade_no", "order_key")
               if event.keys.get(kind) is not None]
        table, field = self.announced.get((event.topic, event.keys.get("event_type")), (None, None))
        if table is not None and event.keys.get(field) is not None:
            out.append(f"key:{table}:{key_text(event.keys[field])}")
        return out
