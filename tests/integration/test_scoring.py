"""The monitor scored against the simulated shop's ground truth (issues 5 and 17).

A seeded run with every fault mode on, then `oncewatch run --until-idle`: every injected fault
found (recall 100% per mode) and every finding explained by a fault (precision 100%), both by a
monitor tailing the binlog and by one reading the same changes from Debezium's topics (CDC mode,
SIGKILLed on its way in one of the runs), with each announcement style (each style brings the
faults it can produce); runs with no faults give no findings at all, both ways. And all of it
again on a shop of the other shape, the mall of examples/mall.toml: a callback log table, orders
and payments sharded across two schemas, events in envelopes with their own ids and times,
amounts in cents.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest

from devservices.kafka_connect import CDC_SCHEMA
from devservices.shop_monitor import (ROOT, SHORT_RULES, findings, new_topic, run_until_idle, shop_config,
                                      shop_settings)
from oncewatch import shop
from oncewatch.core.records import VERDICT_VERIFIED, VERDICT_VIOLATED
from oncewatch.shop.settings import STYLE_IN_TRANSACTION, STYLE_OUTBOX
from oncewatch.store import Store

from .shop_monitor import FIRST_IDLE, IDLE, Score, check_verdicts, prepared, score


# F10 at 1.5 s here, between the shop's slow sends (2 s late, the send_slow fault) and the delays its
# clean sends really have on a busy CI machine (up to 1.24 s seen once, in a full suite run): the
# monitor was right about those, they are no fault of the shop's to score. F10 at its 0.5 s default is
# tested by its unit tests and by the all-faults runs of test_shop and test_under_fire.
# F11 at 1,000 records: a group stalled from the start passes it within 600 orders (some 2,000 events behind),
# so the runs need not be eight times as long to reach the default 5,000 (which the rule's unit tests judge at).
SCORING_RULES = {**SHORT_RULES, "event_delay_seconds": 1.5, "offset_drift_threshold": 1000}
# Orders of a run with every fault: each mode some 12 times.
FAULT_ORDERS = 600


def scored_run(tmp_path, shape="shop", **settings):
    _, topic = prepared(tmp_path, shape)
    config = shop_config(tmp_path, topic=topic, rules=SCORING_RULES, shape=shape)
    truth = shop.run(shop_settings(topic, shape, **settings))
    assert not truth.incidents, truth.incidents
    run_until_idle(config, idle=IDLE)
    result = score(truth, findings(config))
    print(f"\n{shape} {settings}\n{result.table()}")
    return truth, result


def killed_then_idle(config, kills: int, seed: int) -> None:
    """`oncewatch run` SIGKILLed `kills` times at random moments of its catching up, then run until idle."""
    rng = random.Random(seed)
    for _ in range(kills):
        monitor = subprocess.Popen([sys.executable, "-m", "oncewatch.cli", "run", "--config", str(config)], cwd=ROOT,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(1.0, 2.5))
        os.kill(monitor.pid, signal.SIGKILL)
        monitor.wait()
    run_until_idle(config, idle=IDLE)


def scored_both_ways(tmp_path, kills: int = 0, **settings) -> tuple[shop.GroundTruth, dict[str, Score]]:
    """One run of the shop in the schema the dev connector captures, read by two monitors side by side: one
    tailing the binlog, one in CDC mode reading Debezium's topics (issue 15), that one SIGKILLed `kills` times
    while it catches up. Their findings are the same (ids, severities, what they say), and the CDC source lost
    and could not read nothing."""
    folders = {mode: tmp_path / mode for mode in ("binlog", "cdc")}
    for folder in folders.values():
        folder.mkdir()
    topic = new_topic()
    shop.run(shop_settings(topic, schema=CDC_SCHEMA, orders=0, reset=True))
    configs = {mode: shop_config(folder, topic=topic, rules=SCORING_RULES, schema=CDC_SCHEMA, cdc=mode == "cdc")
               for mode, folder in folders.items()}
    with ThreadPoolExecutor(2) as pool:  # their first checkpoints: a bootstrap of the empty tables, the topics' ends
        for future in [pool.submit(run_until_idle, config, idle=FIRST_IDLE) for config in configs.values()]:
            future.result()
    truth = shop.run(shop_settings(topic, schema=CDC_SCHEMA, **settings))
    assert not truth.incidents, truth.incidents
    with ThreadPoolExecutor(2) as pool:
        done = [pool.submit(run_until_idle, configs["binlog"], idle=IDLE),
                pool.submit(killed_then_idle, configs["cdc"], kills, settings.get("seed", 0))]
        for future in done:
            future.result()
    found = {mode: findings(config) for mode, config in configs.items()}
    results = {mode: score(truth, found[mode]) for mode in configs}
    for mode, result in results.items():
        print(f"\n{mode} {settings}\n{result.table()}")
    assert {(f.id, f.severity, f.summary) for f in found["cdc"]} == {(f.id, f.severity, f.summary)
                                                                    for f in found["binlog"]}
    store = Store(str(folders["cdc"] / "store.db"), readonly=True)
    try:
        rows, source = store.row_changes(limit=1), store.health()["binlog"].health.status
    finally:
        store.close()
    assert source.source == "debezium" and (not rows or rows[0].schema == CDC_SCHEMA)
    assert source.cdc.incomplete_transactions == 0 and source.cdc.unreadable_records == 0
    return truth, results


def test_every_fault_mode_found_and_nothing_else_from_the_binlog_and_from_debezium(cdc_connector, tmp_path):
    """The CDC monitor is SIGKILLed three times on its way: its findings are still the undisturbed binlog one's, and
    so are its verdicts per trade (issue 45): every trade the ground truth calls clean verified, every faulty one
    violated, their money the shop's own to the cent."""
    truth, results = scored_both_ways(tmp_path, kills=3, seed=11, orders=FAULT_ORDERS, rate=100, faults="all")
    for mode, result in results.items():
        assert len(result.injected) == 14  # every mode the default style can produce
        assert result.found == result.injected, (mode, result.table())
        assert result.unexplained == [], (mode, [(f.rule, f.keys, f.summary) for f in result.unexplained[:10]])
    checks = {mode: check_verdicts(truth, tmp_path / mode / "store.db", CDC_SCHEMA) for mode in results}
    for mode, check in checks.items():
        print(f"\n{mode} verdicts: {check.counts()}, money {check.sums}")
        assert check.problems == [], (mode, len(check.problems), check.problems[:10])
        assert {v for v, _ in check.verdicts.values()} == {VERDICT_VERIFIED, VERDICT_VIOLATED}, check.counts()
        assert all(ours == shops for ours, shops in check.sums.values()), (mode, check.sums)
        totals = check.totals  # what /metrics counts: each move once
        verified = Decimal(totals["amount_verified"]) - Decimal(totals["amount_reversed"])
        assert verified == check.sums[VERDICT_VERIFIED][0]
        assert Decimal(totals["amount_violated"]) == check.sums[VERDICT_VIOLATED][0]
    assert checks["cdc"].verdicts == checks["binlog"].verdicts
    assert checks["cdc"].totals == checks["binlog"].totals | {"seconds": checks["cdc"].totals["seconds"]}


