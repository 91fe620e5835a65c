"""Overview: is every collector up or behind, what is open, how far Kafka trails the binlog.

The live panel is a fragment that reruns every REFRESH_SECONDS without reloading the page.
"""

from __future__ import annotations

import time

import pandas as pd
import plotly.express as px
import streamlit as st

from oncewatch.core import names
from oncewatch.core.records import OffsetsSnapshot
from oncewatch.dashboards import ui, views
from oncewatch.store import queries

CHARTS = (("backlog", "Backlog (changes waiting for their event)", "table"),
          ("delay_p99", "p99 event delay (s)", None),
          ("group_lag", "Consumer-group lag (records)", "group"))


def collector_tile(c: views.Component | None, title: str) -> tuple[str, str, str | None]:
    """(label, value, help) of one collector tile."""
    if c is None:
        return f"{title} — not reported", "–", "The monitor has not reported this collector (not configured?)."
    v = c.value
    state = "stale" if c.stale else "up" if c.up else "DOWN"
    if not c.up:
        since = v.get("disconnected_since")
        return (f"{title} — {state}", f"down since {ui.when(since)[11:19]}" if since else "down",
                v.get("last_error") or v.get("error"))
    if c.name == names.BINLOG:
        figure = f"{ui.duration(v.get('seconds_behind'))} behind"
    elif c.name == names.KAFKA_EVENTS:
        figure = f"{views.unread_records(v):,} unread"
    else:
        figure = f"max lag {views.max_lag(OffsetsSnapshot.from_dict(v)):,}"
    return f"{title} — {state}", figure, f"reported {ui.duration(c.age_seconds)} ago"


def verdict_of(monitor: views.Component | None) -> str:
    """healthy, degraded or failing (the reasons are in the tile's help)."""
    return monitor.value.get("verdict") or "–" if monitor is not None else "–"


def verdict_help(monitor: views.Component | None) -> str | None:
    if monitor is None:
        return None
    reasons = monitor.value.get("reasons") or ["nothing wrong"]
    if monitor.value.get("blind_rules"):
        reasons = [*reasons, f"cannot judge now: {', '.join(monitor.value['blind_rules'])}"]
    lags = ", ".join(f"{s} {ui.duration(v)} behind" for s, v in sorted(monitor.value.get("lag_seconds", {}).items()))
    return f"{'; '.join(reasons)}. {lags}. Started {ui.when(monitor.value.get('started_at'))}."


@st.fragment(run_every=ui.REFRESH_SECONDS)
def live() -> None:
    now = time.time()
    with ui.store() as store:
        comps = views.components(store, now)
        stats = views.engine_stats(store)
        counts = store.finding_counts()
        p99 = queries.latest(store, "delay_p99")
        points = {name: queries.series(store, name, now - ui.CHART_WINDOW_SECONDS) for name, _, _ in CHARTS}
    ui.stale_banner(comps)

    monitor = comps.get(names.MONITOR)
    cols = st.columns(4)
    cols[0].metric("Monitor — stale" if monitor and monitor.stale else "Monitor", verdict_of(monitor),
                   help=verdict_help(monitor), border=True)
    for col, (name, title) in zip(cols[1:], ((names.BINLOG, "Binlog"), (names.KAFKA_EVENTS, "Kafka events"),
                                             (names.KAFKA_OFFSETS, "Kafka offsets"))):
        label, value, help_ = collector_tile(comps.get(name), title)
        col.metric(label, value, help=help_, border=True)

    cols = st.columns(3)
    cols[0].metric("Open critical findings", f"{views.open_critical(counts):,}", border=True)
    cols[1].metric("Backlog", f"{views.backlog_total(stats):,}", help="Committed changes still within their grace, "
                   "waiting for their Kafka event, all tables (those past it are F7 findings)", border=True)
    cols[2].metric("p99 event delay", ui.duration(p99), help="Kafka time minus commit time", border=True)

    for col, (name, title, color) in zip(st.columns(3), CHARTS):
        frame = pd.DataFrame(points[name])
        if frame.empty:
            col.caption(f"{title}: no points in the last hour")
            continue
        frame["at"] = pd.to_datetime(frame["at"], unit="s", utc=True)
        fig = px.line(frame, x="at", y="value", color=color, title=title, height=260)
        fig.update_layout(margin={"l": 10, "r": 10, "t": 40, "b": 10}, xaxis_title=None, yaxis_title=None,
                          legend_title=None)
        col.plotly_chart(fig, key=f"chart-{name}", config={"displayModeBar": False})
    st.caption(f"Refreshed {ui.when(now)} every {ui.duration(ui.REFRESH_SECONDS)}.")


st.title("Overview")
live()
