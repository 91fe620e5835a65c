"""The simulated shop and a monitor watching it, on the dev services: configs and runs.

Shared by the end-to-end tests and `bench/load.py`. The monitor config is examples/shop.toml
moved to the test schema and a topic of the caller's, with the store in the caller's folder and,
for runs of a minute or two, smaller thresholds; the monitor runs as the real `oncewatch run`.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomli_w

from devservices import base, mariadb
from devservices.kafka_connect import CDC_SCHEMA, TOPIC_PREFIX
from oncewatch.core.config import PostgresTarget, load
from oncewatch.core.records import Finding
from oncewatch.shop import KafkaTarget, MySQLTarget, ShopSettings
from oncewatch.shop.runner import DELIVERY_SECONDS
from oncewatch.store import Store

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "shop.toml"
# Per shop shape (oncewatch.shop.layout): its example config and the prefix of the names in it.
EXAMPLES = {"shop": (EXAMPLE, "shop."), "mall": (ROOT / "examples" / "mall.toml", "mall_")}

# Thresholds for runs of a minute or two: the shop settles its clean orders within seconds.
SHORT_RULES = {"stuck_pending_seconds": 6, "missing_event_grace_seconds": 4, "orphan_event_grace_seconds": 4,
               "partition_skew_seconds": 2}
# These runs use the test schema and topics of their own, and leave the demo's `shop` schema alone
# (the mall's: owmall_0 and owmall_1).
SCHEMA = "owtest"
SCHEMAS = {"shop": SCHEMA, "mall": "owmall"}
TOPIC = "owtest.events"


def unique_server_id() -> int:
    """Each monitor its own replica id: two binlog readers with one id knock each other off (4052)."""
    return random.randrange(100_000, 2**31)


# Ports for the tests' monitors and dashboards: below Linux's ephemeral range (32768 up), which the kernel hands to
# outgoing connections and to bind(0), and clear of the stacks' ports (13xxx to 23xxx). A port handed out is claimed
# by a file in CLAIMS for the hour, so that the suite's sessions, which pick ports at once, never pick the same one.
PORTS = range(25_000, 32_000)
CLAIMS = Path(tempfile.gettempdir()) / "oncewatch-ports"


def free_port() -> int:
    """A loopback port nothing listens on right now and no other caller on this machine was given this hour or the
    last, for a monitor's /metrics or a dashboard."""
    hour = int(time.time() // 3600)
    for stale in CLAIMS.glob("*"):
        if stale.name.isdigit() and int(stale.name) < hour - 1:
            shutil.rmtree(stale, ignore_errors=True)
    (CLAIMS / str(hour)).mkdir(parents=True, exist_ok=True)
    for _ in range(len(PORTS)):
        port = random.choice(PORTS)
        if (CLAIMS / str(hour - 1) / str(port)).exists():
            continue
        try:
            os.close(os.open(CLAIMS / str(hour) / str(port), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        with socket.socket() as s:
            try:
                s.bind((base.HOST, port))
            except OSError:
                continue
        return port
    raise base.StackError(f"no free port left in {PORTS.start}-{PORTS.stop - 1} this hour: clear {CLAIMS}")


def free_ports(n: int) -> list[int]:
    """`n` of free_port(), no two alike."""
    return [free_port() for _ in range(n)]


def _retarget(value: Any, prefix: str, schema: str) -> Any:
    """An example's names that start with `prefix` ('shop.x', 'mall_*.x') moved to `schema`."""
    if isinstance(value, str) and value.startswith(prefix):
        return f"{schema}{prefix[-1]}{value[len(prefix):]}"
    if isinstance(value, dict):
        return {_retarget(k, prefix, schema): _retarget(v, prefix, schema) for k, v in value.items()}
    if isinstance(value, list):
        return [_retarget(v, prefix, schema) for v in value]
    return value


def new_topic() -> str:
    """A topic of its own per recorded run: the downstream groups keep their names across runs, and a
    deleted topic's old commits may still be around when a topic of the same name is made again."""
    return f"{TOPIC}.{uuid.uuid4().hex[:8]}"


def shop_settings(topic: str = TOPIC, shape: str = "shop", schema: str | None = None, **changes: Any) -> ShopSettings:
    """A shop of `shape` in the test schema (or `schema`), its downstream groups those its example config watches."""
    groups = tuple(tomllib.loads(EXAMPLES[shape][0].read_text())["kafka"]["consumer_groups"])
    return ShopSettings(mysql=MySQLTarget(port=base.MARIADB_PORT, database=schema or SCHEMAS[shape]),
                        kafka=KafkaTarget(bootstrap_servers=f"{base.HOST}:{base.KAFKA_PORT}", topic=topic,
                                          groups=groups),
                        shape=shape, **changes)


def edit_config(config: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    """`config` with `change` made to its tables, written back in place."""
    data = tomllib.loads(config.read_text())
    change(data)
    config.write_text(tomli_w.dumps(data))
    return config


def shop_config(folder: Path, *, metrics_port: int = 0, rules: dict[str, Any] | None = None,
                topic: str = TOPIC, schema: str | None = None, shape: str = "shop", cdc: bool = False,
                postgres: PostgresTarget | None = None, store: dict[str, Any] | None = None, **kafka: Any) -> Path:
    """The example config of a `shape` shop (examples/shop.toml, examples/mall.toml) for the dev services, in
    the test schema unless `schema` says otherwise, written to `folder` with its store there. `cdc`: in CDC
    mode, the shop in the schema the dev connector captures, its changes read from the connector's topics
    (from their ends at the first start: the test's shop starts empty). `postgres`: the store in that
    database instead; `store`: more of [store] (its writer)."""
    if cdc:
        schema = CDC_SCHEMA
    example, prefix = EXAMPLES[shape]
    data = _retarget(tomllib.loads(example.read_text()), prefix, schema or SCHEMAS[shape])
    for t in data["kafka"]["topics"]:
        t["name"] = topic
    for a in data["announce"]:
        a["topic"] = topic
    data["mysql"]["port"] = base.MARIADB_PORT
    data["kafka"]["bootstrap_servers"] = [f"{base.HOST}:{base.KAFKA_PORT}"]
    data["mysql"]["password_file"] = str(mariadb.MONITOR_PASSWORD_FILE)
    data["mysql"]["server_id"] = unique_server_id()
    data["mysql"]["heartbeat_seconds"] = 1.0
    data["mysql"]["reconnect_max_seconds"] = 2.0
    if postgres is None:
        data["store"]["path"] = str(folder / "store.db")
    else:
        data["store"].pop("path", None)
        data["store"].update(url=postgres.url, password_file=postgres.password.file)
    data["store"].update(store or {})
    data["metrics"]["port"] = metrics_port
    data["rules"].update(SHORT_RULES if rules is None else rules)
    data["kafka"]["producer_delivery_seconds"] = DELIVERY_SECONDS
    data["kafka"].update(kafka)
    if cdc:
        # the change clock: the dev connector's heartbeats (on the default topic, __debezium-heartbeat.<prefix>)
        data["cdc"] = {"format": "debezium", "topic_prefix": TOPIC_PREFIX, "start_from": "latest"}
    path = folder / "oncewatch.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def oncewatch(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    """`oncewatch <args>` as a user runs it; with `check`, a non-zero exit raises with its stderr."""
    result = subprocess.run([sys.executable, "-m", "oncewatch.cli", *args], capture_output=True, text=True,
                            timeout=timeout, cwd=ROOT)
    if check and result.returncode != 0:
        raise AssertionError(f"oncewatch {' '.join(args)} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return result


def run_until_idle(config: Path, idle: float = 3.0, timeout: float = 300) -> subprocess.CompletedProcess:
    return oncewatch("run", "--config", str(config), "--until-idle", str(idle), timeout=timeout)


def comparable(found: list[Finding]) -> dict[str, tuple]:
    """Findings as two monitors of the same traffic must agree on them: by id, rule, status, severity, evidence."""
    assert len({f.id for f in found}) == len(found), "a finding id appears twice"
    return {f.id: (f.rule, f.status, f.severity, tuple(sorted(e.coordinates for e in f.evidence))) for f in found}


def findings(config: Path) -> list[Finding]:
    store = Store(load(config).store.target, readonly=True)
    try:
        return store.findings()
    finally:
        store.close()
