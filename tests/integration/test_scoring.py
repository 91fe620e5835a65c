"""The monitor scored against the simulated shop's ground truth (issue 5's acceptance).

A seeded run with every fault mode on, then `oncewatch run --until-idle`: every injected fault
found (recall 100% per mode) and every finding explained by a fault (precision 100%); a run
with no faults gives no findings at all.
"""

from __future__ import annotations

import shop

from .shop_monitor import findings, run_until_idle, score, shop_config, shop_settings

IDLE = 25.0  # longer than the stuck-pending threshold, so every absence rule has had its say


def prepared(tmp_path, **config):
    """A fresh shop (tables, topic, groups) and a monitor that has taken its first checkpoint."""
    shop.run(shop_settings(orders=0, reset=True))
    config_path = shop_config(tmp_path, **config)
    run_until_idle(config_path, idle=1.0)
    return config_path


def test_every_fault_mode_found_and_nothing_else(tmp_path):
    config = prepared(tmp_path)
    truth = shop.run(shop_settings(seed=11, orders=2000, rate=80, faults="all"))
    assert not truth.incidents, truth.incidents
    run_until_idle(config, idle=IDLE)
    result = score(truth, findings(config))
    print("\n" + result.table())
    assert set(result.injected) >= {"retry_no_idempotency", "send_lost", "consumer_stall"}
    assert result.found == result.injected, result.table()
    assert result.unexplained == [], [(f.rule, f.keys, f.summary) for f in result.unexplained[:10]]


def test_clean_run_gives_zero_findings(tmp_path):
    config = prepared(tmp_path)
    truth = shop.run(shop_settings(seed=12, orders=600, rate=80, faults="none"))
    assert truth.faults == () or list(truth.faults) == []
    run_until_idle(config, idle=IDLE)
    assert [(f.rule, f.keys, f.summary) for f in findings(config)] == []
