"""Where and how the shop keeps its rows and words its events: one of two shapes of payment service.

- `shop` (examples/shop.toml): one schema, one table per role, order statuses as the state
  machine names them, amounts in yuan, the channel's callback status on the payment row, events
  as flat JSON.
- `mall` (examples/mall.toml), the shape of many real services: two schemas (`<database>_0`,
  `<database>_1`), orders and payments sharded by order (`pay_order_0` ... `pay_order_3` and
  `pay_payment_0` ... in each), every notification the channel sent in a log table of its own
  (`pay_callback_log`: what the channel said, where the payment row holds only the service's own
  result), upper-case statuses (WAIT_PAY, PAID, ...), payment amounts in cents, and events in an
  envelope with their own id, time and trace id around the business data (amount in cents).

The service (shop.service) runs the same handler on either: it asks the layout for the SQL of
each step, the tables of an order and the words of a status.
"""

from __future__ import annotations

import datetime as dt
import zlib
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

SHAPE_SHOP = "shop"
SHAPE_MALL = "mall"
SHAPES = (SHAPE_SHOP, SHAPE_MALL)
MALL_SCHEMAS = 2
MALL_TABLES_PER_SCHEMA = 4

# The statements of one step, with the order's tables as {orders}, {payments}, ... and the same
# arguments in both shapes (the layout converts statuses and amounts).
SHOP_SQL = {
    "create_order": "INSERT INTO {orders} (order_no, user_id, amount, status, created_at, updated_at) "
                    "VALUES (%s, %s, %s, %s, %s, %s)",
    "start_payment": "INSERT INTO {payments} (trade_no, order_no, channel, amount, status, callback_status, "
                     "created_at, updated_at) VALUES (%s, %s, %s, %s, %s, NULL, %s, %s)",
    "lock_order": "SELECT status, amount FROM {orders} WHERE order_no = %s FOR UPDATE",
    "move_order": "UPDATE {orders} SET status = %s, updated_at = %s WHERE order_no = %s",
    "refund": "INSERT INTO {refunds} (order_no, trade_no, amount, created_at) VALUES (%s, %s, %s, %s)",
    "payment_failed": "UPDATE {payments} SET status = %s, callback_status = %s, updated_at = %s WHERE trade_no = %s",
    "payment_success": "UPDATE {payments} SET status = %s, callback_status = %s, amount = %s, updated_at = %s "
                       "WHERE trade_no = %s",
    "claim": "INSERT INTO {idempotency} (idem_key, trade_no, order_no, result, created_at) VALUES (%s, %s, %s, %s, %s)",
    "ship": "INSERT INTO {shipments} (trade_no, order_no, pickup_code, created_at) VALUES (%s, %s, %s, %s)",
    "grant_points": "INSERT INTO {points_grants} (trade_no, order_no, points, created_at) VALUES (%s, %s, %s, %s)",
}
MALL_SQL = {
    "create_order": "INSERT INTO {orders} (order_no, user_id, amount, order_status, gmt_create, gmt_modified) "
                    "VALUES (%s, %s, %s, %s, %s, %s)",
    "start_payment": "INSERT INTO {payments} (trade_no, order_no, channel, amount_fen, pay_status, gmt_create, "
                     "gmt_modified) VALUES (%s, %s, %s, %s, %s, %s, %s)",
    "lock_order": "SELECT order_status, amount FROM {orders} WHERE order_no = %s FOR UPDATE",
    "move_order": "UPDATE {orders} SET order_status = %s, gmt_modified = %s WHERE order_no = %s",
    "refund": "INSERT INTO {refunds} (order_no, trade_no, amount, gmt_create) VALUES (%s, %s, %s, %s)",
    "payment_failed": "UPDATE {payments} SET pay_status = %s, gmt_modified = %s WHERE trade_no = %s",
    "payment_success": "UPDATE {payments} SET pay_status = %s, amount_fen = %s, gmt_modified = %s WHERE trade_no = %s",
    "claim": "INSERT INTO {idempotency} (idem_key, trade_no, order_no, result, gmt_create) VALUES (%s, %s, %s, %s, %s)",
    "ship": "INSERT INTO {shipments} (shipment_no, trade_no, order_no, pickup_code, gmt_create) "
            "VALUES (%s, %s, %s, %s, %s)",
    "grant_points": "INSERT INTO {points_grants} (grant_no, trade_no, order_no, points, gmt_create) "
                    "VALUES (%s, %s, %s, %s, %s)",
    "log_callback": "INSERT INTO {callbacks} (trade_no, notify_status, notify_amount, received_at) "
                    "VALUES (%s, %s, %s, %s)",
}

