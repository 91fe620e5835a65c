"""The dashboard in a real browser: served headless on a free port against the known scenario
store, each page loaded by Debian's Chromium (driven over the DevTools protocol), waited for until
its key figures are on screen, and saved as a PNG in artifacts/."""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from websockets.sync.client import ClientConnection, connect

from devservices import scenario
from devservices.shop_monitor import free_port
from oncewatch.dashboards import auth, launch
from oncewatch.store import Store

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "dashboard"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--hide-scrollbars", "--mute-audio")
WIDTH, HEIGHT = 1400, 2200

# Per page: its URL path, and text that must be on screen once it has rendered (the key figures).
PAGES = {
    "overview": ("", ["Monitor degraded", "kafka read 7.0 s behind", "Binlog — up, behind", "2.5 s",
                      "Kafka events — up, unread", "Kafka offsets — up, max lag", "Open critical findings", "3",
                      "Backlog", "9", "475 ms",
                      "No login configured: the dashboard is bound to 127.0.0.1 only."]),
    "findings": ("findings", ["7 findings match", "Drill-down for key:shop.orders:O507"]),
    "drilldown": ("drilldown?q=T1001", ["Row changes", "Kafka events", "F1 duplicate_effect · critical · open",
                                        "2 shop.shipments rows for trade_no T1001 (S1, S2)"]),
    "drift": ("drift", ["Max partition lag", "22", "Worst lag stddev", "6.00", "Unread by the monitor",
                        "p99 delay since start", "475 ms", "CDC pipeline against the binlog", "Position gap",
                        "1,800 B"]),
    "reports": ("reports", ["Findings in this report", "7", "Download CSV", "Download JSON", "Download XLSX"]),
}
# Number of plotly charts each page must have drawn before its screenshot.
CHARTS = {"overview": 5, "drilldown": 1, "drift": 6}
# Dashed threshold lines each page must have drawn: the seed's three signals on the Overview, the spread and the
# CDC position gap on Drift.
THRESHOLDS = {"overview": 3, "drift": 2}
DASHED = ("[...document.querySelectorAll('.js-plotly-plot .shapelayer path')]"
          ".filter(p => p.style.strokeDasharray && p.style.strokeDasharray !== 'none').length")
# Text cut off by its box: a tile's label or value, a caption, an expander's title, a button, a widget's label,
# or an empty date input's placeholder ("yyyy/mm/dd" cut to "yyyy/"): what a reader would miss.
CUT_OFF = """(() => {
  const ctx = document.createElement('canvas').getContext('2d');
  const placeholderCut = e => {
    if (!e.placeholder || e.value) return false;
    const style = getComputedStyle(e);
    ctx.font = style.font;
    return ctx.measureText(e.placeholder).width + parseFloat(style.paddingLeft) + parseFloat(style.paddingRight)
      > e.clientWidth + 1;
  };
  return [...document.querySelectorAll('[data-testid=stMetricValue] *, [data-testid=stMetricLabel] *, '
    + '[data-testid=stCaptionContainer], [data-testid=stExpander] summary *, button *, label *, '
    + '[data-testid=stDateInput] input')]
    .filter(e => (e.innerText && e.scrollWidth > e.clientWidth + 1) || placeholderCut(e))
    .map(e => e.innerText || e.placeholder);
})()"""


@pytest.fixture(scope="module", autouse=True)
def dev_services() -> None:
    """Overrides the package's check for MariaDB and Kafka: the dashboard reads only its store."""