@pytest.mark.parametrize("style, only_there", [(STYLE_IN_TRANSACTION, "send_then_rollback"),
                                               (STYLE_OUTBOX, None)])
def test_each_announcement_style_its_faults_found_from_the_binlog_and_from_debezium(cdc_connector, tmp_path, style,
                                                                                  only_there):
    # Long enough for the stalled group to pass F11's 1000 records: a stall of the whole group is not F12.
    truth, results = scored_both_ways(tmp_path, seed=13, orders=FAULT_ORDERS, rate=100, faults="all", style=style)
    for mode, result in results.items():
        if only_there:
            assert only_there in result.injected
        assert "send_lost" not in result.injected or style != STYLE_OUTBOX  # the outbox cannot lose a send
        assert result.found == result.injected, (mode, result.table())
        assert result.unexplained == [], (mode, [(f.rule, f.keys, f.summary) for f in result.unexplained[:10]])


def test_a_clean_run_gives_zero_findings_from_the_binlog_and_from_debezium(cdc_connector, tmp_path):
    truth, results = scored_both_ways(tmp_path, seed=12, orders=300, rate=100, faults="none")
    assert list(truth.faults) == []
    assert {mode: r.unexplained for mode, r in results.items()} == {"binlog": [], "cdc": []}


# The mall's precision is judged by its all-faults run, where every finding must be explained (a clean run of it
# costs some 25 s of a make test that must stay under 15 minutes; the flat shop's runs clean both ways above).
def test_the_mall_every_fault_mode_found_and_nothing_else(tmp_path):
    truth, result = scored_run(tmp_path, "mall", seed=17, orders=FAULT_ORDERS, rate=100, faults="all")
    assert len(result.injected) == 14  # the same modes as the flat shop's default style
    assert result.found == result.injected, result.table()
    assert result.unexplained == [], [(f.rule, f.keys, f.summary) for f in result.unexplained[:10]]
    found = findings_of(tmp_path)
    # the sharded tables and the callback log are where the evidence says the facts are
    tables = {e.values.get("table") for f in found for e in f.evidence if e.kind == "row_change"}
    assert {"owmall_0.pay_callback_log", "owmall_1.pay_callback_log"} <= tables
    assert {f"owmall_{s}.pay_order_{n}" for s in (0, 1) for n in range(4)} <= tables
    # a resend in an envelope of its own is a replay of the same business fact: info, not a conflict
    assert {f.severity for f in found if f.rule == "F9"} == {"info"}


def findings_of(folder):
    return findings(folder / "oncewatch.toml")
