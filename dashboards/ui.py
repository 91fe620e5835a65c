"""Streamlit helpers the pages share: the read-only store of this run, time formats, the stale banner."""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from typing import Any

import pandas as pd
import plotly.express as px
import streamlit as st

from oncewatch.core import names
from oncewatch.core.config import Config, ConfigError
from oncewatch.core.domain import Rules
from oncewatch.core.exact_json import plain
from oncewatch.dashboards import auth, views
from oncewatch.store import Store, StoreError, open_writer, reviews

# How often every page's live part reruns; st.fragment(run_every=...) takes seconds.
REFRESH_SECONDS = float(os.environ.get("ONCEWATCH_REFRESH_SECONDS", "5"))
# The charts' window, picked in the sidebar; every page's charts share it.
WINDOWS = {"15 min": 900.0, "1 h": 3600.0, "6 h": 21600.0, "24 h": 86400.0}
DEFAULT_WINDOW = "1 h"
SEVERITY_COLORS = {"critical": "#c62828", "warning": "#ef6c00", "info": "#1565c0"}
THRESHOLD_COLOR = "#c62828"
UTC_AXIS = "time (UTC)"
VERDICT_BOXES = {"healthy": st.success, "degraded": st.warning, "failing": st.error}

# series -> (title, colour by, the threshold drawn: rule and name in the monitor's thresholds). The seed's
# three signals: consumer-group backlog against 5000 (F11), event delay against 500 ms (F10), partition
# lag spread against 3.0 (F12); and the changes waiting for their event, which F11 judges too.
CHARTS = {"group_lag": ("Consumer-group lag (records)", "group", ("F11", "offset_drift_threshold")),
          "delay_p99": ("p99 event delay over the last minute (s)", None, ("F10", "event_delay_seconds")),
          "lag_stddev": ("Partition lag spread, stddev (records)", "group", ("F12", "partition_skew_threshold")),
          "backlog": ("Changes waiting for their event", "table", ("F11", "offset_drift_threshold"))}

live = st.fragment(run_every=REFRESH_SECONDS)  # a page's part that reruns by itself, without reloading the page


@contextmanager
def store() -> Iterator[Store]:
    """The store opened read-only for this run (closed after it); a missing store stops the page
    with what to do instead of a traceback."""
    try:
        opened = views.open_store()
    except (views.StoreNotConfigured, StoreError, ConfigError) as exc:
        st.error(f"The oncewatch store cannot be read: {exc}. Start the monitor (`oncewatch run --config ...`) "
                 f"and point the dashboard at its store with {views.ENV_CONFIG} or {views.ENV_STORE}.")
        st.stop()
    try:
        yield opened
    finally:
        opened.close()


def config() -> Config | None:
    """The config ONCEWATCH_CONFIG names, if any; one that cannot be used stops the page saying why."""
    try:
        return views.config()
    except ConfigError as exc:
        st.error(f"The config in {views.ENV_CONFIG} cannot be used: {exc}")
        st.stop()


def when(t: float | None) -> str:
    """Epoch seconds as UTC with milliseconds, the precision the evidence has."""
    if t is None:
        return "–"
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def day_start(day: dt.date | None, plus_days: int = 0) -> dt.datetime | None:
    """Midnight UTC of a picked date (plus some days: an "until" date includes its whole day)."""
    if day is None:
        return None
    return dt.datetime.combine(day + dt.timedelta(days=plus_days), dt.time(), dt.timezone.utc)


def epoch(t: dt.datetime | None) -> float | None:
    return None if t is None else t.timestamp()


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def text(value: Any) -> str:
    """A row or payload value as people read it: exact decimals, no quotes around strings."""
    value = plain(value)
    return value if isinstance(value, str) else "NULL" if value is None else str(value)


