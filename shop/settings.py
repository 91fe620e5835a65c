"""What one shop run is asked to do: where it writes, how much traffic, which faults, which style.

`ShopSettings` is the Python API's input (`shop.run(ShopSettings(...))`) and what the
`oncewatch-shop` command builds from its options. The defaults point at the dev services
(`python -m devservices.stack up`) and at the names of `examples/shop.toml`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from oncewatch.shop.layout import SHAPE_MALL, SHAPES

# How the service tells Kafka what it did (docs/architecture.md §1): after the commit, inside the
# transaction (before the commit), or through a transactional outbox and a relay.
STYLE_AFTER_COMMIT = "after_commit"
STYLE_IN_TRANSACTION = "in_transaction"
STYLE_OUTBOX = "outbox"
STYLES = (STYLE_AFTER_COMMIT, STYLE_IN_TRANSACTION, STYLE_OUTBOX)


class SettingsError(ValueError):
    """A shop setting is out of range; the message names it and what to use instead."""


@dataclass(frozen=True)
class MySQLTarget:
    host: str = "127.0.0.1"
    port: int = int(os.environ.get("ONCEWATCH_DEV_MARIADB_PORT", "13306"))  # the dev stack's (devservices)
    user: str = "dev_admin"
    # The dev services' admin password (CONTRIBUTING); the CLI takes another from the environment.
    password: str = field(default="dev_admin", repr=False)
    database: str = "shop"


@dataclass(frozen=True)
class KafkaTarget:
    bootstrap_servers: str = f"127.0.0.1:{os.environ.get('ONCEWATCH_DEV_KAFKA_PORT', '19092')}"
    topic: str = "shop.events"
    partitions: int = 3
    # Downstream consumer groups: the first one can stall (F11), the second can stall on some
    # partitions only (F12), so both faults can be on in one run.
    groups: tuple[str, str] = ("shipping-service", "points-service")


@dataclass(frozen=True)
class ShopSettings:
    seed: int = 1
    orders: int = 1000
    duration: float | None = None  # seconds; when set, the run places rate * duration orders
    rate: float = 50.0  # new orders per second
    faults: str = "none"  # "all", "none" or "mode=rate,..." (see shop.faults)
    style: str = STYLE_AFTER_COMMIT
    shape: str = "shop"  # how the service keeps its rows and words its events (shop.layout.SHAPES)
    truth_path: str | None = None
    reset: bool = False  # drop and recreate the shop tables and the topic first
    workers: int = 8  # service threads, one database connection each (commits wait on the disk)
    slow_send_seconds: float = 2.0  # how late a slow send (F10) reaches Kafka
    run_tag: str | None = None  # prefix of order and trade numbers; a fresh one per run by default
    # Each transaction also writes its id to a table of its own (Layout.commit_marks), so that a commit whose answer
    # was lost to a MariaDB crash is looked up after the reconnect, not guessed (bench/chaos.py kills MariaDB).
    commit_marks: bool = False
    mysql: MySQLTarget = MySQLTarget()
    kafka: KafkaTarget = KafkaTarget()

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise SettingsError(f"style: must be one of {', '.join(STYLES)}, got {self.style!r}")
        if self.shape not in SHAPES:
            raise SettingsError(f"shape: must be one of {', '.join(SHAPES)}, got {self.shape!r}")
        if self.shape == SHAPE_MALL and self.style == STYLE_OUTBOX:
            raise SettingsError("style: the mall shape has no outbox table; use after_commit or in_transaction")
        if not self.rate > 0:
            raise SettingsError(f"rate: orders per second must be above 0, got {self.rate}")
        if self.orders < 0 or (self.duration is not None and self.duration < 0):
            raise SettingsError("orders/duration: must not be negative")
        if self.workers < 1:
            raise SettingsError(f"workers: at least 1, got {self.workers}")
        if self.slow_send_seconds <= 0.5:
            raise SettingsError("slow_send_seconds: a slow send must be later than the 0.5 s F10 default")
        if self.run_tag is not None and not (self.run_tag.isalnum() and len(self.run_tag) <= 8):
            raise SettingsError(f"run_tag: up to 8 letters or digits, got {self.run_tag!r}")

    @property
    def order_count(self) -> int:
        return self.orders if self.duration is None else math.ceil(self.rate * self.duration)
