"""Reports: the auditor's exports (the same files as `oncewatch export`) as download buttons.

A report is only built when its button is clicked (deferred download), so the page stays quick
however many findings the store holds.
"""

from __future__ import annotations

import datetime as dt
from functools import partial

import streamlit as st

from oncewatch.core import names
from oncewatch.dashboards import reports, ui, views
from oncewatch.store import queries

FORMATS = {"csv": "text/csv", "json": "application/json",
           "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"}

st.title("Reports")
ui.banner()
cfg = ui.config()
if cfg is None:
    st.info(f"Reports carry the hash of the monitor's config and mask the personal fields it names: start the "
            f"dashboard with {views.ENV_CONFIG}=/path/to/config.toml (not only {views.ENV_STORE}) to export.")
    st.stop()

# Two rows, as on the Findings page: in one, the dates and the checkbox's label were cut at 1280 px.
cols = [*st.columns([2, 1]), *st.columns([1, 1, 1])]
rule = cols[0].selectbox("Rule", [None, *views.RULES],
                         format_func=lambda r: "all rules" if r is None else f"{r} {views.RULES[r]}")
status = cols[1].selectbox("Status", [None, *names.STATUSES], format_func=lambda s: s or "any status")
since = ui.day_start(cols[2].date_input("Seen from (UTC)", value=None))
until = ui.day_start(cols[3].date_input("Seen until (UTC)", value=None), plus_days=1)
mask = cols[4].checkbox("Mask personal data", help="Masks: " + ", ".join(cfg.export.mask_fields))

with ui.store() as store:
    count = queries.count_findings(store, queries.FindingFilter(
        rules=(rule,) if rule else (), statuses=(status,) if status else (),
        since=ui.epoch(since), until=ui.epoch(until)))
st.metric("Findings in this report", f"{count:,}")
st.caption("Each report has a header with the range it covers, the binlog and Kafka positions reached, the config's "
           "SHA-256 and hashes of its data and header: `oncewatch verify REPORT` finds an edit of any cell, field or "
           "sheet and says where. Every finding where money is at stake carries its amount_involved. The XLSX has a "
           "Summary sheet (per rule: findings, still standing, amount involved).")

stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
for col, (fmt, mime) in zip(st.columns(len(FORMATS)), FORMATS.items()):
    col.download_button(
        f"Download {fmt.upper()}", icon=":material/download:", mime=mime, on_click="ignore",
        file_name=f"oncewatch-{rule or 'all'}-{stamp}.{fmt}",
        data=partial(reports.report, cfg, fmt, rule=rule, status=status, since=since, until=until, mask=mask))
