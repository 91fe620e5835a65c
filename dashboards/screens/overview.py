"""Overview: how much money was verified exactly once (issue 45), is every collector up or behind, what is open,
how far Kafka trails the binlog.

The live panel is a fragment that reruns every REFRESH_SECONDS without reloading the page.
"""

from __future__ import annotations

import time

import pandas as pd
import plotly.express as px
import streamlit as st

from oncewatch.core import names
from oncewatch.core.protocol import NO_OFFSETS, BinlogStatus, ComponentHealth, KafkaEventsStatus, MonitorHealth
from oncewatch.core.records import OffsetsSnapshot
from oncewatch.dashboards import ui, views
from oncewatch.core.config import SloConfig
from oncewatch.store import queries, verdicts
from oncewatch.store.group import shard_checkpoints

# The seed's three signals get their threshold line; the backlog's (F11's 5000) would flatten the few changes
# that wait at any time into the axis (its drill-down, once it is an F11, draws it).
THRESHOLD_LINES = ("group_lag", "delay_p99", "lag_stddev")


def collector_tile(c: views.Component | None, title: str) -> tuple[str, str, str | None]:
    """(label, value, help) of one collector tile: the figure's words in the label, so that the value stays
    short enough for a quarter of a 1280 px page."""
    if c is None:
        return f"{title} — not reported", "–", "The monitor has not reported this collector (not configured?)."
    status = c.health.status if isinstance(c.health, ComponentHealth) else None
    state = "stale" if c.stale else "up" if c.up else "DOWN"
    if not c.up:
        if isinstance(status, OffsetsSnapshot):
            since, error = None, status.error
        else:
            since, error = (status.disconnected_since, status.last_error) if status is not None else (None, None)
        return (f"{title} — {state} since" if since else f"{title} — {state}", ui.when(since)[11:19] if since else "–",
                error)
    what = ""
    if isinstance(status, BinlogStatus):
        label, figure = "behind", ui.duration(status.seconds_behind)
    elif isinstance(status, KafkaEventsStatus):
        label, figure = "unread", f"{status.unread():,}"
    else:
        label, figure = "max lag", f"{views.max_lag(status if isinstance(status, OffsetsSnapshot) else NO_OFFSETS):,}"
        what = " The largest lag of one partition, any group (F11 compares a group's total)."
    return f"{title} — {state}, {label}", figure, f"Reported {ui.duration(c.age_seconds)} ago.{what}"


def verdict_of(monitor: MonitorHealth | None) -> str:
    """healthy, degraded or failing (the reasons are in the tile's help)."""
    return monitor.verdict or "–" if monitor is not None else "–"


def verdict_help(monitor: MonitorHealth | None) -> str | None:
    if monitor is None:
        return None
    reasons = list(monitor.reasons) or ["nothing wrong"]
    if blind := views.cannot_judge(monitor):
        reasons = [*reasons, blind]
    lags = ", ".join(f"{s} {ui.duration(v)} behind" for s, v in sorted(monitor.lag_seconds.items()))
    return f"{'; '.join(reasons)}. {lags}. Started {ui.when(monitor.started_at)}."


def timeline(marks: list[dict], window_seconds: float) -> None:
    """Findings by first sight over the window, one lane per rule, coloured by severity."""
    if not marks:
        st.caption(f"Findings timeline: none first seen in the last {ui.duration(window_seconds)}")
        return
    frame = pd.DataFrame(marks)
    frame["at"] = pd.to_datetime(frame["first_seen"], unit="s", utc=True)
    order = sorted(frame["rule"].unique(), key=lambda r: (len(r), r))
    fig = px.scatter(frame, x="at", y="rule", color="severity", color_discrete_map=ui.SEVERITY_COLORS,
                     hover_data=["status", "summary"], category_orders={"rule": order}, height=300,
                     title=f"Findings timeline ({len(frame):,} first seen in the window)")
    fig.update_layout(margin={"l": 10, "r": 10, "t": 40, "b": 10}, xaxis_title=ui.UTC_AXIS, yaxis_title=None,
                      legend_title=None)
    st.plotly_chart(fig, key="chart-timeline", config={"displayModeBar": False})


