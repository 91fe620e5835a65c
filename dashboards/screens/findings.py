"""Findings: filter by rule, severity, status, time and entity; each row links to its drill-down.

Only one page of rows is read (newest first), so the page costs the same with 100,000 findings.
"""

from __future__ import annotations

import math
from urllib.parse import quote

import pandas as pd
import streamlit as st

from oncewatch.core import names
from oncewatch.dashboards import ui, views
from oncewatch.dashboards.app import page
from oncewatch.store import StoreError, queries, reviews

PAGE_SIZE = 100
ROW_PX, MAX_TABLE_PX = 35, 1200  # the grid's row height; at most this tall, then it scrolls
DRILLDOWN = str(page("drilldown"))


def table_row(r: dict) -> dict:
    entity = views.entity_of(r["keys"])
    # the summary (what a person reads) right after what it is, so that 1280 px show it without scrolling
    return {"first seen": ui.when(r["first_seen"]), "rule": r["rule"], "severity": r["severity"],
            "status": r["status"], "summary": r["summary"], "drill-down": f"drilldown?q={quote(entity)}" if entity
            else None, "entity": entity, "name": r["name"],
            "resolved": f"{ui.when(r['resolved_at'])}: {r['resolution']}" if r["resolved_at"] else ""}


st.title("Findings")
# Two rows of filters: in one, the date inputs were cut to "yyyy/" at 1280 px.
cols = [*st.columns([2, 1.3, 1.3]), *st.columns([1, 1, 1.6])]
# ?rule=F1 (the Grafana board's links) preselects rules
rules = cols[0].multiselect("Rule", list(views.RULES), format_func=lambda r: f"{r} {views.RULES[r]}",
                            default=[r for r in st.query_params.get_all("rule") if r in views.RULES])
severities = cols[1].multiselect("Severity", names.SEVERITIES)
statuses = cols[2].multiselect("Status", names.STATUSES)
since = cols[3].date_input("Seen from (UTC)", value=None)
until = cols[4].date_input("Seen until (UTC)", value=None)
search = cols[5].text_input("trade_no or order", value=st.query_params.get("q", ""))

flt = queries.FindingFilter(rules=tuple(rules), severities=tuple(severities), statuses=tuple(statuses),
                            since=ui.epoch(ui.day_start(since)), until=ui.epoch(ui.day_start(until, plus_days=1)),
                            search=search)
with ui.store() as store:
    total = queries.count_findings(store, flt)
ui.banner(lambda store: queries.count_findings(store, flt), total)
pages = max(1, math.ceil(total / PAGE_SIZE))
page = st.columns(4)[0].number_input(f"Page (of {pages:,})", min_value=1, max_value=pages, value=1) \
    if pages > 1 else 1
with ui.store() as store:
    rows = queries.findings_page(store, flt, limit=PAGE_SIZE, offset=(page - 1) * PAGE_SIZE)
first = (page - 1) * PAGE_SIZE
st.caption(f"{total:,} findings match; showing {first + 1 if rows else 0:,}–{first + len(rows):,}, newest first.")
table = pd.DataFrame([table_row(r) for r in rows])
if table.empty:
    st.info("No finding matches these filters.")
    st.stop()
selection = st.dataframe(
    ui.severity_style(table), hide_index=True, on_select="rerun", selection_mode="single-row", key="findings",
    height=min(ROW_PX * (len(table) + 1) + 3, MAX_TABLE_PX),  # a page of rows, not ten in a small box
    column_config={"drill-down": st.column_config.LinkColumn("drill-down", display_text="open ↗"),
                   "summary": st.column_config.TextColumn(width="large")})
st.caption("Select a row for the link to its drill-down, or follow its ↗ link (opens a new tab).")
chosen = selection.selection.rows[0] if selection.selection.rows else 0
entity = table["entity"].iloc[chosen]
if entity:
    st.page_link(DRILLDOWN, label=f"Drill-down for {entity}", icon=":material/timeline:", query_params={"q": entity})

with ui.store() as store:
    changes = reviews.history(store, [rows[chosen]["id"]])[rows[chosen]["id"]]
with st.expander(f"History of {rows[chosen]['id']} ({len(changes)} changes since it opened)"):
    st.dataframe(pd.DataFrame([{"at": ui.when(h.at), "status": h.status, "by": h.by, "reason": h.reason or "",
                                "note": h.note} for h in changes], columns=["at", "status", "by", "reason", "note"]),
                 hide_index=True)

# A person's part of the lifecycle, as `oncewatch ack` and `close` do it (behind the login, like every page).
actionable = [r["id"] for r in rows if r["status"] in (names.OPEN, names.ACKNOWLEDGED)]
if actionable:
    with st.expander("Acknowledge or close"):
        picked = rows[chosen]["id"]
        ids = st.multiselect("Findings", actionable, default=[picked] if picked in actionable else [])
        action = st.radio("Action", ("Acknowledge", "Close"), horizontal=True)
        reason = st.selectbox("Reason", names.CLOSE_REASONS, disabled=action != "Close")
        until_day = st.date_input("Accepted until (UTC)", value=None, disabled=reason != "accepted_risk")
        duplicate_of = st.text_input("Duplicate of (finding id)", disabled=reason != "duplicate")
        note = st.text_input("Note (what was done or decided)")
        if st.button("Apply", type="primary", disabled=not (ids and note.strip())):
            try:
                ui.review(ids, action, reason=reason, note=note.strip(), until_day=until_day,
                          duplicate_of=duplicate_of.strip() or None)
            except (reviews.ReviewError, StoreError) as exc:
                st.error(str(exc))
            else:
                st.success(f"{'Acknowledged' if action == 'Acknowledge' else 'Closed'} {len(ids)} finding(s).")
