"""Drift: consumer-group lag (records and seconds) and its skew per topic and partition, how far
the monitor itself has read, changes waiting for their event, the event delay distribution, and in CDC
check mode how far the CDC pipeline is behind the binlog."""

from __future__ import annotations

import time

import pandas as pd
import plotly.express as px
import streamlit as st

from oncewatch.core import histogram, names
from oncewatch.core.protocol import CdcCounts, CdcStatus, KafkaEventsStatus
from oncewatch.core.records import CLOCK_BINLOG_HEADER, CLOCK_GTID_COMMIT_TS, CLOCK_READ_TIME, CLOCK_ROW_COLUMN
from oncewatch.dashboards import ui, views
from oncewatch.store import queries

CLOCKS = (CLOCK_GTID_COMMIT_TS, CLOCK_ROW_COLUMN, CLOCK_BINLOG_HEADER, CLOCK_READ_TIME)


def bar(frame: pd.DataFrame, key: str, log_y: bool = False, **kwargs) -> None:
    fig = px.bar(frame, height=280, log_y=log_y, **kwargs)
    fig.update_layout(margin={"l": 10, "r": 10, "t": 40, "b": 10}, legend_title=None)
    fig.update_xaxes(type="category")
    st.plotly_chart(fig, key=key, config={"displayModeBar": False})


@ui.live
def live(window_seconds: float) -> None:
    now = time.time()
    with ui.store() as store:
        comps = views.components(store, now)
        stats = views.engine_stats(store)
        quarantined = store.quarantine_counts()
        spread = queries.series(store, "lag_stddev", now - window_seconds)
        means = queries.series(store, "lag_mean", now - window_seconds)
        gap = queries.series(store, "cdc_position_gap", now - window_seconds)
        group = views.group_health(store, comps, now)
        counts = store.finding_counts()
    ui.verdicts(comps, group, counts)
    offsets = views.offsets_of(comps)
    events = views.status_of(comps, names.KAFKA_EVENTS)

    skews = views.lag_skew(offsets)
    worst = max(skews, key=lambda s: s.stddev, default=None)
    histograms = histogram.delay_buckets(stats)
    # The tile shows the best clock present (docs/architecture.md §6); the table below has every clock.
    clock = next((c for c in CLOCKS if c in histograms), None)
    cols = st.columns(4)
    cols[0].metric("Max partition lag", f"{views.max_lag(offsets):,}", border=True,
                   help="The largest lag of one partition, any group (F11 compares a group's total)")
    cols[1].metric("Worst lag stddev", f"{worst.stddev:.2f}" if worst else "–", border=True,
                   help=f"{worst.group} on {worst.topic}" if worst else None)
    unread = events.unread() if isinstance(events, KafkaEventsStatus) else 0
    cols[2].metric("Unread by the monitor", f"{unread:,}", border=True)
    cols[3].metric("p99 delay since start",
                   ui.duration(histogram.quantile(histograms[clock], 0.99)) if clock else "–", border=True,
                   help=(f"By the {clock} clock, " if clock else "No pair matched yet. ")
                   + "of every pair matched since the monitor started (the Overview's is of the last minute)")

    st.subheader("Consumer-group lag")
    if offsets.error:
        st.error(f"Last offsets poll failed: {offsets.error}")
    lags = pd.DataFrame(views.lag_rows(offsets))
    if lags.empty:
        st.info("No consumer group is watched (kafka.consumer_groups) or the offsets have not been polled yet.")
    else:
        st.caption(f"Polled {ui.when(offsets.polled_at or None)}. A partition the group never committed on has no lag.")
        lags["committed"] = lags["committed"].map(lambda v: "no commit" if pd.isna(v) else f"{int(v):,}")
        st.dataframe(lags, hide_index=True, column_config={
            "lag_seconds": st.column_config.NumberColumn("lag (s)", format="%.1f")})
        spread_chart(comps, spread, means, window_seconds)
        skew = pd.DataFrame(skews)
        if not skew.empty:
            st.dataframe(skew.rename(columns={"stddev": "lag stddev (F12)", "max_lag": "max lag"}), hide_index=True,
                         column_config={"lag stddev (F12)": st.column_config.NumberColumn(format="%.2f")})
        known = lags.dropna(subset=["lag"]).assign(partition=lambda f: f["partition"].astype(str))
        cols = st.columns(2)
        with cols[0]:
            bar(known, "lag", x="partition", y="lag", color="group", barmode="group", facet_col="topic",
                title="Lag per partition (records)")
        with cols[1]:
            timed = known.dropna(subset=["lag_seconds"])
            if timed.empty:
                st.caption("Lag per partition (seconds): no group's lag has a time yet (its oldest unread record's).")
            else:
                bar(timed, "lag-seconds", x="partition", y="lag_seconds", color="group", barmode="group",
                    facet_col="topic", title="Lag per partition (seconds)")

    st.subheader("The monitor's own position")
    cols = st.columns(2)
    with cols[0]:
        read = pd.DataFrame(events.partitions if isinstance(events, KafkaEventsStatus) else ())
        if read.empty:
            st.caption("The Kafka events collector has not reported partitions yet.")
        else:
            st.dataframe(read.assign(unread=read["end"] - read["position"])[["topic", "partition", "position", "end",
                                                                               "unread"]], hide_index=True)
        if quarantined:
            st.caption("Quarantined records (kept in the store with their offsets; the Quarantine page lists them)")
            st.dataframe(pd.DataFrame([{"topic": t, "reason": r, "records": n}
                                       for (t, r), n in sorted(quarantined.items())]), hide_index=True)
    with cols[1]:
        backlog = pd.DataFrame(sorted(stats.get("backlog_by_table", {}).items()), columns=["table", "waiting"])
        if not backlog["waiting"].any():  # a bar chart of zeros is an empty -1..1 axis
            st.caption("No change is waiting for its event" + (f" ({len(backlog)} announced tables, 0 each)."
                                                               if len(backlog) else "."))
        else:
            bar(backlog, "backlog", x="table", y="waiting", title="Changes waiting for their event (backlog)")

    pipeline = stats.get("pipeline") or {}
    if pipeline.get("against_binlog"):
        cdc_pipeline(comps, pipeline, gap, window_seconds)

    st.subheader("Event delay distribution")
    if not histograms:
        st.caption("No change has been matched with its event yet.")
    else:
        st.dataframe(pd.DataFrame([{"clock": clock, "pairs": int(buckets[-1][1]),
                                    "p50": ui.duration(histogram.quantile(buckets, 0.5)),
                                    "p99": ui.duration(histogram.quantile(buckets, 0.99))}
                                   for clock, buckets in histograms.items()]), hide_index=True)
        per_bucket = [{"clock": clock, "delay": "more" if bound == "+Inf" else f"≤ {ui.duration(float(bound))}",
                       "pairs": count - previous}
                      for clock, buckets in histograms.items()
                      for (bound, count), previous in zip(buckets, [0] + [c for _, c in buckets[:-1]])]
        # log scale: a few pairs 2 s late beside thousands within 10 ms must still show
        bar(pd.DataFrame(per_bucket), "delay", log_y=True, x="delay", y="pairs", color="clock", barmode="group",
            title="Matched pairs by delay bucket, by commit clock (log scale)")


