"""/metrics served over HTTP for the known scenario store: names, types, labels, values."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from devservices import scenario
from oncewatch.core import names
from oncewatch.core.protocol import BinlogStatus, CdcCounts, CdcStatus, ComponentHealth
from oncewatch.dashboards import metrics
from oncewatch.store import Store
from tests.conftest import StoreTarget

ENTITY_VALUES = {"T1001", "O501", "O502", "O507", "S1", "S2"}


def scrape(server) -> str:
    host, port = server.server_address[:2]
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as resp:
        return resp.read().decode()


@pytest.fixture
def scenario_store(store_target: StoreTarget) -> StoreTarget:
    """The known scenario in a new store, SQLite and PostgreSQL."""
    scenario.seed(store_target).close()
    return store_target


@pytest.fixture
def served(scenario_store: StoreTarget) -> Iterator[tuple[object, StoreTarget]]:
    server, thread = metrics.serve(scenario_store, port=0)
    yield server, scenario_store
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def families(text: str) -> dict[str, tuple[str, dict[tuple[tuple[str, str], ...], float]]]:
    """name -> (type, {sorted labels of each sample incl. its suffixed name: value})."""
    out = {}
    for fam in text_string_to_metric_families(text):
        out[fam.name] = (fam.type, {(("__name__", s.name), *sorted(s.labels.items())): s.value for s in fam.samples})
    return out


def value(fams: dict, sample: str, family: str | None = None, **labels: str) -> float:
    return fams[family or sample][1][(("__name__", sample), *sorted(labels.items()))]


def test_binds_loopback_by_default(served) -> None:
    server, _ = served
    assert server.server_address[0] == "127.0.0.1"


def test_collector_health(served) -> None:
    fams = families(scrape(served[0]))
    assert fams["oncewatch_collector_up"][0] == "gauge"
    for c in ("binlog", "kafka_events", "kafka_offsets"):
        assert value(fams, "oncewatch_collector_up", collector=c) == 1
    assert fams["oncewatch_collector_records_read"][0] == "counter"
    assert value(fams, "oncewatch_collector_records_read_total", "oncewatch_collector_records_read",
                 collector="binlog") == 1200
    assert value(fams, "oncewatch_collector_records_read_total", "oncewatch_collector_records_read",
                 collector="kafka_events") == 900
    assert value(fams, "oncewatch_collector_reconnects_total", "oncewatch_collector_reconnects",
                 collector="kafka_events") == 2
    assert value(fams, "oncewatch_binlog_behind_seconds") == 2.5
    assert value(fams, "oncewatch_binlog_file_number") == 3
    assert value(fams, "oncewatch_binlog_position_bytes") == 123456
    assert value(fams, "oncewatch_binlog_gtid_sequence", domain="0") == 4711
    assert fams["oncewatch_kafka_quarantined_records"][0] == "counter"
    assert value(fams, "oncewatch_kafka_quarantined_records_total", "oncewatch_kafka_quarantined_records",
                 topic="shop.events", reason="not_json") == 3
    assert value(fams, "oncewatch_kafka_quarantined_records_total", "oncewatch_kafka_quarantined_records",
                 topic="shop.events", reason="too_large") == 1
    assert value(fams, "oncewatch_kafka_read_offset", topic="shop.events", partition="2") == 298
    assert value(fams, "oncewatch_store_up") == 1
    assert {dict(k)["part"]: v for k, v in fams["oncewatch_cpu_seconds"][1].items()} == {
        "monitor": 96.0, "forkserver": 1.25, "store": 30.5, "binlog": 41.5, "kafka_events": 12.25}


def test_verdict_and_stream_lag(served) -> None:
    fams = families(scrape(served[0]))
    assert {dict(k)["verdict"]: v for k, v in fams["oncewatch_monitor_verdict"][1].items()} == {
        "healthy": 0, "degraded": 1, "failing": 0, "stopped": 0}
    assert value(fams, "oncewatch_monitor_caught_up") == 0
    assert value(fams, "oncewatch_stream_lag_seconds", stream="kafka") == 7.0
    assert value(fams, "oncewatch_stream_lag_seconds", stream="binlog") == 2.5
    assert value(fams, "oncewatch_rule_threshold", rule="F12", threshold="partition_skew_threshold") == 3.0
    assert list(fams["oncewatch_build_info"][1].values()) == [1]
    # The scenario's dropped callback_status column blinds F6 (checks.shape), which judges an order's callbacks
    # across the orders and payments tables; every other rule judges every table it reads.
    judging = {(dict(k)["rule"], dict(k)["table"]): v for k, v in fams["oncewatch_rule_can_judge"][1].items()}
    assert {key for key, v in judging.items() if v == 0} == {("F6", "shop.orders"), ("F6", "shop.payments")}
    assert judging[("F7", "shop.shipments")] == judging[("F7", "shop.orders")] == judging[("F12", "")] == 1
    assert {rule for rule, _ in judging} == {f"F{i}" for i in range(1, 17)}
    assert value(fams, "oncewatch_shape_problem", table="shop.payments",
                 config_key="domain.payments.callback_status_column", rules="F6") == 1
    assert value(fams, "oncewatch_tables_truncated_total", "oncewatch_tables_truncated", table="shop.shipments") == 1


def test_alignment_and_lag(served) -> None:
    fams = families(scrape(served[0]))
    assert value(fams, "oncewatch_backlog_changes", table="shop.orders") == 7
    assert value(fams, "oncewatch_backlog_changes", table="shop.shipments") == 2
    kind, delay = fams["oncewatch_event_delay_seconds"]
    assert kind == "histogram"
    assert {dict(k)["clock"] for k in delay} == {"gtid_commit_ts", "row_column"}
    assert value(fams, "oncewatch_event_delay_seconds_bucket", "oncewatch_event_delay_seconds",
                 clock="gtid_commit_ts", le="0.25") == 90
    assert value(fams, "oncewatch_event_delay_seconds_count", "oncewatch_event_delay_seconds",
                 clock="row_column") == 20
    assert value(fams, "oncewatch_event_delay_seconds_sum", "oncewatch_event_delay_seconds",
                 clock="gtid_commit_ts") == 9.8
    g = {"group": "shipping-service", "topic": "shop.events"}
    assert value(fams, "oncewatch_consumer_group_lag", partition="1", **g) == 22
    assert value(fams, "oncewatch_consumer_group_lag_seconds", partition="0", **g) == 1.5
    assert value(fams, "oncewatch_consumer_group_committed_offset", partition="1", **g) == 280
    # Partition 2 never committed: no lag sample (not 0), counted as uncommitted instead.
    assert (("__name__", "oncewatch_consumer_group_lag"), ("group", "shipping-service"), ("partition", "2"),
            ("topic", "shop.events")) not in fams["oncewatch_consumer_group_lag"][1]
    assert value(fams, "oncewatch_consumer_group_partitions_uncommitted", **g) == 1
    assert value(fams, "oncewatch_consumer_group_lag_stddev", **g) == 6.0
    assert value(fams, "oncewatch_consumer_group_lag_stddev", group="points-service", topic="shop.events") == 0


def test_findings(served) -> None:
    fams = families(scrape(served[0]))
    assert fams["oncewatch_findings_open"][0] == "gauge"
    assert value(fams, "oncewatch_findings_open", rule="F9", severity="info") == 2
    assert value(fams, "oncewatch_findings_open", rule="F1", severity="critical") == 1
    assert fams["oncewatch_findings_found"][0] == "counter"
    found = fams["oncewatch_findings_found"][1]
    assert len(found) == 16  # every rule, zero or not
    assert value(fams, "oncewatch_findings_found_total", "oncewatch_findings_found", rule="F9") == 3
    assert value(fams, "oncewatch_findings_found_total", "oncewatch_findings_found", rule="F3") == 0


def test_trade_verdicts_and_the_slo(served) -> None:
    """The scenario's verdicts (devservices.scenario.trade_verdicts), from the store's running totals."""
    fams = families(scrape(served[0]))
    count = {name: value(fams, f"oncewatch_{name}_total", f"oncewatch_{name}")
             for name in ("trades_verified", "amount_verified", "amount_violated", "amount_verified_late",
                          "amount_reversed")}
    assert count == {"trades_verified": 4, "amount_verified": 999.5, "amount_violated": 99.0,
                     "amount_verified_late": 50.0, "amount_reversed": 0.0}
    violated = fams["oncewatch_trades_violated"][1]
    assert len(violated) == 10 and value(fams, "oncewatch_trades_violated_total", "oncewatch_trades_violated",
                                         rule="F1") == 1
    assert value(fams, "oncewatch_trades_pending") == 1
    assert fams["oncewatch_verification_seconds"][0] == "histogram"
    seconds = "oncewatch_verification_seconds"
    assert value(fams, f"{seconds}_count", seconds) == 5 and value(fams, f"{seconds}_sum", seconds) == 4 + 3 * 30 + 180
    assert value(fams, f"{seconds}_bucket", seconds, le="60.0") == 4
    assert (value(fams, "oncewatch_slo_objective"), value(fams, "oncewatch_slo_within_seconds")) == (0.999, 60.0)


def test_names_follow_conventions_and_labels_hold_no_entities(served) -> None:
    """Entities only in the finding and entity labels of the series that page one by one (bounded by
    metrics.paging_max_findings)."""
    fams = families(scrape(served[0]))
    for name, (kind, samples) in fams.items():
        assert name.startswith("oncewatch_")
        for labels in samples:
            sample_name = labels[0][1]
            assert not (kind == "counter") or sample_name.endswith("_total"), sample_name
            free = {"finding", "entity"} if name == "oncewatch_finding_paging" else set()
            assert not {v for k, v in labels[1:] if k not in free} & ENTITY_VALUES, labels
    entities = [dict(labels)["entity"] for labels in fams["oncewatch_finding_paging"][1]]
    assert entities and all(any(e in entity for e in ENTITY_VALUES) for entity in entities), entities


def test_disconnected_collector_and_missing_store(served, tmp_path: Path) -> None:
    server, scenario_store = served
    store = Store(scenario_store)
    store.set_health("binlog", ComponentHealth(BinlogStatus(connected=False, last_error="Lost connection", reconnects=3,
                                                            rows_read=1200, transactions_read=400)))
    store.close()
    fams = families(scrape(server))
    assert value(fams, "oncewatch_collector_up", collector="binlog") == 0
    assert fams["oncewatch_binlog_behind_seconds"][1] == {}

    missing = metrics.registry(str(tmp_path / "nowhere.db"))
    assert missing.get_sample_value("oncewatch_store_up") == 0
    (tmp_path / "empty.db").touch()  # created, never initialised by a monitor: no tables
    assert metrics.registry(str(tmp_path / "empty.db")).get_sample_value("oncewatch_store_up") == 0


def test_shape_problems_and_what_they_suppressed_are_on_metrics(scenario_store):
    store = Store(scenario_store)
    with store.batch() as tx:
        tx.set_state(names.ENGINE_STATS, {**scenario.ENGINE_STATS, "suppressed_total": {"F8": 3}, "shape_problems": [
            {"table": "shop.orders", "column": "status", "config_key": "domain.orders.status_column",
             "rules": ["F3", "F4", "F6"], "what": "shop.orders.status is gone (dropped or renamed)"}]})
    store.close()
    text = generate_latest(metrics.registry(scenario_store)).decode()
    assert 'oncewatch_findings_suppressed_total{rule="F8"} 3.0' in text
    assert 'oncewatch_findings_suppressed_total{rule="F1"} 0.0' in text
    assert ('oncewatch_shape_problem{config_key="domain.orders.status_column",rules="F3,F4,F6",table="shop.orders"} '
            '1.0') in text


def test_a_cdc_change_source_s_counts(scenario_store) -> None:
    store = Store(scenario_store)
    row = store.health()["binlog"].health
    store.set_health("binlog", replace(row, status=CdcStatus(**vars(row.status), source="debezium", cdc=CdcCounts(
        incomplete_transactions=2, replayed_records=40, late_records=1, unreadable_records=3, open_transactions=5))))
    store.close()
    server, thread = metrics.serve(scenario_store, port=0)
    try:
        fams = families(scrape(server))
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert {k: value(fams, "oncewatch_cdc_records_total", "oncewatch_cdc_records", kind=k)
            for k in ("replayed", "late", "unreadable")} == {"replayed": 40, "late": 1, "unreadable": 3}
    assert value(fams, "oncewatch_cdc_incomplete_transactions_total", "oncewatch_cdc_incomplete_transactions") == 2
    assert value(fams, "oncewatch_cdc_open_transactions") == 5
    assert value(fams, "oncewatch_binlog_gtid_sequence", domain="0") == 4711  # the rest of the source's row as before


def test_a_group_member_serves_its_own_row_and_the_stores_only_while_it_leads(tmp_path: Path) -> None:
    """Of a group's members scraped, the one owning the leader shard alone serves the findings and the shards, so
    an alert fires once; every member serves its own row."""
    path = str(tmp_path / "group.db")
    store = scenario.seed(path)
    scenario.seed_group(store)
    store.close()

    def families(**kw) -> dict[str, list]:
        text = generate_latest(metrics.registry(path, **kw)).decode()
        return {f.name: f.samples for f in text_string_to_metric_families(text)}

    follower = families(member="west", wide=lambda: False)
    assert {"oncewatch_store_up", "oncewatch_build_info"} < set(follower)
    assert "oncewatch_findings_by_status" not in follower and "oncewatch_group_shard_owner" not in follower
    assert {s.labels["member"] for s in follower["oncewatch_group_member_shards"]} == {"west"}
    assert [(s.labels["member"], s.value) for s in follower["oncewatch_group_member_rejoins"]
            if s.name.endswith("_total")] == [("west", 2)]
    leader = families(member="east", wide=lambda: True)
    assert {s.labels["member"] for s in leader["oncewatch_group_member_shards"]} == {"east", "west"}
    assert {(s.labels["shard"], s.labels["member"]) for s in leader["oncewatch_group_shard_owner"]} == {
        ("0", "east"), ("1", "east"), ("2", "west")}
    assert [s.value for s in leader["oncewatch_group_shard_lag_messages"]] == [0, 0, 40]
    assert "oncewatch_findings_by_status" in leader
    # the store's series as the group's, whichever member serves them: one alert across a move of shard 0
    grouped = families(member="east", wide=lambda: True, group="shop")
    assert {s.labels["instance"] for s in grouped["oncewatch_findings_by_status"]} == {"group/shop"}
    assert {s.labels.get("instance") for s in grouped["oncewatch_group_member_shards"]} == {"group/shop"}
    assert "instance" not in grouped["oncewatch_store_up"][0].labels  # its own: the scraped target's
    assert ([(s.name, s.labels["member"], s.value) for s in grouped["oncewatch_group_member_rejoins"]]
            == [(s.name, s.labels["member"], s.value) for s in leader["oncewatch_group_member_rejoins"]])
