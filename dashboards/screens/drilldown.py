"""Drill-down: for one trade_no or order, every row change and Kafka event in time order, with
coordinates, timestamps and value diffs, and the findings on it with the evidence behind each.

A consumer group (`group:NAME`, F11's lag and F12) or a table's backlog (`backlog:TABLE`, F11) is a
reading, not records: its drill-down draws the readings kept of it over the sidebar's window, with
the thresholds, and the group's lag per partition as last polled.
"""

from __future__ import annotations

import time

import pandas as pd
import plotly.express as px
import streamlit as st

from oncewatch.core.records import EmittedEvent, RowChange
from oncewatch.dashboards import ui, views
from oncewatch.store import queries


def change_text(row: RowChange) -> str:
    changes = views.diff(row)
    if row.op == "update":
        return ", ".join(f"{c}: {ui.text(a)} → {ui.text(b)}" for c, (a, b) in changes.items()) or "(no change)"
    sign = "+" if row.op == "insert" else "−"
    return f"{sign} " + ", ".join(f"{c}={ui.text(v)}" for c, v in changes.items())


def row_entry(row: RowChange) -> dict:
    return {"time": row.commit_time, "source": "binlog", "lane": f"binlog {row.qualified_table}",
            "what": f"{row.qualified_table} {row.op} {'/'.join(map(str, row.pk))}", "coordinates": row.coordinates,
            "clock": row.commit_clock, "change": change_text(row)}


def event_entry(event: EmittedEvent) -> dict:
    kind = event.keys.get("event_type") or (event.cdc or {}).get("op") or event.format
    return {"time": event.timestamp_ms / 1000, "source": "kafka", "lane": f"kafka {event.topic}",
            "what": f"{event.topic} {kind}" + (f" key={event.key}" if event.key is not None else ""),
            "coordinates": event.coordinates, "clock": event.timestamp_type,
            "change": ", ".join(f"{k}={ui.text(v)}" for k, v in sorted(event.keys.items()))}


def readings(query: str, window_seconds: float, found: queries.Timeline, comps: dict[str, views.Component],
             series: dict[str, list[dict]]) -> None:
    """A consumer group's or a table's backlog readings over the window."""
    kind, name = queries.reading_of(query)
    cols = st.columns(2)
    cols[0].metric("Readings", sum(map(len, series.values())), border=True,
                   help=f"Points kept of {query} in the last {ui.duration(window_seconds)}")
    cols[1].metric("Findings", len(found.findings), border=True)
    for col, (series_name, points) in zip(st.columns(len(series)), series.items()):
        with col:  # a group's series per topic (CHARTS colours them per group, as on the Overview)
            ui.signal_chart(comps, series_name, points, window_seconds, color="topic" if kind == "group" else None)
    lags = [r for r in views.lag_rows(views.offsets_of(comps)) if r.group == name]
    if lags:
        st.caption("Lag per partition as last polled")
        st.dataframe(pd.DataFrame(lags), hide_index=True, column_config={
            "lag_seconds": st.column_config.NumberColumn("lag (s)", format="%.1f")})


def records(found: queries.Timeline, pruned: queries.Pruned) -> None:
    """A trade_no's, order's or announced key's row changes and events, and what the store no longer keeps."""
    cols = st.columns(3)
    cols[0].metric("Row changes", len(found.rows), border=True)
    cols[1].metric("Kafka events", len(found.events), border=True)
    cols[2].metric("Findings", len(found.findings), border=True)
    st.caption(f"Looked up {', '.join(found.entities)}.")
    if pruned.for_retention or pruned.for_budget:
        kept = f"back to {ui.when(pruned.oldest_kept)}" if pruned.oldest_kept is not None else "none of them now"
        st.caption(f"The store keeps raw records {kept}: {pruned.for_retention:,} older ones went past "
                   f"store.retention_hours and {pruned.for_budget:,} to keep it within store.max_bytes. Findings keep "
                   f"their own evidence.")
    if found.truncated:
        st.warning(f"More than {queries.TIMELINE_LIMIT:,} records: only the newest are shown.")
    entries = sorted([row_entry(r) for r in found.rows] + [event_entry(e) for e in found.events],
                     key=lambda e: e["time"])
    if not entries:
        st.info("No row change or event of this entity is in the store.")
        return
    frame = pd.DataFrame(entries)
    frame["at"] = pd.to_datetime(frame["time"], unit="s", utc=True)
    fig = px.scatter(frame, x="at", y="lane", color="source", hover_data=["what", "coordinates", "change"],
                     height=120 + 40 * frame["lane"].nunique())
    fig.update_traces(marker={"size": 12})
    fig.update_layout(margin={"l": 10, "r": 10, "t": 10, "b": 10}, xaxis_title=ui.UTC_AXIS, yaxis_title=None)
    st.plotly_chart(fig, key="timeline", config={"displayModeBar": False})
    frame["time"] = frame["time"].map(ui.when)
    # what changed first after the time, so that a 1280 px page shows it without scrolling sideways
    st.dataframe(frame[["time", "what", "change", "coordinates", "source", "clock"]], hide_index=True,
                 column_config={"change": st.column_config.TextColumn(width="large")})


def findings_of(found: queries.Timeline) -> None:
    st.subheader("Findings")
    for f in found.findings:
        with st.expander(f"{f.rule} {f.name} · {f.severity} · {f.status}: {f.summary}", expanded=f.status == "open"):
            st.markdown(f"**Why it fired:** {f.summary}. First seen {ui.when(f.first_seen)}, last seen "
                        f"{ui.when(f.last_seen)}." + (f" Resolved {ui.when(f.resolved_at)}: {f.resolution}."
                                                     if f.resolved_at else ""))
            st.dataframe(pd.DataFrame([{"kind": e.kind, "values": ", ".join(f"{k}={ui.text(v)}"
                                                                            for k, v in sorted(e.values.items())),
                                        "coordinates": e.coordinates, "time": ui.when(e.time)} for e in f.evidence],
                                      columns=["kind", "values", "coordinates", "time"]),
                         hide_index=True, column_config={"values": st.column_config.TextColumn(width="large")})
    if not found.findings:
        st.caption("No finding mentions this entity.")


@ui.live
def live(query: str, window_seconds: float) -> None:
    """The entity's records (or readings) and findings, refreshed by themselves: later events and
    findings about it appear without a reload."""
    now = time.time()
    with ui.store() as store:  # one read of the store per refresh
        found = queries.timeline(store, query)
        gone = queries.pruned(store)
        series = queries.readings(store, query, now - window_seconds)  # none for a record entity
        comps = views.components(store, now) if series else {}
    if series:
        readings(query, window_seconds, found, comps, series)
    else:
        records(found, gone)
    findings_of(found)


st.title("Drill-down")
ui.banner()
query = st.text_input("trade_no or order (or kind:value, e.g. trade_no:T1, group:NAME)",
                      value=st.query_params.get("q", ""))
if not query.strip():
    st.info("Give a trade_no or an order to see everything oncewatch holds about it; the Findings page links here.")
    st.stop()
st.query_params["q"] = query.strip()
live(query, ui.window() if queries.reading_of(query) else 0.0)  # only readings are drawn over a window
