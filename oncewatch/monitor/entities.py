"""Which drill-down entities ('trade_no:T1', 'order_key:O1', 'pk:schema.table:1') a record belongs to.

The writer stores these keys beside every row change and event (the store's entity index), so
the drill-down finds everything about a trade_no or an order without scanning.
"""

from __future__ import annotations

from oncewatch.checks.settings import Settings
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

    def of_row(self, row: RowChange) -> list[str]:
        image = row.row
        return [f"pk:{row.qualified_table}:{'/'.join(str(v) for v in row.pk)}"] + [
            f"{kind}:{image[col]}" for kind, col in self.columns.get(row.qualified_table, ())
            if image.get(col) is not None]

    @staticmethod
    def of_event(event: EmittedEvent) -> list[str]:
        return [f"{kind}:{event.keys[kind]}" for kind in ("trade_no", "order_key") if event.keys.get(kind) is not None]
