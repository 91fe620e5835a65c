"""Quarantine: the Kafka records the monitor could not parse, kept in the store with their
coordinates, reason and bytes, and the binlog rows events it could not decode, with theirs (as
`oncewatch quarantine` lists them); both streams read on past them.

At most SHOWN records are read, the counts cover all of them."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from oncewatch.dashboards import ui, views

SHOWN = 1000



@ui.live
def records() -> None:
    with ui.store() as store:
        now = time.time()
        comps = views.components(store, now)
        ui.monitor_banner(comps, views.group_health(store, comps, now))
        counts = store.quarantine_counts()
        records = store.quarantined(limit=SHOWN)
        binlog = store.binlog_quarantined()
    if binlog:
        st.subheader("Binlog rows events")
        st.caption("Rows of watched tables the monitor could not decode: read them with `mysqlbinlog "
                   "--start-position` at these coordinates; the rules did not see them.")
        st.dataframe(pd.DataFrame([q.__dict__ for q in binlog]), hide_index=True)
    total = sum(counts.values())
    if not total:
        st.success("No Kafka record has been quarantined: every record read was parsed.")
        return
    st.subheader("Kafka records")
    st.caption(f"{total:,} records kept aside; each stays in the store with its bytes (a too_large value "
               "excepted: the broker has it at those coordinates). Fix the producer or the topic's paths in the "
               "config.")
    st.dataframe(pd.DataFrame([{"topic": t, "reason": r, "records": n} for (t, r), n in sorted(counts.items())]),
                 hide_index=True)
    rows = pd.DataFrame([views.quarantine_row(q) for q in records])
    st.dataframe(rows[["coordinates", "timestamp", "reason", "detail", "size", "preview"]], hide_index=True,
                 column_config={"detail": st.column_config.TextColumn(width="large")})
    if total > len(records):
        st.caption(f"Showing the first {len(records):,} by topic, partition and offset; "
                   "`oncewatch quarantine --config FILE --format json` lists them all.")


st.title("Quarantine")
records()
