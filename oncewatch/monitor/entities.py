"""Which drill-down entities ('trade_no:T1', 'order_key:O1', 'pk:schema.table:1', 'key:schema.table:S1')
a record belongs to.

The writer stores these keys beside every row change and event (the store's entity index), so
the drill-down finds everything about a trade_no or an order without scanning. An announced row
and its event also share `key:TABLE:KEY` (the [[announce]] table and key), which is what the
findings about announcements (F7-F10) name: a shipment's id alone could be any table's id.
"""

from __future__ import annotations

from oncewatch.checks.settings import Settings
from oncewatch.core.names import key_text
from oncewatch.core.records import EmittedEvent, RowChange


class EntityIndex:
    def __init__(self, settings: Settings):
        d = settings.domain
        self.columns: dict[str, list[tuple[str, str]]] = {}
        if d.orders:
            self.columns.setdefault(d.orders.table, []).append(("order_key", d.orders.key_column))
        if d.payments:
            self.columns.setdefault(d.payments.table, []).extend(
                [("trade_no", d.payments.trade_no_column), ("order_key", d.payments.order_column)])
        for effect in d.effects:
            self.columns.setdefault(effect.table, []).append(("trade_no", effect.trade_no_column))
        for a in settings.announce:
            if (f"key:{a.table}", a.key_column) not in self.columns.get(a.table, ()):
                self.columns.setdefault(a.table, []).append((f"key:{a.table}", a.key_column))
        # (topic, event type) -> (table, the event's key field) of the announcements it answers
        self.announced = {(a.topic, a.event_type): (a.table, a.event_key) for a in settings.announce}

    def of_row(self, row: RowChange) -> list[str]:
        image = row.row
        return [f"pk:{row.qualified_table}:{'/'.join(str(v) for v in row.pk)}"] + [
            f"{kind}:{key_text(image[col])}" for kind, col in self.columns.get(row.qualified_table, ())
            if image.get(col) is not None]

    def of_event(self, event: EmittedEvent) -> list[str]:
        out = [f"{kind}:{event.keys[kind]}" for kind in ("trade_no", "order_key") if event.keys.get(kind) is not None]
        table, field = self.announced.get((event.topic, event.keys.get("event_type")), (None, None))
        if table is not None and event.keys.get(field) is not None:
            out.append(f"key:{table}:{key_text(event.keys[field])}")
        return out