SHOP_TABLES: dict[str, str] = {
    "orders": """
        order_no VARCHAR(32) NOT NULL PRIMARY KEY,
        user_id BIGINT NOT NULL,
        amount DECIMAL(12,2) NOT NULL,
        status VARCHAR(16) NOT NULL,
        created_at DATETIME(3) NOT NULL,
        updated_at DATETIME(3) NOT NULL,
        KEY orders_status (status, updated_at)""",
    "payments": """
        trade_no VARCHAR(40) NOT NULL PRIMARY KEY,
        order_no VARCHAR(32) NOT NULL,
        channel VARCHAR(16) NOT NULL,
        amount DECIMAL(12,2) NOT NULL,
        status VARCHAR(16) NOT NULL,
        callback_status VARCHAR(32) NULL,
        created_at DATETIME(3) NOT NULL,
        updated_at DATETIME(3) NOT NULL,
        KEY payments_order (order_no)""",
    "idempotency": """
        idem_key VARCHAR(64) NOT NULL PRIMARY KEY,
        trade_no VARCHAR(40) NOT NULL,
        order_no VARCHAR(32) NOT NULL,
        result VARCHAR(16) NOT NULL,
        created_at DATETIME(3) NOT NULL""",
    "shipments": """
        shipment_id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        trade_no VARCHAR(40) NOT NULL,
        order_no VARCHAR(32) NOT NULL,
        pickup_code CHAR(6) NOT NULL,
        created_at DATETIME(3) NOT NULL,
        KEY shipments_trade (trade_no)""",
    "points_grants": """
        grant_id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        trade_no VARCHAR(40) NOT NULL,
        order_no VARCHAR(32) NOT NULL,
        points INT NOT NULL,
        created_at DATETIME(3) NOT NULL,
        KEY points_trade (trade_no)""",
    "refunds": """
        refund_id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        order_no VARCHAR(32) NOT NULL,
        trade_no VARCHAR(40) NOT NULL,
        amount DECIMAL(12,2) NOT NULL,
        created_at DATETIME(3) NOT NULL,
        KEY refunds_order (order_no)""",
    "outbox": """
        id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        event_id CHAR(32) NOT NULL UNIQUE,
        topic VARCHAR(249) NOT NULL,
        msg_key VARCHAR(64) NOT NULL,
        payload BLOB NOT NULL,
        created_at DATETIME(3) NOT NULL,
        sent_at DATETIME(3) NULL,
        KEY outbox_unsent (sent_at, id)""",
}
# Shipments and points grants have no unique key on trade_no in either shape: only the handler's
# idempotency record keeps them to one per payment (what the F1 faults get wrong). The mall numbers
# them itself (shipment_no, grant_no): auto-increment ids would repeat across its schemas.
MALL_SHARDED: dict[str, str] = {
    "pay_order": """
        order_no VARCHAR(32) NOT NULL PRIMARY KEY,
        user_id BIGINT NOT NULL,
        amount DECIMAL(12,2) NOT NULL,
        order_status VARCHAR(16) NOT NULL,
        gmt_create DATETIME(3) NOT NULL,
        gmt_modified DATETIME(3) NOT NULL""",
    "pay_payment": """
        trade_no VARCHAR(40) NOT NULL PRIMARY KEY,
        order_no VARCHAR(32) NOT NULL,
        channel VARCHAR(16) NOT NULL,
        amount_fen BIGINT NOT NULL,
        pay_status VARCHAR(16) NOT NULL,
        gmt_create DATETIME(3) NOT NULL,
        gmt_modified DATETIME(3) NOT NULL,
        KEY payment_order (order_no)""",
}
MALL_PER_SCHEMA: dict[str, str] = {
    "pay_callback_log": """
        id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        trade_no VARCHAR(40) NOT NULL,
        notify_status VARCHAR(32) NOT NULL,
        notify_amount DECIMAL(12,2) NOT NULL,
        received_at DATETIME(3) NOT NULL,
        KEY callback_trade (trade_no)""",
    "pay_idempotency": """
        idem_key VARCHAR(64) NOT NULL PRIMARY KEY,
        trade_no VARCHAR(40) NOT NULL,
        order_no VARCHAR(32) NOT NULL,
        result VARCHAR(16) NOT NULL,
        gmt_create DATETIME(3) NOT NULL""",
    "shipment": """
        shipment_no VARCHAR(40) NOT NULL PRIMARY KEY,
        trade_no VARCHAR(40) NOT NULL,
        order_no VARCHAR(32) NOT NULL,
        pickup_code CHAR(6) NOT NULL,
        gmt_create DATETIME(3) NOT NULL,
        KEY shipment_trade (trade_no)""",
    "points_grant": """
        grant_no VARCHAR(40) NOT NULL PRIMARY KEY,
        trade_no VARCHAR(40) NOT NULL,
        order_no VARCHAR(32) NOT NULL,
        points INT NOT NULL,
        gmt_create DATETIME(3) NOT NULL,
        KEY points_trade (trade_no)""",
    "refund": """
        id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        order_no VARCHAR(32) NOT NULL,
        trade_no VARCHAR(40) NOT NULL,
        amount DECIMAL(12,2) NOT NULL,
        gmt_create DATETIME(3) NOT NULL""",
}
MALL_ORDER_STATUS = {"pending": "WAIT_PAY", "paid": "PAID", "shipped": "SHIPPED", "refunded": "REFUNDED",
                     "closed": "CLOSED"}
