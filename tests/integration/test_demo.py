"""`make demo` as a new user sees it (issue 14's acceptance): the real demo (both shops, the monitor, the
dashboard) on the dev services, every rule F1-F12 found within its first minutes, then its dashboard in
Debian's Chromium at 1280 px: the verdict, the seed's three signals with their threshold lines, and the
drill-down of one finding of every rule showing its rows and events (a consumer group's: its readings).
Each page's key figures are checked against the store and nothing on it may be cut off; the screenshots
go to artifacts/dashboard/demo-*.png.
"""

from __future__ import annotations

import base64
import json
import re
import sqlite3
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from devservices import base, paging
from oncewatch.core.records import Finding
from oncewatch.dashboards import views
from oncewatch.store import Store, queries

from .demo_run import DemoRun
from .test_dashboard_browser import ARTIFACTS, CUT_OFF, DASHED, DevTools, browser, wait_for  # noqa: F401 - a fixture

RULES = [f"F{i}" for i in range(1, 13)]
EVERY_RULE_WITHIN = 240.0  # seconds from the demo's start: "within its first few minutes"
WIDTH, HEIGHT = 1280, 1800
THRESHOLDS = "[...document.querySelectorAll('.js-plotly-plot .annotation-text')].map(e => e.textContent)"


def first_of_each_rule(store_path: str) -> dict[str, Finding]:
    store = Store(store_path, readonly=True)
    try:
        return {f.rule: f for f in sorted(store.findings(), key=lambda f: f.first_seen, reverse=True)}
    finally:
        store.close()


def wait_for_every_rule(demo: DemoRun) -> dict[str, Finding]:
    """Once every rule has a finding: looked at until EVERY_RULE_WITHIN after the demo's start, and at least
    once (the tests before this one may have taken longer; when each rule was first found is in the store)."""
    found: dict[str, Finding] = {}
    while True:
        assert demo.proc.poll() is None, demo.output()[-3000:]
        try:
            found = first_of_each_rule(str(demo.store))
        except sqlite3.OperationalError:  # the store is made by the monitor's first start
            pass
        if set(found) == set(RULES):
            return found
        if time.time() >= demo.started + EVERY_RULE_WITHIN:
            break
        time.sleep(2)
    pytest.fail(f"after {EVERY_RULE_WITHIN:.0f} s the demo had shown {sorted(found)}, not {RULES}")


@pytest.fixture(scope="module")
def shown(demo: DemoRun) -> dict[str, Finding]:
    """One finding of every rule (each rule's first), once the demo has shown them all."""
    return wait_for_every_rule(demo)


def test_every_rule_shows_within_the_first_minutes(demo: DemoRun, shown: dict[str, Finding]) -> None:
    after = {rule: round(f.first_seen - demo.started) for rule, f in sorted(shown.items(), key=lambda i: i[1].first_seen)}
    print(f"\nfirst finding of each rule, seconds after the demo started: {after}")
    assert max(after.values()) < EVERY_RULE_WITHIN


def figure(text: str, label: str) -> int:
    match = re.search(rf"{re.escape(label)}\s+([\d,]+)", text)
    assert match, f"no {label!r} figure on the page:\n{text}"
    return int(match.group(1).replace(",", ""))


def between(read: Callable[[], int], page: Callable[[], int]) -> tuple[int, int, int]:
    """A live figure on the page against the store read just before and just after it."""
    before = read()
    shown_ = page()
    after = read()
    return min(before, after), shown_, max(before, after)


def shoot(tools: DevTools, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = tools.call("Page.captureScreenshot", format="png")
    (ARTIFACTS / f"{name}.png").write_bytes(base64.b64decode(shot["data"]))
    assert (ARTIFACTS / f"{name}.png").stat().st_size > 10_000


def visit(tools: DevTools, demo: DemoRun, path: str = "") -> None:
    """Open one of the demo's pages; fail at once, with the demo's own account, when its dashboard no longer answers
    (a page that cannot be reached would otherwise be waited for to its timeout)."""
    try:
        with urllib.request.urlopen(f"{demo.url}/_stcore/health", timeout=10) as resp:
            resp.read()
    except OSError as exc:
        log = demo.work / "dashboard.log"
        pytest.fail(f"the demo's dashboard does not answer ({exc}); the demo's output ends:\n{demo.output()[-2000:]}\n"
                    f"its dashboard.log ends:\n{log.read_text(errors='replace')[-2000:] if log.exists() else '(none)'}")
    tools.call("Page.navigate", url=f"{demo.url}{path}")


@pytest.fixture(scope="module")
def narrow(browser: DevTools) -> DevTools:
    browser.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False)
    return browser


def reading(read: Callable[[], Any], want: Any = None, timeout: float = 10.0,
            ok: Callable[[Any], bool] | None = None) -> Any:
    """`read()` once it gives `want` (or a reading `ok` accepts), or its last reading after `timeout`."""
    accept = ok or (lambda got: got == want)
    deadline = time.monotonic() + timeout
    got = read()
    while not accept(got) and time.monotonic() < deadline:
        time.sleep(0.25)
        got = read()
    return got