def group(members: list[dict], shards: list[dict]) -> None:
    """Several instances judging as one ([group]): every member's share and every shard's last commit."""
    st.subheader("Group")
    gone = [m["member"] for m in members if m["state"] == "gone"]
    unjudged = [s["shard"] for s in shards if s["committed_seconds_ago"] > views.STALE_SECONDS]
    if unjudged:
        st.error(f"Shard(s) {', '.join(map(str, unjudged))} not committed for over {views.STALE_SECONDS:.0f} s: "
                 "no member judges them (OncewatchGroupShardNotJudged).")
    st.caption(f"{len(members) - len(gone)} member(s) live" + (f"; gone: {', '.join(gone)}" if gone else ""))
    cols = st.columns(2)
    cols[0].dataframe(pd.DataFrame(members).drop(columns=views.SHARD_LIST), hide_index=True, key="group-members")
    cols[1].dataframe(pd.DataFrame(shards), hide_index=True, key="group-shards")


@ui.live
def live(window_seconds: float, slo: SloConfig) -> None:
    now = time.time()
    with ui.store() as store:
        share = verdicts.share(store, now - slo.window_hours * 3600, slo.within_seconds)
        comps = views.components(store, now)
        stats = views.engine_stats(store)
        counts = store.finding_counts()
        p99 = queries.latest(store, "delay_p99")
        points = {name: queries.series(store, name, now - window_seconds) for name in ui.CHARTS}
        marks = queries.finding_marks(store, now - window_seconds)
        shards = shard_checkpoints(store)
    members, shard_rows = views.group_members(comps), views.group_shards(shards, now)
    verdict = views.group_verdict(members, shard_rows) if members or shards else None
    ui.verdicts(comps, verdict, counts)
    if verdict is not None:
        group(members, shard_rows)

    value, help_ = views.exactly_once(*share, slo)
    st.metric("Verified exactly once", value, help=help_, border=True)
    monitor = comps.get(names.MONITOR)
    # Three collector tiles to a row (their labels carry the figure's words), four short ones below.
    for col, (name, title) in zip(st.columns(3), ((names.BINLOG, "Binlog"), (names.KAFKA_EVENTS, "Kafka events"),
                                                  (names.KAFKA_OFFSETS, "Kafka offsets"))):
        label, value, help_ = collector_tile(comps.get(name), title)
        col.metric(label, value, help=help_, border=True)

    cols = st.columns(4)
    if monitor is None and verdict is not None:
        cols[0].metric("Group", verdict.verdict, help="; ".join(verdict.reasons) or "nothing wrong", border=True)
    else:
        health = views.monitor_of(comps)
        cols[0].metric("Monitor — stale" if monitor and monitor.stale else "Monitor", verdict_of(health),
                       help=verdict_help(health), border=True)
    acknowledged = sum(n for _, severity, status, n in counts if severity == "critical" and status == names.ACKNOWLEDGED)
    cols[1].metric("Open critical findings", f"{views.open_critical(counts):,}", border=True,
                   help=f"Open and not acknowledged; {acknowledged:,} more acknowledged (a person has them)")
    cols[2].metric("Backlog", f"{views.backlog_total(stats):,}", help="Committed changes still within their grace, "
                   "waiting for their Kafka event, all tables (those past it are F7 findings)", border=True)
    cols[3].metric("p99 event delay", ui.duration(p99), help="Kafka time minus commit time, of the changes and "
                   "events matched in the last minute", border=True)

    charts = list(ui.CHARTS)
    for row in (charts[:2], charts[2:]):
        for col, name in zip(st.columns(2), row):
            with col:
                ui.signal_chart(comps, name, points[name], window_seconds, line=name in THRESHOLD_LINES)
    timeline(marks, window_seconds)
    st.caption(f"Refreshed {ui.when(now)} every {ui.duration(ui.REFRESH_SECONDS)}; times in UTC.")


st.title("Overview")
config = views.config()
live(ui.window(), config.slo if config is not None else SloConfig())
