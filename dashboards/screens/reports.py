"""Reports: the auditor's exports (the same files as `oncewatch export`) as download buttons, and the period
attestations of [attest] (the same files as `oncewatch attest`): made here, listed with whether each verifies.

A report is only built when its button is clicked (deferred download), so the page stays quick
however many findings the store holds.
"""

from __future__ import annotations

import datetime as dt
from functools import partial
from pathlib import Path

import streamlit as st

from oncewatch.core import names
from oncewatch.core.config import ConfigError
from oncewatch.dashboards import attestation, attestation_check, attestation_keys, reports, ui, views
from oncewatch.store import StoreError, queries

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

# ---------------------------------------------------------------- attestations (issue 45)

st.subheader("Attestations")
if cfg.attest is None or cfg.attest.directory is None:
    st.info("A period attestation is a signed, chained statement of a period's trades verified, violated and pending "
            "and of its findings, which an auditor checks with the public key alone. Give the config an [attest] "
            "table with key_file (make one with `oncewatch attest-key --out DIR`) and directory (where they are "
            "kept) to make and list them here.")
    st.stop()
try:
    key = attestation_keys.signing_key(cfg)
except ConfigError as exc:
    st.error(f"The attestation key cannot be used: {exc}")
    st.stop()
folder = Path(cfg.attest.directory)
chain = attestation.listing(folder)
cols = st.columns([2, 2, 1])
if chain:
    since = dt.datetime.fromisoformat(chain[-1].until.replace("Z", "+00:00"))
    cols[0].text_input("From (UTC): where the chain ends", value=chain[-1].until, disabled=True)
else:
    since = ui.day_start(cols[0].date_input("From (UTC)", value=None, key="attest_since"))
until = ui.day_start(cols[1].date_input("Until the end of (UTC)", value=None, key="attest_until"), plus_days=1)
if cols[2].button("Make attestation", icon=":material/verified:", disabled=since is None or until is None):
    try:
        made = attestation.make(cfg, since, until)
    except (attestation.AttestError, FileExistsError, StoreError) as exc:
        st.error(f"No attestation was made: {exc}")
    else:
        st.success(f"Made {made.path.name} (sequence {made.document['sequence']}) and its XLSX.")
rows = attestation_check.chain_rows(folder, key.public_key())
st.caption(f"Kept in {folder}, newest first; each checked here with the public key of [attest]. An auditor checks "
           f"one (and the chain before it) with `oncewatch verify FILE --public-key attest.pub` on any machine.")
if not rows:
    st.info("No attestation yet.")
    st.stop()
st.dataframe(rows, hide_index=True)
picked = st.selectbox("Attestation", [r["file"] for r in rows])
cols = st.columns(3)
cols[0].download_button("Download JSON", data=(folder / picked).read_bytes(), file_name=picked,
                        mime=FORMATS["json"], icon=":material/download:", on_click="ignore")
xlsx = (folder / picked).with_suffix(".xlsx")
if xlsx.is_file():
    cols[1].download_button("Download XLSX", data=xlsx.read_bytes(), file_name=xlsx.name, mime=FORMATS["xlsx"],
                            icon=":material/download:", on_click="ignore")
cols[2].download_button("Download public key", data=attestation_keys.public_pem(key.public_key()),
                        file_name="attest.pub", mime="application/x-pem-file", icon=":material/key:",
                        on_click="ignore")
