"""The simulated shop and the monitor together: configs, runs and scoring against the ground truth.

Used by the end-to-end tests (scoring, the nine-rules workload, faults, security). The monitor
config is examples/shop.toml with the store in the test's folder and, for short runs,
smaller thresholds; the monitor runs as the real `oncewatch run` command.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from devservices import stack
from oncewatch.records import Finding
from oncewatch.store import Store
import shop
from shop import GroundTruth, KafkaTarget, MySQLTarget, ShopSettings

from .conftest import unique_server_id

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "shop.toml"

# Thresholds for runs of a minute or two: the shop settles its clean orders within seconds.
SHORT_RULES = {"stuck_pending_seconds": 10, "missing_event_grace_seconds": 4, "orphan_event_grace_seconds": 4}
# --until-idle quiet time: longer than the stuck-pending threshold, so every absence rule has had its say.
IDLE = 12.0
# The end-to-end tests run the shop in the test schema with its own topic, so that they leave the
# demo's `shop` schema alone.
SCHEMA = "owtest"
TOPIC = "owtest.events"


def _retarget(value: Any) -> Any:
    """examples/shop.toml's 'shop.x' names (tables and the topic) moved to the test schema."""
    if isinstance(value, str) and value.startswith("shop."):
        return f"{SCHEMA}.{value[len('shop.'):]}"
    if isinstance(value, dict):
        return {_retarget(k): _retarget(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_retarget(v) for v in value]
    return value


def new_topic() -> str:
    """A topic of its own per recorded run: the downstream groups keep their names across runs, and a
    deleted topic's old commits may still be around when a topic of the same name is made again."""
    return f"{TOPIC}.{uuid.uuid4().hex[:8]}"


def shop_settings(topic: str = TOPIC, **changes: Any) -> ShopSettings:
    return ShopSettings(mysql=MySQLTarget(port=stack.MARIADB_PORT, database=SCHEMA),
                        kafka=KafkaTarget(bootstrap_servers=f"{stack.HOST}:{stack.KAFKA_PORT}", topic=topic),
                        **changes)


def shop_config(tmp_path: Path, *, metrics_port: int = 0, rules: dict[str, Any] | None = None,
                topic: str = TOPIC, **kafka: Any) -> Path:
    data = _retarget(tomllib.loads(EXAMPLE.read_text()))
    for t in data["kafka"]["topics"]:
        t["name"] = topic
    for a in data["announce"]:
        a["topic"] = topic
    data["mysql"]["port"] = stack.MARIADB_PORT
    data["kafka"]["bootstrap_servers"] = [f"{stack.HOST}:{stack.KAFKA_PORT}"]
    data["mysql"]["password_file"] = str(stack.MONITOR_PASSWORD_FILE)
    data["mysql"]["server_id"] = unique_server_id()
    data["mysql"]["heartbeat_seconds"] = 1.0
    data["mysql"]["reconnect_max_seconds"] = 2.0
    data["store"]["path"] = str(tmp_path / "store.db")
    data["metrics"]["port"] = metrics_port
    data["rules"].update(SHORT_RULES if rules is None else rules)
    data["kafka"].update(kafka)
    path = tmp_path / "oncewatch.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def oncewatch(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "oncewatch.cli", *args], capture_output=True, text=True,
                            timeout=timeout, cwd=ROOT)
    if check and result.returncode != 0:
        raise AssertionError(f"oncewatch {' '.join(args)} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return result


def prepared(folder: Path) -> tuple[Path, str]:
    """A fresh shop (tables, its own topic) and a monitor that has taken its first checkpoint there:
    (config, topic) for a recorded run."""
    topic = new_topic()
    shop.run(shop_settings(topic, orders=0, reset=True))
    config = shop_config(folder, topic=topic)
    run_until_idle(config, idle=1.0)
    return config, topic


def run_until_idle(config: Path, idle: float = 3.0, timeout: float = 300) -> subprocess.CompletedProcess:
    return oncewatch("run", "--config", str(config), "--until-idle", str(idle), timeout=timeout)


def findings(config: Path) -> list[Finding]:
    cfg_store = tomllib.loads(config.read_text())["store"]["path"]
    store = Store(cfg_store, readonly=True)
    try:
        return store.findings()
    finally:
        store.close()


@dataclass(frozen=True)
class Score:
    found: dict[str, int]        # per fault mode: faults with a finding
    injected: dict[str, int]     # per fault mode: faults injected
    unexplained: list[Finding]   # findings no fault explains

    def table(self) -> str:
        lines = [f"{'mode':<28} {'injected':>8} {'found':>6} {'recall':>7}"]
        for mode in sorted(self.injected):
            n, f = self.injected[mode], self.found[mode]
            lines.append(f"{mode:<28} {n:>8} {f:>6} {f / n if n else 1:>7.0%}")
        lines.append(f"findings with no fault behind them: {len(self.unexplained)}")
        return "\n".join(lines)


def score(truth: GroundTruth, found: list[Finding]) -> Score:
    injected: dict[str, int] = defaultdict(int)
    hit: dict[str, int] = defaultdict(int)
    for fault in truth.faults:
        injected[fault.mode] += 1
        if any(fault.matches(f.rule, f.keys) for f in found):
            hit[fault.mode] += 1
    unexplained = [f for f in found if not any(fault.matches(f.rule, f.keys) for fault in truth.faults)]
    return Score(found={m: hit[m] for m in injected}, injected=dict(injected), unexplained=unexplained)
