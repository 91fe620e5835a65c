"""Scoring a monitor's findings against the shop's ground truth, and a fresh shop for a recorded run.

The configs and runs themselves are in devservices.shop_monitor, shared with bench/load.py.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from devservices.kafka_connect import CDC_SCHEMA
from devservices.shop_monitor import new_topic, run_until_idle, shop_config, shop_settings
from oncewatch import shop
from oncewatch.core.records import Finding
from oncewatch.shop import GroundTruth

# --until-idle quiet time. It waits for every verdict still due of what it read (an order not yet stuck, an event
# within its grace, a skew not yet held: Engine.undecided) on its own; this is only the quiet after the last one.
IDLE = 2.0


# --until-idle of a first checkpoint (empty tables, the topics' ends): nothing to wait for but the catching up.
FIRST_IDLE = 0.5


def prepared(folder: Path, shape: str = "shop", cdc: bool = False) -> tuple[Path, str]:
    """A fresh shop of `shape` (tables, its own topic) and a monitor that has taken its first checkpoint there:
    (config, topic) for a recorded run; `cdc`: in CDC mode (devservices.shop_monitor.shop_config)."""
    topic = new_topic()
    shop.run(shop_settings(topic, shape, schema=CDC_SCHEMA if cdc else None, orders=0, reset=True))
    config = shop_config(folder, topic=topic, shape=shape, cdc=cdc)
    run_until_idle(config, idle=FIRST_IDLE)
    return config, topic


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
    unexplained = [f for f in found if not truth.explains(f.rule, f.keys)]
    return Score(found={m: hit[m] for m in injected}, injected=dict(injected), unexplained=unexplained)