def monitor_banner(components: dict[str, views.Component], group: views.GroupVerdict | None = None) -> None:
    """The monitor's verdict on itself (can it judge, are its sources read, how far behind) and its reasons, at the
    top of every page; loudly stale when the monitor has stopped writing (every figure below is then old). A
    group's ([group]: no monitor row, `group` from views.group_health) is its verdict on itself. The shop's state is
    `shop_banner`'s, never this one's."""
    row, monitor = components.get(names.MONITOR), views.monitor_of(components)
    if (row is None or monitor is None) and group is not None:
        VERDICT_BOXES.get(group.verdict, st.info)(
            f"**Group {group.verdict}**: " + ("; ".join(group.reasons) if group.reasons else
                                             f"{group.live} member(s) live, every one of the {group.shards} shards "
                                             "committed, the change source read"))
    elif row is None or monitor is None:
        st.warning("The monitor has not written its health yet: figures appear once `oncewatch run` is running.")
    elif monitor.verdict == names.STOPPED:
        st.error(f"**Monitor stopped** at {when(row.updated_at)}: nothing is read until `oncewatch run` "
                 f"starts again. Figures below are as of then.")
    elif row.stale:
        st.error(f"The monitor is stale: its last health report is {duration(row.age_seconds)} old "
                 f"(at {when(row.updated_at)}). Figures below are as of then.")
    else:
        verdict = monitor.verdict or "unknown"
        reasons = list(monitor.reasons)
        if blind := views.cannot_judge(monitor):
            reasons.append(blind)
        lags = ", ".join(f"{stream} {duration(lag)}" for stream, lag in sorted(monitor.lag_seconds.items()))
        VERDICT_BOXES.get(verdict, st.info)(f"**Monitor {verdict}**: " + ("; ".join(reasons) if reasons else
                                                                            "both streams read, every rule judging"
                                                                            + (f" ({lags} behind)" if lags else "")))


SHOP_BOXES = {views.SHOP_CRITICAL: st.error, views.SHOP_WARNING: st.warning, views.SHOP_CLEAN: st.success}


def shop_banner(components: dict[str, views.Component], counts: list[tuple[str, str, str, int]]) -> None:
    """The shop's state under the monitor's verdict: its open findings by severity (acknowledged ones apart) and
    the watched consumer groups over F11's threshold. Figures of the monitor's last reading (its banner says how
    old)."""
    state = views.shop_state(counts, views.offsets_of(components),
                             threshold(components, "F11", "offset_drift_threshold"))
    if state.reasons:
        text = "; ".join(state.reasons)
    else:
        text = "no open finding" + (f" ({state.acknowledged:,} acknowledged)" if state.acknowledged else "")
    if state.behind is None:
        text += "; the watched consumer groups' lag is not read yet"
    elif not state.behind and state.threshold is not None:
        text += f"; every watched consumer group within {state.threshold:,.0f} records"
    SHOP_BOXES[state.verdict](f"**Shop {state.verdict}**: {text}")


def verdicts(components: dict[str, views.Component], group: views.GroupVerdict | None,
             counts: list[tuple[str, str, str, int]]) -> None:
    """The two verdicts at the top of every page, each in its own box: the monitor's on itself, then the shop's."""
    monitor_banner(components, group)
    shop_banner(components, counts)


@live
def banner(count: Callable[[Store], int] | None = None, shown: int = 0, what: str = "findings") -> None:
    """`verdicts`, refreshed by themselves, for a page that reads nothing else of the monitor's health.
    A page whose list a person works on (selects a row, acknowledges it) does not reorder it under their
    hand: `count` says how many the filters match now, and the banner says when more came than `shown`."""
    with store() as opened:
        at = time.time()
        comps = views.components(opened, at)
        verdicts(comps, views.group_health(opened, comps, at), opened.finding_counts())
        now = count(opened) if count else 0
    if count and now > shown:
        more = now - shown
        st.info(f"{more:,} more {what if more > 1 else what.removesuffix('s')} "
                f"{'match' if more > 1 else 'matches'} since this list was read: change a filter or reload to see "
                f"{'them' if more > 1 else 'it'}.")


