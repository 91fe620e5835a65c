"""Quarantine: what the monitor could not read, from both of its streams, kept in the store and read on past (as
`oncewatch quarantine` lists them): the binlog rows events of watched tables it could not decode, with their
coordinates for mysqlbinlog, and the Kafka records it could not parse, with their coordinates, reason and bytes.
The rules did not see either.

At most SHOWN Kafka records are read, the counts cover all of them."""

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
        ui.verdicts(comps, views.group_health(store, comps, now), store.finding_counts())
        counts = store.quarantine_counts()
        records = store.quarantined(limit=SHOWN)
        binlog = store.binlog_quarantined()
    total = sum(counts.values())
    st.caption(f"{len(binlog):,} binlog rows event{'' if len(binlog) == 1 else 's'} and {total:,} Kafka "
               f"record{'' if total == 1 else 's'} kept aside. What is here, the rules did not see: a finding "
               "they would have raised from it is missing.")

    st.subheader("Binlog rows events")
    if not binlog:
        st.success("No binlog rows event has been quarantined: every rows event of the watched tables was decoded.")
    else:
        st.caption("Rows of watched tables the monitor could not decode: read them with `mysqlbinlog "
                   "--start-position` at these coordinates.")
        st.dataframe(pd.DataFrame([q.__dict__ for q in binlog]), hide_index=True)

    st.subheader("Kafka records")
    if not total:
        st.success("No Kafka record has been quarantined: every record read was parsed.")
        return
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