class DevTools:
    """The few DevTools protocol calls the test needs, on one page target."""

    def __init__(self, ws: ClientConnection):
        self.ws = ws
        self.ids = itertools.count(1)

    def call(self, method: str, **params: object) -> dict:
        msg_id = next(self.ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:  # events arrive in between; only our answer matters
            msg = json.loads(self.ws.recv(timeout=30))
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def evaluate(self, expression: str) -> object:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")


class Served(NamedTuple):
    url: str
    store: Path


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    work = tmp_path_factory.mktemp("dashboard")
    store = work / "scenario.db"
    scenario.seed(str(store)).close()
    config = work / "oncewatch.toml"
    config.write_text(f'[mysql]\nuser = "oncewatch"\ntables = ["shop.orders"]\n\n[store]\npath = "{store}"\n')
    proc, port = started(config, work / "streamlit.log")
    try:
        yield Served(launch.url(port=port), store)
    finally:
        launch.stop(proc)


def health_written_now(store_path: Path) -> None:
    """The scenario's health rows written again, as a running monitor writes its own every second: the pages call a
    row older than 30 s stale (a monitor that stopped writing), and a slow machine reaches that before the last page
    is loaded (a fresh clone's three lanes of tests did, with the rows' texts missing from the Overview), or before
    the first has rendered (a fresh clone on a slower machine: 120 s)."""
    store = Store(str(store_path))
    try:
        for name, row in store.health().items():
            store.set_health(name, row.health)
    finally:
        store.close()


def started(config: Path, log: Path, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, int]:
    """The dashboard answering on a free port. A port free when picked may be taken before Streamlit binds it (a
    monitor's /metrics in a lane beside this one once was): then another port, three tries in all."""
    def one() -> tuple[subprocess.Popen, int]:
        port = free_port()
        proc = launch.launch(config=str(config), port=port, env=env, log=log)
        try:
            launch.wait_ready(proc, launch.url(port=port))
        except launch.LaunchError:
            launch.stop(proc)
            raise
        return proc, port

    for _ in range(2):
        with contextlib.suppress(launch.LaunchError):
            return one()
    return one()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevTools]:
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is missing: apt-get install -y chromium (make services installs it)",
                    pytrace=False)
    profile = tmp_path_factory.mktemp("chromium-profile")
    proc = subprocess.Popen([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
                             f"--window-size={WIDTH},{HEIGHT}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            assert proc.poll() is None and time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
            targets = json.load(resp)
        page = next(t for t in targets if t["type"] == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=None) as ws:
            tools = DevTools(ws)
            tools.call("Page.enable")
            tools.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1,
                       mobile=False)
            yield tools
    finally:
        proc.terminate()
        proc.wait(10)


# The page's text, its Plotly charts drawn, and whether a script run is under way (its status icon, or a skeleton).
SNAPSHOT = ("[document.body.innerText, document.querySelectorAll('.js-plotly-plot .main-svg').length, "
            "!!document.querySelector('[data-testid=\"stStatusWidgetRunningIcon\"], [data-testid=\"stSkeleton\"]')]")


def wait_for(tools: DevTools, expected: list[str], charts: int, timeout: float = 30.0,
             store: Path | None = None) -> str:
    """The page's visible text once every expected string is in it and the charts are drawn. `store`: its health
    rows written again every second meanwhile, as the running monitor the scenario stands for writes its own (a page
    that takes longer than 30 s to render on a busy machine would otherwise show them stale)."""
    deadline = time.monotonic() + timeout
    text, written = "", 0.0
    while time.monotonic() < deadline:
        if store is not None and time.monotonic() - written >= 1.0:
            health_written_now(store)
            written = time.monotonic()
        # one snapshot of the page: read in three round trips, a rerun that began between them (every few seconds on
        # a loaded machine, a live page's fragment reruns back to back) mixed two states of it
        text, drawn, running = tools.evaluate(SNAPSHOT) or ("", 0, True)
        if all(e in text for e in expected) and drawn >= charts and not running:
            return text
        time.sleep(0.25)
    missing = [e for e in expected if e not in text]
    raise AssertionError(f"not on the page after {timeout:.0f} s: {missing}; charts drawn: {drawn}/{charts}\n{text}")


@pytest.fixture(scope="module")
def warm(dashboard: Served, browser: DevTools) -> Served:
    """The dashboard once its first page has rendered: a new server's first run imports pandas, plotly and the
    store (5 s here alone), which no page after it pays again. Given 120 s; the pages are then held to their 30 s."""
    browser.call("Page.navigate", url=dashboard.url)
    wait_for(browser, PAGES["overview"][1], CHARTS.get("overview", 0), timeout=120.0, store=dashboard.store)
    return dashboard


@pytest.mark.parametrize("name", list(PAGES))
def test_page_renders_its_key_figures(warm: Served, browser: DevTools, name: str) -> None:
    path, expected = PAGES[name]
    browser.call("Page.navigate", url=f"{warm.url}/{path}")
    text = wait_for(browser, expected, CHARTS.get(name, 0), store=warm.store)
    assert "Traceback" not in text and "Error" not in text.split("\n")[0]
    assert browser.evaluate(DASHED) == THRESHOLDS.get(name, 0)
    assert browser.evaluate(CUT_OFF) == []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = browser.call("Page.captureScreenshot", format="png")
    (ARTIFACTS / f"{name}.png").write_bytes(base64.b64decode(shot["data"]))
    assert (ARTIFACTS / f"{name}.png").stat().st_size > 10_000


def test_a_page_opened_first_by_its_url_still_asks_for_the_login(tmp_path: Path, browser: DevTools) -> None:
    """A fresh server whose first visitor goes straight to /findings: the login guard and the
    dashboard's own navigation run, never a page script on its own (Streamlit serves every file of a
    pages/ folder beside its main script by itself, which the packaged layout must not have)."""
    store = tmp_path / "scenario.db"
    scenario.seed(str(store)).close()
    config = tmp_path / "oncewatch.toml"
    config.write_text(f'[mysql]\nuser = "oncewatch"\ntables = ["shop.orders"]\n\n[store]\npath = "{store}"\n')
    proc, port = started(config, tmp_path / "streamlit.log", env={auth.PASSWORD_ENV: "s3cret-for-the-test"})
    try:
        browser.call("Page.navigate", url=f"{launch.url(port=port)}/findings")
        text = wait_for(browser, ["Password", "Log in"], 0)
        assert "findings match" not in text and "Drill-down" not in text
    finally:
        launch.stop(proc)
