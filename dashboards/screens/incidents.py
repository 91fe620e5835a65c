"""Incidents: the findings of one order or trade_no as one incident (dashboards.incidents), the
open ones first; choose one for its parts, each with its evidence summary and its history.

The newest findings up to READ_LIMIT are grouped, so the page costs the same on a large store.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from oncewatch.core import names
from oncewatch.dashboards import incidents, ui, views
from oncewatch.dashboards.app import page
from oncewatch.store import queries, reviews

READ_LIMIT = 5000
DRILLDOWN = str(page("drilldown"))

st.title("Incidents")
cfg = ui.config()
cols = st.columns([2, 1, 1])
statuses = cols[0].multiselect("Status of a part", names.STATUSES, default=[names.OPEN, names.ACKNOWLEDGED],
                               help="An incident is listed when one of its findings has one of these statuses.")
since = cols[1].date_input("Seen from (UTC)", value=None)
search = cols[2].text_input("trade_no or order", value=st.query_params.get("q", ""))

fields = incidents.Fields.of(cfg)
payments = cfg.domain.payments if cfg is not None else None
flt = queries.FindingFilter(statuses=tuple(statuses), since=ui.epoch(ui.day_start(since)), search=search)
with ui.store() as store:
    found = queries.recent_findings(store, flt, READ_LIMIT)
    matching = queries.count_findings(store, flt)
    listed = views.incidents_of(store, found, fields)

ui.banner(lambda store: queries.count_findings(store, flt), matching)
joined = sum(len(i.findings) > 1 for i in listed)
st.caption(f"{len(listed):,} incidents from {len(found):,} findings"
           + (f" (the newest {READ_LIMIT:,}: narrow the filters for older ones)" if len(found) == READ_LIMIT else "")
           + f"; {joined:,} join{'s' if joined == 1 else ''} several findings of one order, trade_no or group, "
             "the others hold one finding each." + ("" if payments else " A trade_no is not joined to its order: "
                    + (f"start the dashboard with {views.ENV_CONFIG}" if cfg is None else "the config has no "
                       "[domain.payments]") + "."))
if not listed:
    st.info("No incident matches these filters.")
    st.stop()
table = pd.DataFrame([{"incident": f"{i.kind} {i.value}", "status": i.status, "severity": i.severity,
                       "rules": " + ".join(i.rules), "findings": len(i.findings), "first seen": ui.when(i.first_seen),
                       "last seen": ui.when(i.last_seen)} for i in listed])
selection = st.dataframe(ui.severity_style(table), hide_index=True, on_select="rerun", selection_mode="single-row",
                         key="incidents")
incident = listed[selection.selection.rows[0] if selection.selection.rows else 0]
with ui.store() as store:
    trail = reviews.history(store, [f.id for f in incident.findings])

st.subheader(f"{incident.kind} {incident.value}: {' + '.join(incident.rules)}, {incident.status}")
if incident.entity:
    st.page_link(DRILLDOWN, label=f"Drill-down for {incident.entity}", icon=":material/timeline:",
                 query_params={"q": incident.entity})
for f in incident.findings:
    with st.expander(f"{f.rule} {f.name} · {f.severity} · {f.status}: {f.summary}", expanded=f.status == names.OPEN):
        st.markdown(f"`{f.id}` first seen {ui.when(f.first_seen)}, last seen {ui.when(f.last_seen)}; "
                    f"{len(f.evidence)} evidence items (the drill-down shows them).")
        changes = trail.get(f.id, [])
        if changes:
            st.dataframe(pd.DataFrame([{"at": ui.when(h.at), "status": h.status, "by": h.by, "reason": h.reason or "",
                                        "note": h.note} for h in changes]), hide_index=True)
        else:
            st.caption("No change of status since it opened.")
