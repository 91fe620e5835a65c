"""Every dashboard page run by AppTest on the known scenario store: no exceptions, the right figures."""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy
import pytest
from streamlit import config as st_config
from streamlit.testing.v1 import AppTest

from devservices import scenario
from oncewatch import cli
from oncewatch.core import names
from oncewatch.core.protocol import BinlogStatus, ComponentHealth
from oncewatch.core.records import Evidence, Finding, QuarantinedRows
from oncewatch.dashboards import auth, login_limits, report_check, reports, ui, views
from oncewatch.store import Store, retention, reviews
from tests.conftest import SQLITE_ONLY, StoreTarget, name_store, store_keys, store_section
from tests.unit.test_metrics import scenario_store  # noqa: F401 - the scenario store fixture

APP = str(Path(__file__).resolve().parents[2] / "app.py")
PAGES = "dashboards/screens/{}.py"


@pytest.fixture
def env(tmp_path: Path, scenario_store: StoreTarget, monkeypatch: pytest.MonkeyPatch) -> Path:
    """ONCEWATCH_CONFIG names a config whose store is the scenario; the server 'listens' on loopback; the
    login's server-wide limiter starts afresh (every AppTest session shares it, as a server's do)."""
    cfg = tmp_path / "oncewatch.toml"
    cfg.write_text(f'[mysql]\nuser = "oncewatch"\ntables = ["shop.orders"]\n\n{store_section(scenario_store)}')
    for name in (views.ENV_STORE, auth.PASSWORD_ENV, auth.PASSWORD_FILE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(views.ENV_CONFIG, str(cfg))
    monkeypatch.setattr(login_limits, "LIMITER", login_limits.LoginLimiter())
    set_address("127.0.0.1")
    return cfg


def set_address(address: str | None) -> None:
    st_config.set_option("server.address", address)


@pytest.fixture(autouse=True)
def reset_address() -> Iterator[None]:
    yield
    set_address(None)


def run(page: str, **query: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=30).run()
    if page != "overview":
        at.switch_page(PAGES.format(page))
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, at.exception
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def errors(at: AppTest) -> list[str]:
    """The page's errors but the shop's state (an error box while critical findings are open)."""
    return [e.value for e in at.error if not e.value.startswith("**Shop ")]


def values(array: list | dict) -> list[float]:
    """A plotly trace's numbers, as a list or in plotly's typed-array form ({"dtype", "bdata"})."""
    if isinstance(array, list):
        return array
    return numpy.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"]).tolist()


def plotly_count(at: AppTest) -> int:
    return len(at.get("plotly_chart"))


# ---------------------------------------------------------------- Overview

def test_overview_tiles_and_charts(env: Path) -> None:
    at = run("overview")
    assert metrics(at) == {
        "Verified exactly once": "86.43% of the money in 24 h",  # 949.50 of 1,098.50 (devservices.scenario)
        "Monitor": "degraded", "Binlog — up, behind": "2.5 s", "Kafka events — up, unread": "4",
        "Kafka offsets — up, max lag": "22", "Open critical findings": "3", "Backlog": "9",
        "p99 event delay": "475 ms"}
    assert plotly_count(at) == 5  # the three signals, the backlog, the findings timeline
    # the shop's state under the monitor's verdict, in its own box (issue 43)
    assert [e.value for e in at.error] == ["**Shop critical**: 3 open critical findings; 2 open info findings; "
                                           "every watched consumer group within 5,000 records"]
    assert at.sidebar.caption[0].value == "No login configured: the dashboard is bound to 127.0.0.1 only."
    # the verdict and its reasons at the top; each of the seed's three signals drawn with its threshold
    assert at.warning[0].value.startswith("**Monitor degraded**: kafka read 7.0 s behind")
    assert at.warning[0].value.endswith("; cannot judge now: F6 on shop.orders, shop.payments")
    lines = {json.loads(c.proto.spec)["layout"]["title"]["text"]: [
        (shape["y0"], shape["line"]["dash"]) for shape in json.loads(c.proto.spec)["layout"].get("shapes", [])]
        for c in at.get("plotly_chart")}
    assert lines["Consumer-group lag (records)"] == [(5000.0, "dash")]
    assert lines["p99 event delay over the last minute (s)"] == [(0.5, "dash")]
    assert lines["Partition lag spread, stddev (records)"] == [(3.0, "dash")]
    assert lines["Changes waiting for their event"] == []  # a line at 5000 would flatten the few waiting
    axes = {json.loads(c.proto.spec)["layout"]["xaxis"]["title"]["text"] for c in at.get("plotly_chart")}
    assert axes == {"time (UTC)"}


def test_overview_leads_with_the_money_verified_exactly_once_in_the_configs_unit(env: Path) -> None:
    env.write_text(env.read_text() + '\n[slo]\nunit = "¥"\nwithin_seconds = 200\nwindow_hours = 1\n')
    tile = next(m for m in run("overview").metric if m.label == "Verified exactly once")
    assert tile.value == "90.98% of ¥ in 1 h"  # the late 50.00 is in time now: 999.50 of 1,098.50
    assert "; 1 pending" in tile.help and "objective is 99.9%" in tile.help


def test_overview_shows_every_member_of_a_group_and_a_shard_nobody_judges(env: Path,
                                                                          scenario_store: StoreTarget) -> None:
    store = Store(scenario_store)
    scenario.seed_group(store)
    store.close()
    at = run("overview")
    members, shards = (t.value for t in at.dataframe[:2])
    assert list(members["member"]) == ["east", "west"] and list(members["state"]) == ["live", "gone"]
    assert list(members["change source"]) == ["reads it", ""] and list(members["event partitions"]) == [2, 1]
    assert list(shards["owner"]) == ["east", "east", "west"] and list(shards["lag (messages)"]) == [0, 0, 40]
    assert "1 member(s) live; gone: west" in [c.value for c in at.caption]
    assert any(e.startswith("Shard(s) 2 not committed for over 30 s") for e in errors(at))


@SQLITE_ONLY
def test_a_group_without_a_monitor_row_gives_its_own_verdict_on_every_page(env: Path,
                                                                         scenario_store: StoreTarget) -> None:
    """A group's store has no monitor row: the banner and the verdict tile are the group's, not "not written its
    health yet"."""
    store = Store(scenario_store)
    scenario.seed_group(store)
    store.conn.execute("DELETE FROM health WHERE component = ?", (names.MONITOR,))
    store.close()
    for page in ("overview", "findings", "drift"):
        at = run(page)
        assert errors(at)[:1] == [
            "**Group failing**: shard(s) 2 not committed for over 30 s: no member judges them"], page
        assert not [w.value for w in at.warning if "not written its health" in w.value], page
    assert metrics(run("overview"))["Group"] == "failing"


def test_the_monitor_and_the_shop_each_have_their_verdict_on_every_page(env: Path,
                                                                       scenario_store: StoreTarget) -> None:
    """Issue 43, seen 4: the banner said "Monitor degraded: consumer group shipping-service is 7352 records behind",
    the shop's consumer, while the monitor read within a second; the tile "Open critical findings" counted the
    acknowledged ones too. The monitor says how it reads, the shop what is wrong in it; the tile counts the open."""
    store = Store(scenario_store)
    health = store.health()
    store.set_health(names.MONITOR, replace(health[names.MONITOR].health, verdict="healthy", reasons=(), caught_up=True,
                                            blind_tables={}, shape_problems=(),
                                            lag_seconds={"binlog": 0.25, "kafka": 0.695}))
    row = health[names.KAFKA_OFFSETS].health
    offsets = row.status
    first = offsets.groups[0]
    stalled = replace(first, partitions=tuple(replace(p, lag=lag) for p, lag in zip(first.partitions, (3676, 3676, 0))))
    store.set_health(names.KAFKA_OFFSETS, replace(row, status=replace(offsets, groups=(stalled, *offsets.groups[1:]))))
    reviews.acknowledge(store, ["f1-t1001"], by="ana", note="", until=4e9, now=2e9)
    store.close()
    monitor_words = "**Monitor healthy**: both streams read, every rule judging (binlog 250 ms, kafka 695 ms behind)"
    shop_words = ("**Shop critical**: 2 open critical findings; 2 open info findings (1 more acknowledged); "
                  "consumer group shipping-service is 7,352 records behind (F11's threshold 5,000)")
    for page in ("overview", "findings", "incidents", "drilldown", "drift", "quarantine"):
        at = run(page)
        assert [s.value for s in at.success][:1] == [monitor_words], page
        assert [e.value for e in at.error][:1] == [shop_words], page
    tile = next(m for m in run("overview").metric if m.label == "Open critical findings")
    assert (tile.value, tile.help) == ("2", "Open and not acknowledged; 1 more acknowledged (a person has them)")


@SQLITE_ONLY
def test_overview_says_when_the_monitor_is_stale_or_a_collector_down(env: Path, scenario_store: StoreTarget) -> None:
    store = Store(scenario_store)
    store.set_health("binlog", ComponentHealth(BinlogStatus(
        connected=False, last_error="Lost connection to MySQL server", disconnected_since=1_700_000_000.0,
        reconnects=4)))
    store.conn.execute("UPDATE health SET updated_at = updated_at - 300 WHERE component != 'binlog'")
    store.close()
    at = run("overview")
    tiles = metrics(at)
    assert tiles["Binlog — DOWN since"] == "22:13:20"
    assert tiles["Kafka events — stale, unread"] == "4"
    assert "Monitor — stale" in tiles
    assert "The monitor is stale" in at.error[0].value


def test_a_stopped_monitor_says_so_on_every_page(env: Path, scenario_store: StoreTarget) -> None:
    """The last row of a monitor that stopped cleanly: "stopped", not "failing" because its readers are down."""
    store = Store(scenario_store)
    monitor = store.health()["monitor"].health
    store.set_health("monitor", replace(monitor, verdict="stopped", reasons=("stopped",)))
    store.close()
    for page in ("overview", "drift"):
        at = run(page)
        assert at.error[0].value.startswith("**Monitor stopped** at 20"), at.error[0].value
        assert "nothing is read until `oncewatch run` starts again" in at.error[0].value


@SQLITE_ONLY
def test_missing_store_is_explained(env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(views.ENV_STORE, str(tmp_path / "absent.db"))
    at = run("overview")
    assert "The oncewatch store cannot be read" in at.error[0].value


# ---------------------------------------------------------------- Findings

def test_findings_table_filters_and_links(env: Path) -> None:
    at = run("findings")
    table = at.dataframe[0].value
    assert len(table) == 7 and at.caption[0].value.startswith("7 findings match")
    assert table["rule"].tolist()[0] == "F9" and table["entity"].tolist()[-1] == "T1001"  # newest first
    # an announcement's finding opens its key with its table (a bare id could be any table's)
    assert at.get("page_link")[0].proto.label == "Drill-down for key:shop.orders:O507"

    assert set(run("findings", rule="F9").dataframe[0].value["rule"]) == {"F9"}  # the Grafana board's link

    at.multiselect[2].set_value(["open"]).run()
    assert len(at.dataframe[0].value) == 5
    at.multiselect[0].set_value(["F9"]).run()
    assert at.dataframe[0].value["severity"].tolist() == ["critical", "info", "info"]

    at.multiselect[0].set_value([]).run()
    at.multiselect[2].set_value([]).run()
    at.text_input[0].set_value("T1001").run()
    table = at.dataframe[0].value
    assert table["drill-down"].tolist() == ["drilldown?q=T1001"]
    assert table["summary"].tolist() == ["2 shop.shipments rows for trade_no T1001 (S1, S2)"]


def test_findings_are_paged(env: Path, scenario_store: StoreTarget) -> None:
    store = Store(scenario_store)
    with store.batch() as tx:
        tx.upsert_findings(Finding(id=f"bulk-{i}", rule="F3", name="stuck_pending", severity="warning",
                                   keys={"order_key": f"B{i}"}, summary="stuck", first_seen=1000.0 + i,
                                   last_seen=1000.0 + i, evidence=(Evidence("row_change", "f:1", 1.0, {}),))
                           for i in range(250))
    store.close()
    at = run("findings")
    assert at.number_input[0].label == "Page (of 3)" and len(at.dataframe[0].value) == 100
    at.number_input[0].set_value(3).run()
    assert len(at.dataframe[0].value) == 57  # 257 findings: 7 of the scenario, 250 more
    assert at.caption[0].value == "257 findings match; showing 201–257, newest first."


# ---------------------------------------------------------------- Drill-down

def test_drilldown_of_a_trade_no(env: Path) -> None:
    at = run("drilldown", q="T1001")
    assert metrics(at) == {"Row changes": "3", "Kafka events": "3", "Findings": "1"}
    timeline = at.dataframe[0].value
    assert timeline["source"].tolist() == ["binlog", "kafka", "binlog", "kafka", "binlog", "kafka"]
    assert timeline["coordinates"].tolist()[2:4] == ["mysql-bin.000003:104703#0-1-4703/0", "shop.events/1@200"]
    assert timeline["change"].tolist()[2] == "+ shipment_id=S1, trade_no=T1001"
    assert timeline["clock"].tolist()[:2] == ["gtid_commit_ts", "CreateTime"]
    assert at.expander[0].label == ("F1 duplicate_effect · critical · open: "
                                    "2 shop.shipments rows for trade_no T1001 (S1, S2)")
    evidence = at.dataframe[1].value
    assert evidence["coordinates"].tolist() == ["mysql-bin.000003:104703#0-1-4703/0",
                                                "mysql-bin.000003:104704#0-1-4704/0"]
    assert plotly_count(at) == 1


def test_drilldown_says_what_the_store_no_longer_keeps(env: Path, scenario_store: StoreTarget) -> None:
    """Raw records pruned for the retention and for the budget: the drill-down says how many, and from when it
    keeps them; the finding keeps its evidence."""
    at = run("drilldown", q="T1001")
    assert not [c for c in at.caption if "The store keeps raw records" in c.value]
    store = Store(scenario_store)
    first, *_ = store.row_changes()
    retention.prune(store, first.commit_time + 0.001, limit=1)
    gone = retention.prune(store, float("inf"), limit=1, for_budget=True, now=first.commit_time)
    second = store.row_changes(limit=1)[0]
    store.close()
    at = run("drilldown", q="T1001")
    [note] = [c.value for c in at.caption if "The store keeps raw records" in c.value]
    assert note.startswith(f"The store keeps raw records back to {ui.when(second.commit_time)}: ")
    assert f"1 older ones went past store.retention_hours and {gone['row_changes'] + gone['events']:,} to keep it " \
        f"within store.max_bytes" in note
    assert at.expander[0].label.startswith("F1 duplicate_effect")


@SQLITE_ONLY
def test_drilldown_of_an_order_shows_value_diffs(env: Path) -> None:
    at = run("drilldown", q="O501")
    changes = at.dataframe[0].value["change"].tolist()
    assert "status: pending → paid" in changes
    assert "+ amount=99.00, order_no=O501, status=pending" in changes


@SQLITE_ONLY
def test_drilldown_of_an_announced_key_with_its_table(env: Path) -> None:
    """The link of an F9 on order.paid O507: the order's two events, and the finding."""
    at = run("drilldown", q="key:shop.orders:O507")
    assert metrics(at) == {"Row changes": "0", "Kafka events": "2", "Findings": "1"}
    assert any(e.label.startswith("F9 duplicate_event") for e in at.expander)
    assert not errors(at)


def test_drilldown_of_a_consumer_group_draws_its_readings(env: Path) -> None:
    """The link of an F11 or F12 on a group: its lag and spread over the window, thresholds dashed, and its
    lag per partition as last polled."""
    at = run("drilldown", q="group:shipping-service")
    assert metrics(at) == {"Readings": "42", "Findings": "0"}
    shapes = {json.loads(c.proto.spec)["layout"]["title"]["text"]: [
        s["y0"] for s in json.loads(c.proto.spec)["layout"].get("shapes", [])] for c in at.get("plotly_chart")}
    assert shapes == {"Consumer-group lag (records)": [5000.0], "Partition lag spread, stddev (records)": [3.0]}
    assert set(at.dataframe[0].value["group"]) == {"shipping-service"}
    assert not errors(at)


@SQLITE_ONLY
def test_drilldown_of_an_unknown_entity(env: Path) -> None:
    at = run("drilldown", q="nope")
    assert metrics(at) == {"Row changes": "0", "Kafka events": "0", "Findings": "0"}
    assert at.info[0].value == "No row change or event of this entity is in the store."


# ---------------------------------------------------------------- Drift

def test_drift_lag_skew_and_delay(env: Path) -> None:
    at = run("drift")
    assert metrics(at) == {"Max partition lag": "22", "Worst lag stddev": "6.00", "Unread by the monitor": "4",
                           "p99 delay since start": "475 ms",
                           # the scenario's monitor checks a CDC pipeline too, two transactions behind
                           "Transactions not delivered": "2", "Oldest waiting": "1.5 s", "Position gap": "1,800 B",
                           "Replayed records": "0"}
    lag, skew, position, quarantined, delay = (d.value for d in at.dataframe)
    assert lag["committed"].tolist()[:3] == ["290", "280", "no commit"]
    assert lag["lag_seconds"].tolist()[:2] == [1.5, 3.0]
    assert dict(zip(skew["group"], skew["lag stddev (F12)"])) == {"points-service": 0.0, "shipping-service": 6.0}
    assert position["unread"].tolist() == [0, 2, 2]
    assert quarantined["records"].tolist() == [3, 1]
    assert delay.to_dict("records") == [
        {"clock": "gtid_commit_ts", "pairs": 100, "p50": "48 ms", "p99": "475 ms"},
        {"clock": "row_column", "pairs": 20, "p50": "250 ms", "p99": "2.4 s"}]
    # the spread over time, lag in records and seconds, backlog, the CDC position gap, delay buckets
    assert plotly_count(at) == 6
    specs = {json.loads(c.proto.spec)["layout"]["title"]["text"]: json.loads(c.proto.spec)["layout"]
             for c in at.get("plotly_chart")}
    spread = specs["Partition lag spread over time, stddev (records)"]
    assert [s["y0"] for s in spread["shapes"]] == [3.0] and spread["xaxis"]["title"]["text"] == "time (UTC)"
    assert specs["Changes waiting for their event (backlog)"]["yaxis"].get("range") is None
    assert specs["Matched pairs by delay bucket, by commit clock (log scale)"]["yaxis"]["type"] == "log"
    assert [s["y0"] for s in specs["CDC position gap over time (bytes of binlog)"]["shapes"]] == [5000.0]


def test_drift_draws_both_tests_of_f12_and_says_when_nothing_waits(env: Path, scenario_store: StoreTarget) -> None:
    """Issue 43, seen 8: the spread chart drew only F12's absolute threshold (3), so a group far above it that raised
    nothing looked wrong; F12's second test (0.5 of the mean lag) is drawn too, per group and topic. With nothing
    waiting for its event, the backlog chart was an empty -1..1 axis: the page says so instead."""
    store = Store(scenario_store)
    with store.batch() as tx:
        tx.set_state("engine_stats", {**views.engine_stats(store), "backlog_by_table": {"shop.orders": 0,
                                                                                         "shop.shipments": 0}})
    store.close()
    at = run("drift")
    specs = {json.loads(c.proto.spec)["layout"]["title"]["text"]: json.loads(c.proto.spec)
             for c in at.get("plotly_chart")}
    spread = specs["Partition lag spread over time, stddev (records)"]
    assert [s["y0"] for s in spread["layout"]["shapes"]] == [3.0]
    (second,) = [t for t in spread["data"] if t["name"].startswith("0.5 × mean lag")]
    assert second["name"] == "0.5 × mean lag: shipping-service on shop.events"
    assert values(second["y"])[:3] == [3.0, 3.25, 3.5] and second["line"]["dash"] == "dot"  # half the mean 6, 6.5, 7
    captions = [c.value for c in at.caption]
    assert ("F12 fires when a group's spread on a topic stays above both lines for `rules.partition_skew_seconds`: "
            "the threshold 3 records (dashed) and 0.5 × its mean partition lag (dotted).") in captions
    assert "Changes waiting for their event (backlog)" not in specs
    assert "No change is waiting for its event (2 announced tables, 0 each)." in captions


# ---------------------------------------------------------------- Reports

@SQLITE_ONLY
def test_reports_offer_the_three_exports(env: Path) -> None:
    at = run("reports")
    assert metrics(at) == {"Findings in this report": "7"}
    assert [b.label for b in at.get("download_button")] == ["Download CSV", "Download JSON", "Download XLSX"]
    at.selectbox[0].set_value("F1").run()
    assert metrics(at) == {"Findings in this report": "1"}


def test_report_bytes_are_the_verifiable_export(env: Path) -> None:
    cfg = views.config()
    for fmt in reports.FORMATS:
        data = reports.report(cfg, fmt, rule="F1")
        assert report_check.verify(data, fmt), (fmt, report_check.check(data, fmt))
    assert b"# findings: 1" in reports.report(cfg, "csv", rule="F1")


@SQLITE_ONLY
def test_reports_make_and_list_attestations(env: Path) -> None:
    """Issue 45, item 5: with [attest] the page makes an attestation, lists it, and says when one was changed."""
    at = run("reports")
    assert "Give the config an [attest] table" in at.info[-1].value
    assert cli.main(["attest-key", "--out", str(env.parent / "keys")]) == cli.EXIT_OK
    env.write_text(env.read_text() + '\n[attest]\nkey_file = "keys/attest.key"\ndirectory = "attestations"\n')
    at = run("reports")
    assert at.info[-1].value == "No attestation yet."
    today = dt.datetime.now(dt.timezone.utc).date()
    at.date_input(key="attest_since").set_value(today - dt.timedelta(days=1))
    at.date_input(key="attest_until").set_value(today).run()
    next(b for b in at.button if b.label == "Make attestation").click().run()
    assert not at.exception, at.exception
    [path] = (env.parent / "attestations").glob("*.json")
    assert at.success[0].value == f"Made {path.name} (sequence 1) and its XLSX."
    table = at.dataframe[0].value
    assert list(table["file"]) == [path.name] and list(table["verifies"]) == ["yes"]
    assert list(table["findings"]) == [7] and list(table["verified"]) == [4]  # the scenario's T1002-T1005
    assert [b.label for b in at.get("download_button")][-3:] == ["Download JSON", "Download XLSX",
                                                                 "Download public key"]
    # the next one continues the chain where it ends; a changed file is said changed
    at.run()
    assert at.text_input[0].label == "From (UTC): where the chain ends"
    assert at.text_input[0].value == json.loads(path.read_bytes())["until"]
    at.date_input(key="attest_until").set_value(today + dt.timedelta(days=1)).run()
    next(b for b in at.button if b.label == "Make attestation").click().run()
    path.write_bytes(path.read_bytes().replace(b'"sequence": 1', b'"sequence": 2'))
    at = run("reports")
    table = at.dataframe[0].value
    assert list(table["sequence"]) == [2, 2] and table["verifies"][0] == "yes"
    assert table["verifies"][1].startswith(f"NO: not the attestation {table['file'][0]} chains to: its SHA-256 is not "
                                           f"the one recorded in {table['file'][0]}")
    assert "field sequence: changed" in table["verifies"][1]


def test_reports_need_the_config(env: Path, scenario_store: StoreTarget, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(views.ENV_CONFIG)
    name_store(monkeypatch, scenario_store)
    at = run("reports")
    assert "ONCEWATCH_CONFIG" in at.info[0].value and not at.get("download_button")


# ---------------------------------------------------------------- login

@SQLITE_ONLY
def test_password_guards_every_page(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(auth.PASSWORD_ENV, "s3cret-pass")
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert not at.metric and at.title[0].value == "oncewatch"
    at.text_input[0].input("wrong")
    at.button[0].click().run()
    assert at.error[0].value == "Wrong password." and not at.metric
    at.text_input[0].input("s3cret-pass")
    at.button[0].click().run()
    assert "Open critical findings" in metrics(at)
    at.switch_page(PAGES.format("drift")).run()
    assert "Max partition lag" in metrics(at)


def test_password_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("from-file\n")
    assert auth.configured_password({auth.PASSWORD_FILE_ENV: str(tmp_path / "pw")}) == "from-file"
    with pytest.raises(auth.AuthConfigError, match="cannot read it"):
        auth.configured_password({auth.PASSWORD_FILE_ENV: str(tmp_path / "absent")})


def oidc_app(logged_in: bool) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=30)
    at.secrets["auth"] = {"redirect_uri": "http://localhost:8501/oauth2callback", "cookie_secret": "x" * 32,
                          "client_id": "oncewatch", "client_secret": "y",
                          "server_metadata_url": "https://idp.example/.well-known/openid-configuration"}
    # AppTest's secrets do not reach st.user's own check for [auth]: say the login state outright.
    at.user = {"is_logged_in": logged_in, "email": "sre@example.com"}
    return at.run()


@SQLITE_ONLY
def test_oidc_login_when_auth_is_in_secrets(env: Path) -> None:
    at = oidc_app(logged_in=False)
    assert not at.exception and not at.metric
    assert at.button[0].label == "Log in"
    at = oidc_app(logged_in=True)
    assert "Open critical findings" in metrics(at)
    assert at.sidebar.button[0].label == "Log out"


@SQLITE_ONLY
def test_no_login_and_not_on_loopback_shows_nothing(env: Path) -> None:
    set_address("0.0.0.0")
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert not at.metric
    assert "No login is configured and the server listens on 0.0.0.0" in at.error[0].value


def test_findings_acknowledged_and_closed_from_the_page(env: Path, scenario_store: StoreTarget) -> None:
    at = run("findings")
    form = next(e for e in at.expander if e.label == "Acknowledge or close")
    ids = form.multiselect[0]
    assert ids.value == ["f9-o507"] and "f1-t1001" in ids.options  # the selected row (the newest) by default
    ids.set_value(["f1-t1001"]).run()
    form = next(e for e in at.expander if e.label == "Acknowledge or close")
    apply = next(b for b in form.button if b.label == "Apply")
    assert apply.disabled  # no note yet
    form.text_input[1].set_value("second shipment stopped").run()
    form = next(e for e in at.expander if e.label == "Acknowledge or close")
    next(b for b in form.button if b.label == "Apply").click().run()
    assert not at.exception and at.success[0].value == "Acknowledged 1 finding(s)."
    store = Store(scenario_store, readonly=True)
    try:
        assert store.findings_by_id(["f1-t1001"])[0].status == "acknowledged"
        (entry,) = reviews.history(store, ["f1-t1001"])["f1-t1001"]
        assert (entry.status, entry.by, entry.note) == ("acknowledged", "dashboard", "second shipment stopped")
    finally:
        store.close()
    form = next(e for e in at.expander if e.label == "Acknowledge or close")
    form.multiselect[0].set_value(["f1-t1001"]).run()
    form = next(e for e in at.expander if e.label == "Acknowledge or close")
    form.radio[0].set_value("Close").run()
    form = next(e for e in at.expander if e.label == "Acknowledge or close")
    form.selectbox[0].set_value("duplicate").run()
    form = next(e for e in at.expander if e.label == "Acknowledge or close")
    next(b for b in form.button if b.label == "Apply").click().run()  # a duplicate without --of
    assert errors(at) == ["a duplicate names the finding it duplicates (--of ID), and only a duplicate does"]


# ---------------------------------------------------------------- Incidents

def test_incidents_group_the_findings_of_one_order_and_show_their_history(
        tmp_path: Path, env: Path, scenario_store: StoreTarget, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the example shop's config: the scenario's F1 on trade_no T1001 and an F9 on its order's
    order.paid event (the callback handled more than once) are one incident of order O501."""
    shop = (Path(__file__).resolve().parents[2] / "examples" / "shop.toml").read_text()
    config = tmp_path / "shop.toml"
    config.write_text(shop.replace('path = "../.devstack/oncewatch-shop.db"\n', store_keys(scenario_store)))
    monkeypatch.setenv(views.ENV_CONFIG, str(config))
    store = Store(scenario_store)
    with store.batch() as tx:
        tx.upsert_findings([Finding(id="f9-o501", rule="F9", name="duplicate_event", severity="critical",
                                    keys={"event_type": "order.paid", "key": "O501", "table": "shop.orders"},
                                    summary="order.paid for O501 announced twice with different payloads",
                                    first_seen=2e9, last_seen=2e9 + 1, evidence=())])
    reviews.acknowledge(store, ["f1-t1001"], by="ana", note="stopping the second shipment", until=2e9 + 3600,
                        now=2e9 + 2)
    store.close()
    at = run("incidents")
    table = at.dataframe[0].value
    assert table.iloc[0]["incident"] == "order O501"
    assert (table.iloc[0]["rules"], table.iloc[0]["findings"], table.iloc[0]["status"]) == ("F1 + F9", 2, "open")
    assert "trade_no T1001" not in set(table["incident"])
    assert at.subheader[0].value == "order O501: F1 + F9, open"
    assert at.caption[0].value.startswith("5 incidents from 6 findings; 1 joins several findings of one order, "
                                          "trade_no or group, the others hold one finding each.")
    history = at.dataframe[1].value  # the acknowledged F1's changes
    assert history.to_dict("records") == [{"at": "2033-05-18 03:33:22.000Z", "status": "acknowledged", "by": "ana",
                                           "reason": "", "note": "stopping the second shipment"}]


@SQLITE_ONLY
def test_incidents_without_the_payments_table_keep_a_trade_no_apart(env: Path) -> None:
    at = run("incidents")
    table = at.dataframe[0].value
    assert "trade_no T1001" in set(table["incident"]) and len(table) == 5
    assert "the config has no [domain.payments]" in at.caption[0].value


# ---------------------------------------------------------------- Quarantine

def test_quarantine_lists_the_stores_records_with_their_coordinates(env: Path) -> None:
    at = run("quarantine")
    counts, records = at.dataframe[0].value, at.dataframe[1].value
    assert counts.to_dict("records") == [{"topic": "shop.events", "reason": "not_json", "records": 3},
                                         {"topic": "shop.events", "reason": "too_large", "records": 1}]
    assert list(records["coordinates"]) == ["shop.events/0@7", "shop.events/0@8", "shop.events/0@9",
                                            "shop.events/1@9"]
    assert at.caption[0].value.startswith("0 binlog rows events and 4 Kafka records kept aside")
    assert at.caption[1].value.startswith("4 records kept aside")


@SQLITE_ONLY
def test_quarantine_speaks_of_both_streams(env: Path, scenario_store: StoreTarget) -> None:
    """Issue 43, seen 9: with nothing quarantined the page said "No Kafka record has been quarantined" and nothing
    of the binlog, which has its quarantine too; a binlog rows event kept aside is listed with its coordinates."""
    store = Store(scenario_store)
    store.conn.execute("DELETE FROM quarantine")
    store.close()
    at = run("quarantine")
    assert [s.value for s in at.success][-2:] == [
        "No binlog rows event has been quarantined: every rows event of the watched tables was decoded.",
        "No Kafka record has been quarantined: every record read was parsed."]
    store = Store(scenario_store)
    with store.batch() as tx:
        tx.add_binlog_quarantined([QuarantinedRows("0-1-77", "mysql-bin.000003", 4242, "shop.orders",
                                                   "undecodable", "'utf-8' codec can't decode byte 0xff")])
    store.close()
    at = run("quarantine")
    assert at.caption[0].value.startswith("1 binlog rows event and 0 Kafka records kept aside")
    assert at.dataframe[0].value.to_dict("records")[0]["event_pos"] == 4242
    assert [s.value for s in at.success][-1] == "No Kafka record has been quarantined: every record read was parsed."