def test_the_overview_in_chromium(demo: DemoRun, shown: dict[str, Finding], narrow: DevTools) -> None:
    visit(narrow, demo)
    # the first lane's busiest minutes: the Overview of the demo's store once took more than 30 s to draw its charts
    text = wait_for(narrow, ["Monitor ", "Open critical findings", "Findings timeline", "Consumer-group lag"], 5,
                    timeout=60)
    assert re.search(r"Monitor (healthy|degraded|failing)", text), text
    # the seed's three signals, each with its threshold (the demo's F11 at 500 records); a rerun that begins just
    # after wait_for keeps the last run's charts beside the new ones for a moment (6 seen on a loaded machine)
    dashed = reading(lambda: narrow.evaluate(DASHED), 3)
    assert dashed == 3, dashed
    labels = ["threshold 0.5", "threshold 3", "threshold 500"]  # read as the lines were: the rerun may still end
    assert reading(lambda: sorted(narrow.evaluate(THRESHOLDS)), labels) == labels

    def open_critical() -> int:
        store = Store(str(demo.store), readonly=True)
        try:
            return views.open_critical(store.finding_counts())
        finally:
            store.close()

    def tile() -> int:
        return figure(narrow.evaluate("document.body.innerText"), "Open critical findings")

    # The tile is as of its fragment's last rerun (every REFRESH_SECONDS, longer on a loaded machine), and the demo
    # adds criticals in bursts (its F7s at their grace: 6 in one on a fresh clone), so the tile may lag the store by
    # a burst; it shows exactly the store's figure once the burst is drawn (on a fresh clone's loaded first minutes
    # the tile still showed 77 of 80 after 30 s).
    low, page, high = reading(lambda: between(open_critical, tile), ok=lambda got: got[0] <= got[1] <= got[2],
                              timeout=60)
    assert low <= page <= high, (low, page, high)
    assert page > 0
    assert narrow.evaluate(CUT_OFF) == []
    shoot(narrow, "demo-overview")


@pytest.mark.parametrize("rule", RULES)
def test_the_drilldown_of_each_rule_in_chromium(demo: DemoRun, shown: dict[str, Finding], narrow: DevTools,
                                                rule: str) -> None:
    finding = shown[rule]
    entity = views.entity_of(finding.keys)
    assert entity, (rule, finding.keys)
    visit(narrow, demo, f"/drilldown?q={urllib.parse.quote(entity)}")
    store = Store(str(demo.store), readonly=True)
    try:
        if queries.reading_of(entity):
            text = wait_for(narrow, ["Readings", f"{rule} {finding.name}", "Consumer-group lag"], 2)
            assert figure(text, "Readings") > 0
            # the group's lag and spread, each with its threshold, read as the Overview's are: a rerun just begun
            # keeps the last run's charts beside the new ones for a moment (4 seen on a loaded fresh clone)
            dashed = reading(lambda: narrow.evaluate(DASHED), 2)
            assert dashed == 2, dashed
            assert entity.partition(":")[2] in text  # its lag per partition, as last polled
        else:
            text = wait_for(narrow, ["Row changes", "Kafka events", f"{rule} {finding.name}"], 1)
            found = queries.timeline(store, entity)
            rows, events = figure(text, "Row changes"), figure(text, "Kafka events")
            again = queries.timeline(store, entity)
            assert len(found.rows) <= rows <= len(again.rows) and len(found.events) <= events <= len(again.events)
            # an orphan event (F8) has no row; a stuck order (F3) and a lost event (F7) no event
            assert (rows > 0 or rule == "F8") and (events > 0 or rule in ("F3", "F7")), (rule, entity, text)
    finally:
        store.close()
    assert narrow.evaluate(CUT_OFF) == []
    shoot(narrow, f"demo-{rule}")


# The other pages, each with text it shows once rendered over the demo's store.
OTHER_PAGES = {"findings": "findings match", "incidents": "incidents from", "drift": "Consumer-group lag",
               "quarantine": "Kafka record", "reports": "No attestation yet"}  # the demo's [attest]: none made yet


@pytest.mark.parametrize("page", list(OTHER_PAGES))
def test_the_other_pages_at_1280_px_cut_nothing_off(demo: DemoRun, shown: dict[str, Finding], narrow: DevTools,
                                                    page: str) -> None:
    visit(narrow, demo, f"/{page}")
    text = wait_for(narrow, [page.capitalize(), "Monitor ", OTHER_PAGES[page]], 0)
    assert "Traceback" not in text
    assert narrow.evaluate(CUT_OFF) == []
    shoot(narrow, f"demo-{page}")


PAGE = re.compile(r"^demo: page FIRING +OncewatchDuplicateEffect F1: \d+ firing: (\S+?)[,;\n ]", re.M)


def test_the_demo_pages_through_prometheus_and_alertmanager(demo: DemoRun, shown: dict[str, Finding]) -> None:
    """Issue 43: the demo's /metrics is a target of the stack's Prometheus, and Alertmanager delivers to the
    receiver the demo runs, which prints a line per notification naming the findings."""
    with urllib.request.urlopen(f"http://{base.HOST}:{paging.PROMETHEUS_PORT}/api/v1/targets", timeout=5) as resp:
        targets = json.load(resp)["data"]["activeTargets"]
    assert {"instance": f"127.0.0.1:{demo.metrics_port}", "job": paging.DEMO_JOB} in [t["labels"] for t in targets]
    deadline = time.monotonic() + 60
    while not PAGE.search(demo.output()) and time.monotonic() < deadline:
        time.sleep(1)
    page = PAGE.search(demo.output())
    assert page, demo.output()[-3000:]
    store = Store(str(demo.store), readonly=True)
    try:
        paid_twice = {f.keys["trade_no"] for f in store.findings(rule="F1")}
    finally:
        store.close()
    assert page[1] in paid_twice