def window() -> float:
    """Seconds of history the charts show, as picked in the sidebar."""
    return WINDOWS[st.sidebar.selectbox("Chart window", list(WINDOWS), index=list(WINDOWS).index(DEFAULT_WINDOW),
                                        key="window")]


def threshold(components: dict[str, views.Component], rule: str, name: str) -> float | None:
    """A `[rules]` threshold as the monitor runs with it (from its health), for a chart's threshold line."""
    monitor = views.monitor_of(components)
    return monitor.thresholds.get(rule, {}).get(name) if monitor is not None else None


def series_figure(points: list[dict[str, Any]], title: str, color: str | None, limit: float | None,
                  window_seconds: float, height: int = 260) -> Any:
    """One stored series as a line chart over the window, UTC on its axis, with its threshold as a dashed line;
    None, having said so, when there is nothing to draw: no point in the window, or (no threshold to show it
    against) nothing but zeros, which plotly would draw on an empty -1..1 axis."""
    frame = pd.DataFrame(points)
    if frame.empty:
        st.caption(f"{title}: no points in the last {duration(window_seconds)}")
        return None
    if limit is None and not frame["value"].any():
        st.caption(f"{title}: 0 throughout the last {duration(window_seconds)}")
        return None
    frame["at"] = pd.to_datetime(frame["at"], unit="s", utc=True)
    fig = px.line(frame, x="at", y="value", color=color, title=title, height=height)
    if limit is not None:
        fig.add_hline(y=limit, line_dash="dash", line_color=THRESHOLD_COLOR, annotation_text=f"threshold {limit:g}",
                      annotation_position="top left")
    fig.update_layout(margin={"l": 10, "r": 10, "t": 40, "b": 10}, xaxis_title=UTC_AXIS, yaxis_title=None,
                      legend_title=None)
    return fig


def series_chart(points: list[dict[str, Any]], title: str, color: str | None, limit: float | None, key: str,
                 window_seconds: float, height: int = 260) -> None:
    """`series_figure`, drawn."""
    fig = series_figure(points, title, color, limit, window_seconds, height)
    if fig is not None:
        st.plotly_chart(fig, key=key, config={"displayModeBar": False})


def signal_chart(components: dict[str, views.Component], name: str, points: list[dict[str, Any]],
                 window_seconds: float, color: str | None = None, line: bool = True) -> None:
    """One of CHARTS, with its threshold as the monitor runs with it (unless not `line`); `color` overrides
    its colouring."""
    title, by, (rule, limit) = CHARTS[name]
    series_chart(points, title, color or by, threshold(components, rule, limit) if line else None, f"chart-{name}",
                 window_seconds)


def severity_style(frame: pd.DataFrame) -> Any:
    """A findings table with its severity column in the severity's colour."""
    return frame.style.map(lambda s: f"color: {SEVERITY_COLORS[s]}; font-weight: 600" if s in SEVERITY_COLORS else "",
                           subset=["severity"])


def review(ids: list[str], action: str, *, reason: str, note: str, until_day: dt.date | None,
           duplicate_of: str | None) -> None:
    """Acknowledge or close findings from the dashboard, in the store the pages read (one short write)."""
    cfg = views.config()
    now = time.time()
    ack_for = cfg.rules.ack_timeout_seconds if cfg else Rules().ack_timeout_seconds
    with closing(open_writer(views.store_target())) as store:
        if action == "Acknowledge":
            reviews.acknowledge(store, ids, by=auth.who(), note=note, until=now + ack_for, now=now)
        else:
            until = epoch(day_start(until_day, plus_days=1)) if reason == "accepted_risk" and until_day else None
            reviews.close(store, ids, by=auth.who(), reason=reason, note=note, now=now, until=until,
                          duplicate_of=duplicate_of if reason == "duplicate" else None)