MALL_PAYMENT_STATUS = {"pending": "WAIT", "success": "SUCCESS", "failed": "FAIL"}
# What the channel writes for each of the notifications the plans send ('SUCCESS' and 'pending' are the
# statuses outside the whitelist of the status_not_whitelisted fault).
MALL_CHANNEL_STATUS = {"success": "TRADE_SUCCESS", "failed": "TRADE_FAILED", "SUCCESS": "SUCCESS",
                       "pending": "WAIT_BUYER_PAY"}


@dataclass(frozen=True)
class Layout:
    """One shop's tables and words: `shape` (SHAPES) and the database (or schema prefix) it lives in."""

    shape: str
    database: str

    @property
    def schemas(self) -> tuple[str, ...]:
        if self.shape == SHAPE_SHOP:
            return (self.database,)
        return tuple(f"{self.database}_{i}" for i in range(MALL_SCHEMAS))

    @property
    def commit_marks(self) -> str:
        """The table of committed transactions' ids (ShopSettings.commit_marks); no monitor watches it."""
        return f"`{self.schemas[0]}`.`shop_commits`"

    def tables(self) -> dict[str, str]:
        """Every table's qualified name and column definitions."""
        if self.shape == SHAPE_SHOP:
            return {f"`{self.database}`.`{name}`": columns for name, columns in SHOP_TABLES.items()}
        out = {}
        for schema in self.schemas:
            for name, columns in MALL_SHARDED.items():
                out.update({f"`{schema}`.`{name}_{i}`": columns for i in range(MALL_TABLES_PER_SCHEMA)})
            out.update({f"`{schema}`.`{name}`": columns for name, columns in MALL_PER_SCHEMA.items()})
        return out

    @property
    def sql(self) -> dict[str, str]:
        return SHOP_SQL if self.shape == SHAPE_SHOP else MALL_SQL

    def of(self, order_no: str) -> dict[str, str]:
        """The qualified tables an order's rows go to, by role (the mall's shard: a hash of the order number)."""
        if self.shape == SHAPE_SHOP:
            return {role: f"`{self.database}`.`{role}`" for role in SHOP_TABLES}
        shard = zlib.crc32(order_no.encode()) % (MALL_SCHEMAS * MALL_TABLES_PER_SCHEMA)
        schema = self.schemas[shard // MALL_TABLES_PER_SCHEMA]
        n = shard % MALL_TABLES_PER_SCHEMA
        return {"orders": f"`{schema}`.`pay_order_{n}`", "payments": f"`{schema}`.`pay_payment_{n}`",
                "callbacks": f"`{schema}`.`pay_callback_log`", "idempotency": f"`{schema}`.`pay_idempotency`",
                "shipments": f"`{schema}`.`shipment`", "points_grants": f"`{schema}`.`points_grant`",
                "refunds": f"`{schema}`.`refund`"}

    def truth_table(self, role: str) -> str:
        """The announced table as the ground truth names it: the monitor's [[announce]] table (a pattern
        for the mall's shards)."""
        if self.shape == SHAPE_SHOP:
            return f"{self.database}.{role}"
        return {"orders": f"{self.database}_*.pay_order_*", "shipments": f"{self.database}_*.shipment",
                "points_grants": f"{self.database}_*.points_grant"}[role]

    @property
    def logs_callbacks(self) -> bool:
        return self.shape == SHAPE_MALL

    @property
    def numbers_effects(self) -> bool:
        """The service numbers shipments and grants (else the table's auto-increment does)."""
        return self.shape == SHAPE_MALL

    def order_status(self, status: str) -> str:
        return status if self.shape == SHAPE_SHOP else MALL_ORDER_STATUS[status]

    def status_of_order(self, stored: str) -> str:
        """A stored order status by its state-machine name."""
        if self.shape == SHAPE_SHOP:
            return stored
        return next(name for name, word in MALL_ORDER_STATUS.items() if word == stored)

    def payment_status(self, status: str) -> str:
        return status if self.shape == SHAPE_SHOP else MALL_PAYMENT_STATUS[status]

    def channel_status(self, status: str) -> str:
        return status if self.shape == SHAPE_SHOP else MALL_CHANNEL_STATUS[status]

    def payment_amount(self, amount: Decimal) -> Any:
        return amount if self.shape == SHAPE_SHOP else int(amount * 100)

    @property
    def envelope(self) -> bool:
        return self.shape == SHAPE_MALL


def iso_ms(epoch_ms: int) -> str:
    """An envelope's time: ISO 8601 in UTC with milliseconds."""
    at = dt.datetime.fromtimestamp(epoch_ms / 1000, dt.timezone.utc)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


__all__ = ["Layout", "SHAPES", "SHAPE_SHOP", "SHAPE_MALL", "iso_ms"]