SPREAD_TITLE = "Partition lag spread over time, stddev (records)"


def spread_chart(comps: dict[str, views.Component], spread: list[dict], means: list[dict],
                 window_seconds: float) -> None:
    """F12's reading with both its tests: the spread above `partition_skew_threshold` records (dashed) and above
    `partition_skew_relative` of the group's mean lag on the topic (dotted, one line per group and topic). A group
    can sit far above the first line and raise nothing, below the second: a stall of every partition."""
    limit = ui.threshold(comps, "F12", "partition_skew_threshold")
    share = ui.threshold(comps, "F12", "partition_skew_relative")
    fig = ui.series_figure(spread, SPREAD_TITLE, "group", limit, window_seconds, height=300)
    if fig is None:
        return
    if share is not None and means:
        for (group, topic), part in pd.DataFrame(means).groupby(["group", "topic"]):
            fig.add_scatter(x=pd.to_datetime(part["at"], unit="s", utc=True), y=part["value"] * share, mode="lines",
                            name=f"{share:g} × mean lag: {group} on {topic}",
                            line={"dash": "dot", "color": ui.THRESHOLD_COLOR, "width": 1})
    st.plotly_chart(fig, key="spread", config={"displayModeBar": False})
    st.caption("F12 fires when a group's spread on a topic stays above both lines for `rules.partition_skew_seconds`: "
               + (f"the threshold {limit:g} records (dashed)" if limit is not None else "its threshold")
               + (f" and {share:g} × its mean partition lag (dotted)" if share is not None else
                  " and a share of its mean partition lag (not reported by this monitor)") + ".")


def cdc_pipeline(comps: dict[str, views.Component], pipeline: dict, gap: list[dict], window_seconds: float) -> None:
    """[cdc] mode = "check": what of the binlog the CDC topics have not delivered yet, and what their reader
    counted (checks.pipeline; F13-F16 are on the Findings page)."""
    st.subheader("CDC pipeline against the binlog")
    status = views.status_of(comps, names.CDC)
    reader = status.cdc if isinstance(status, CdcStatus) else CdcCounts()
    limit = ui.threshold(comps, "F13", "cdc_position_gap_threshold")
    cols = st.columns(4)
    cols[0].metric("Transactions not delivered", f"{pipeline['lag_transactions']:,}", border=True,
                   help=f"{pipeline['lag_rows']:,} rows; binlog transactions whose copy has not come on the CDC topics "
                        "(within the grace: past it, their rows are F13 findings)")
    cols[1].metric("Oldest waiting", ui.duration(pipeline["lag_seconds"]), border=True)
    cols[2].metric("Position gap", f"{pipeline['position_gap']:,} B", border=True,
                   help=f"Bytes of binlog from the oldest transaction not delivered to the newest read; the alert "
                        f"fires above {limit:,.0f}" if limit is not None else None)
    cols[3].metric("Replayed records", f"{reader.replayed_records:,}", border=True,
                   help=f"{reader.incomplete_transactions} incomplete transactions, "
                        f"{reader.unreadable_records} unreadable records; "
                        f"{pipeline['before_start']:,} transactions from before the monitor's start not judged")
    ui.series_chart(gap, "CDC position gap over time (bytes of binlog)", None, limit, "cdc-gap", window_seconds)


st.title("Drift")
live(ui.window())
