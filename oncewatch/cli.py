"""The `oncewatch` command: run the monitor, and read, export and show what it found.

Check a config, bootstrap, tail the binlog, run the monitor, list findings, export reports, serve the
dashboard, print the alert rules and the Grafana board.

Exit codes (also in the README): 0 done; 1 unexpected internal error; 2 bad config or usage,
including a `--since`/`--until` that is not ISO-8601, an `--out` that names the store or an
existing file without `--force`, and a store.path that is no store the command can use (none yet
for `findings` and `export`, an empty or foreign file, a store another monitor holds);
3 a source refused us or lost data we need (purged binlog, access denied); 4 the disk holding the
store is full (said at every start until there is room); 5 `verify` found a report or an attestation changed
(or `attest` was to chain to one that does not verify).
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import closing
from importlib import resources
from pathlib import Path

from oncewatch import __version__
from oncewatch.core import exposure, forkserver, logs, names
from oncewatch.core.config import Config, ConfigError, describe, load
from oncewatch.store import StoreError, StoreFullError, is_store_file, open_reader, open_writer, reviews

EXIT_OK, EXIT_INTERNAL, EXIT_CONFIG, EXIT_SOURCE, EXIT_DISK_FULL, EXIT_TAMPERED = 0, 1, 2, 3, 4, 5
SIGNAL_POLL_SECONDS = 0.1  # how soon after SIGINT or SIGTERM the stop begins (_on_signals)


class OutRefusedError(ValueError):
    """An --out that would write over the store, or over a file without --force."""


def cmd_check_config(args: argparse.Namespace) -> int:
    """Print the resolved config; what it exposes (core.exposure) goes to stderr as warnings, not errors."""
    if (args.config is None) == (args.config_file is None):
        print("oncewatch check-config: give the config once, as --config FILE", file=sys.stderr)
        return EXIT_CONFIG
    cfg = load(args.config or args.config_file)
    print(json.dumps(describe(cfg), indent=2, default=str))
    for e in exposure.of_config(cfg):
        print(f"oncewatch: warning: {e.message}", file=sys.stderr)
    return EXIT_OK


def cmd_tail_binlog(args: argparse.Namespace) -> int:
    """Print each committed transaction of the watched tables as one JSON line (demo, debugging)."""
    from oncewatch.collectors.binlog import BinlogCollector
    from oncewatch.core.exact_json import plain

    cfg = load(args.config)
    collector = BinlogCollector(cfg.mysql, None)
    _on_signals(collector.stop)
    for tx in collector.transactions():
        for row in tx.rows:
            print(json.dumps(plain(row.to_dict()), ensure_ascii=False), flush=True)
    return EXIT_OK


def _run_group(cfg: Config, args: argparse.Namespace) -> int:
    """`run` with [group]: one instance of the group, until SIGTERM/SIGINT (--until-idle is one instance's)."""
    from oncewatch.monitor import tune_gc
    from oncewatch.monitor.group.run import GroupMemberFailed, GroupSupervisor

    if args.until_idle is not None:
        print("oncewatch: --until-idle: the instances of a group share the work, none of them knows when all of it "
              "is done; leave it out with [group]", file=sys.stderr)
        return EXIT_CONFIG
    supervisor = GroupSupervisor(cfg)
    _on_signals(supervisor.stop)
    tune_gc()
    try:
        supervisor.run()
    except GroupMemberFailed as exc:  # the traceback is in the log already
        print(f"oncewatch: {exc}", file=sys.stderr)
        return EXIT_SOURCE
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    """Run the monitor until SIGTERM/SIGINT, or with --until-idle until both streams are read to their
    ends, every verdict due of what was read is given, and nothing changed for that many seconds."""
    cfg = load(args.config)
    if cfg.group is not None:
        return _run_group(cfg, args)
    forkserver.start()  # the readers' processes come from it: its imports overlap the monitor's, here on
    from oncewatch.checks.engine import StateMismatchError
    from oncewatch.collectors.binlog import BinlogError
    from oncewatch.collectors.kafka_events import KafkaEventsError
    from oncewatch.monitor import ReaderFailedError, SourceUnavailableError, Supervisor, tune_gc

    supervisor = Supervisor(cfg)
    _on_signals(supervisor.stop)
    tune_gc()
    try:
        supervisor.run(until_idle=args.until_idle)
    except (BinlogError, KafkaEventsError, SourceUnavailableError) as exc:
        print(f"oncewatch: {exc}", file=sys.stderr)
        return EXIT_SOURCE
    except StateMismatchError as exc:
        print(f"oncewatch: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except ReaderFailedError as exc:  # the tracebacks are in the log already, one per failure
        print(f"oncewatch: {exc}", file=sys.stderr)
        return EXIT_INTERNAL
    return EXIT_OK


def cmd_bootstrap(args: argparse.Namespace) -> int:
    """Re-read the watched tables and restart the binlog tail from that snapshot's position."""
    from oncewatch.monitor import Monitor

    cfg = load(args.config)
    with closing(Monitor(cfg)) as monitor:
        position = monitor.bootstrap()
    print(json.dumps({"bootstrapped_at": position.to_dict()}))
    return EXIT_OK


def cmd_findings(args: argparse.Namespace) -> int:
    """Print the findings with their evidence, as a table or as the JSON that exports carry."""
    from oncewatch.dashboards.reports import findings_json, findings_table, roles_of

    cfg = load(args.config)
    with closing(open_reader(cfg.store.target)) as store:
        found = findings_json(store, rule=args.rule, status=args.status, roles=roles_of(cfg.domain, cfg.announce),
                              domain=cfg.domain)
    print(json.dumps(found, indent=2, ensure_ascii=False) if args.format == "json" else findings_table(found))
    return EXIT_OK


def cmd_quarantine(args: argparse.Namespace) -> int:
    """List the Kafka records and binlog rows events kept aside because they could not be parsed or decoded."""
    from oncewatch.dashboards.views import quarantine_row

    cfg = load(args.config)
    with closing(open_reader(cfg.store.target)) as store:
        rows = [quarantine_row(q) for q in store.quarantined(limit=args.limit)]
        binlog = [q.__dict__ for q in store.binlog_quarantined()]
    if args.format == "json":
        print(json.dumps({"kafka": rows, "binlog": binlog}, indent=2, ensure_ascii=False))
        return EXIT_OK
    for r in rows:
        print(f"{r['coordinates']}  {r['timestamp']}  {r['reason']}  {r['size']} bytes  {r['detail']}")
    for b in binlog:
        print(f"{b['binlog_file']}:{b['event_pos']}#{b['txid']}  {b['table']}  {b['reason']}  {b['detail']}")
    if not rows and not binlog:
        print("no quarantined records")
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    """Write an auditor's report (dashboards.reports describes its header and hash)."""
    from oncewatch.dashboards.reports import report

    if args.since and args.until and args.since >= args.until:
        print("oncewatch: --since must be earlier than --until", file=sys.stderr)
        return EXIT_CONFIG
    cfg = load(args.config)
    if is_store_file(args.out, cfg.store.target):  # before the export is made, which can take a while
        raise OutRefusedError(f"--out {args.out} is the store's own file ({cfg.store.path}): an export never "
                              f"writes over the store; give another --out path")
    _refuse_existing(args.out, args.force)
    data = report(cfg, args.format, rule=args.rule, status=args.status, since=args.since, until=args.until,
                  mask=args.mask)
    return _write_out(args.out, data, args.force)


def cmd_verify(args: argparse.Namespace) -> int:
    """Recompute a report's two hashes, or check an attestation's hashes, signature and chain with --public-key:
    exit 0 when everything matches, EXIT_TAMPERED (each difference said) when not."""
    from oncewatch.dashboards.report_check import FORMATS, ReportError, check

    if args.public_key is not None and not _starts(args.report, (b"# report: oncewatch-report/", b'{\n  "header"')):
        return _verify_attestation(args)
    if args.previous is not None:
        print("oncewatch verify: --previous is for an attestation, which is checked with --public-key FILE",
              file=sys.stderr)
        return EXIT_CONFIG
    if _is_attestation(args.report):
        print(f"oncewatch verify: {args.report} is an attestation: check it with the public key of the key that "
              f"signed it, --public-key FILE", file=sys.stderr)
        return EXIT_CONFIG
    fmt = args.format or Path(args.report).suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        print(f"oncewatch verify: cannot tell the format of {args.report}: give --format {'|'.join(FORMATS)}",
              file=sys.stderr)
        return EXIT_CONFIG
    try:
        data = Path(args.report).read_bytes()
    except OSError as exc:
        print(f"oncewatch verify: cannot read {args.report} ({exc.strerror})", file=sys.stderr)
        return EXIT_CONFIG
    try:
        problems = check(data, fmt)
    except ReportError as exc:
        print(f"oncewatch verify: {args.report}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    for problem in problems:
        print(f"oncewatch verify: {args.report}: {problem}", file=sys.stderr)
    if not problems:
        print(f"{args.report}: data_sha256 and report_sha256 match")
    return EXIT_TAMPERED if problems else EXIT_OK


def _starts(path: str, beginnings: tuple[bytes, ...]) -> bool:
    """Whether a file begins with one of `beginnings` (False when it cannot be read: its command says why)."""
    try:
        with open(path, "rb") as f:
            return f.read(64).startswith(beginnings)
    except OSError:
        return False


def _is_attestation(path: str) -> bool:
    """Whether a file begins as `oncewatch attest` writes one (its XLSX: whether its JSON does)."""
    from oncewatch.dashboards.attestation import VERSION

    json_path = str(Path(path).with_suffix(".json")) if path.endswith(".xlsx") else path
    return _starts(json_path, (b'{\n  "attestation": "' + VERSION.encode(),))


def _verify_attestation(args: argparse.Namespace) -> int:
    """`verify --public-key`: the attestation's hashes, signature, XLSX and chain (dashboards.attestation_check)."""
    from oncewatch.dashboards.attestation_keys import key_id, public_key
    from oncewatch.dashboards.attestation_check import check

    try:
        key = public_key(Path(args.public_key).read_bytes())
    except OSError as exc:
        print(f"oncewatch verify: cannot read --public-key {args.public_key} ({exc.strerror})", file=sys.stderr)
        return EXIT_CONFIG
    except ValueError as exc:
        print(f"oncewatch verify: --public-key {args.public_key}: not an Ed25519 public key in PEM ({exc}); "
              f"`oncewatch attest-key --config FILE` prints the one to give", file=sys.stderr)
        return EXIT_CONFIG
    path = Path(args.report)
    if path.suffix.lower() == ".xlsx":  # covered by its JSON, which records its SHA-256
        path = path.with_suffix(".json")
        print(f"oncewatch verify: an attestation's XLSX is checked through its JSON: checking {path}", file=sys.stderr)
    for given in (path, args.previous):
        if given is not None and not Path(given).is_file():
            print(f"oncewatch verify: no such file {given}", file=sys.stderr)
            return EXIT_CONFIG
    found = check(path, key, previous=Path(args.previous) if args.previous else None)
    for problem in found.problems:
        print(f"oncewatch verify: {problem}", file=sys.stderr)
    for note in found.notes:
        print(f"oncewatch verify: note: {note}", file=sys.stderr)
    if not found.problems:
        print(f"{path}: signature (key public_key_sha256 {key_id(key)}), hashes and chain verify "
              f"({', '.join(p.name for p in found.checked)})")
    return EXIT_TAMPERED if found.problems else EXIT_OK


def cmd_attest(args: argparse.Namespace) -> int:
    """Write a signed period attestation (dashboards.attestation) and its XLSX."""
    from oncewatch.dashboards.attestation import AttestError, ChainBrokenError, make

    cfg = load(args.config)
    out = Path(args.out) if args.out else None
    if out is not None and is_store_file(str(out), cfg.store.target):
        raise OutRefusedError(f"--out {out} is the store's own file ({cfg.store.path}): give another --out path")
    try:
        made = make(cfg, args.since, args.until, out=out, previous=Path(args.previous) if args.previous else None,
                    force=args.force)
    except ChainBrokenError as exc:
        print(f"oncewatch attest: {exc}", file=sys.stderr)
        return EXIT_TAMPERED
    except (AttestError, FileExistsError) as exc:
        print(f"oncewatch attest: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    trades = made.document["trades"]
    print(f"oncewatch: wrote {made.path} (sequence {made.document['sequence']}; trades verified "
          f"{trades['verified']['trades']}, violated {trades['violated']['trades']}, pending "
          f"{trades['pending']['trades']}; {len(made.document['findings'])} finding(s)) and {made.xlsx_path}",
          file=sys.stderr)
    return EXIT_OK


def cmd_attest_key(args: argparse.Namespace) -> int:
    """Make an Ed25519 key pair for [attest] (--out DIR), or print the public key of the config's (--config)."""
    from oncewatch.dashboards.attestation_keys import key_id, new_key_pair, public_key, public_pem, signing_key

    if args.config is not None:
        public = signing_key(load(args.config)).public_key()
        sys.stdout.buffer.write(public_pem(public))
        print(f"oncewatch: public_key_sha256 {key_id(public)}", file=sys.stderr)
        return EXIT_OK
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    private, public = new_key_pair()
    secret, shared = folder / "attest.key", folder / "attest.pub"
    for path in (secret, shared):
        _refuse_existing(str(path), args.force)
    with os.fdopen(os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
        os.fchmod(f.fileno(), 0o600)  # a file written over keeps its mode otherwise
        f.write(private)
    shared.write_bytes(public)
    print(f"oncewatch: wrote {secret} (the private key, mode 600: name it in [attest] key_file and keep it there) "
          f"and {shared} (the public key, for auditors: `oncewatch verify FILE --public-key {shared.name}`; "
          f"public_key_sha256 {key_id(public_key(public))})", file=sys.stderr)
    return EXIT_OK


def _refuse_existing(out: str, force: bool) -> None:
    if not force and os.path.lexists(out):
        raise _exists(out)


def _exists(out: str) -> OutRefusedError:
    return OutRefusedError(f"{out} exists: give another --out path, or add --force to write over it")


def _write_out(out: str, data: bytes, force: bool) -> int:
    """`data` into `out`, over an existing file only with --force ("x" mode, so not over one made
    since an earlier check either)."""
    try:
        with open(out, "wb" if force else "xb") as f:
            f.write(data)
    except FileExistsError:
        raise _exists(out) from None
    except OSError as exc:
        print(f"oncewatch: cannot write {out}: {exc.strerror}; give a writable --out path", file=sys.stderr)
        return EXIT_CONFIG
    print(f"oncewatch: wrote {out} ({len(data)} bytes)", file=sys.stderr)
    return EXIT_OK


def cmd_ack(args: argparse.Namespace) -> int:
    """Acknowledge open findings: their page ends until rules.ack_timeout_seconds passes or the fact ends."""
    cfg = load(args.config)
    now = time.time()
    with closing(open_writer(cfg.store.target)) as store:
        reviews.acknowledge(store, args.ids, by=args.by, note=args.note, until=now + cfg.rules.ack_timeout_seconds,
                            now=now)
    print(f"oncewatch: acknowledged {len(args.ids)} finding(s) until {_iso(now + cfg.rules.ack_timeout_seconds)}",
          file=sys.stderr)
    return EXIT_OK


def cmd_close(args: argparse.Namespace) -> int:
    """Close findings with a reason; the same fact seen again reopens them."""
    cfg = load(args.config)
    with closing(open_writer(cfg.store.target)) as store:
        reviews.close(store, args.ids, by=args.by, reason=args.reason, note=args.note, now=time.time(),
                      until=args.until.timestamp() if args.until else None, duplicate_of=args.of)
    print(f"oncewatch: closed {len(args.ids)} finding(s) as {args.reason}", file=sys.stderr)
    return EXIT_OK



def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="seconds")


def cmd_dashboard(args: argparse.Namespace) -> int:
    """Serve the Streamlit dashboard for the monitor's store until Ctrl-C or SIGTERM."""
    from oncewatch.dashboards import launch

    cfg = load(args.config)
    open_reader(cfg.store.target).close()  # no store yet: say so here, not in a browser
    signal.signal(signal.SIGTERM, _interrupt)
    return launch.serve(config=args.config, host=args.host, port=args.port)


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


# What ships in the package for Prometheus and Grafana, by command.
SHIPPED = {"alerts": "alerts.yml", "alert-tests": "alerts_test.yml", "grafana": "grafana.json"}
# Every alert's runbook_url is this (pyproject's Documentation URL) + "#<anchor>" of the README's Runbook;
# `--runbook-base` puts a shop's own copy of the docs in its place, in the rules and in their tests alike.
RUNBOOK_BASE = "https://github.com/oncewatch/oncewatch/blob/main/README.md"


def cmd_shipped(args: argparse.Namespace) -> int:
    """Print (or write with --out) the alert rules, their promtool tests or the Grafana board."""
    data = (resources.files("oncewatch.dashboards") / SHIPPED[args.command]).read_bytes()
    if getattr(args, "runbook_base", None):
        data = data.replace(f"{RUNBOOK_BASE}#".encode(), f"{args.runbook_base}#".encode())
    if args.out is None:
        sys.stdout.buffer.write(data)
        return EXIT_OK
    return _write_out(args.out, data, args.force)


def _timestamp(text: str) -> dt.datetime:
    """--since/--until: an ISO-8601 date (midnight UTC) or datetime (UTC unless it has an offset)."""
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO-8601 date or datetime: {text!r} (e.g. 2024-05-01 or 2024-05-01T12:00:00+08:00)") from None
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


def _runbook_base(text: str) -> str:
    """--runbook-base: an http(s) URL that goes before "#<anchor>" inside the rules' quoted strings."""
    if not re.fullmatch(r"https?://[^\s\"'\\#{}]+", text):
        raise argparse.ArgumentTypeError(
            f"not an http(s) URL without spaces, quotes, braces or '#': {text!r} (e.g. https://wiki.example/oncewatch)")
    return text


def _finding_filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True)
    p.add_argument("--rule", choices=list(names.RULES), metavar="RULE",
                   help=f"only this rule, by id as the findings carry it ({', '.join(names.RULES)})")
    p.add_argument("--status", choices=names.STATUSES)


def _review_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True)
    p.add_argument("ids", nargs="+", metavar="ID", help="finding ids, as `oncewatch findings` lists them")
    p.add_argument("--by", default=getpass.getuser(), help="who (default: the login name)")
    p.add_argument("--note", required=True, help="what was done or decided, for the history")


def _force_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true", help="write over an existing --out file")


def _on_signals(stop: Callable[[], None]) -> None:
    """SIGINT and SIGTERM call `stop` from a thread of their own, soon after. Not from the handler: Python runs it in
    the main thread between two of its steps, and `stop` takes locks the main thread may be holding just then (a
    monitor sent SIGTERM as it switched from the bootstrap to the binlog tail hung for good, its handler waiting in
    Event.set for the lock its own thread held in Event.set). The handler only notes the signal: no lock, no I/O."""
    signalled: list[int] = []

    def watch() -> None:
        while not signalled:
            time.sleep(SIGNAL_POLL_SECONDS)
        stop()

    threading.Thread(target=watch, name="signals", daemon=True).start()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: signalled.append(signum))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="oncewatch", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"oncewatch {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check-config", help="validate a config file and print it resolved, secrets masked")
    # --config as every other command takes it; the bare FILE of earlier versions still works.
    c.add_argument("config_file", nargs="?", metavar="FILE", help=argparse.SUPPRESS)
    c.add_argument("--config")
    c.set_defaults(func=cmd_check_config)
    t = sub.add_parser("tail-binlog", help="print committed row changes of the watched tables as JSON lines")
    t.add_argument("--config", required=True)
    t.set_defaults(func=cmd_tail_binlog)
    r = sub.add_parser("run", help="run the monitor (collectors, checks, store, /metrics)")
    r.add_argument("--config", required=True)
    r.add_argument("--until-idle", type=float, metavar="SECONDS",
                   help="exit 0 once both streams are read to their ends, every verdict due of what was read "
                        "is given (thresholds and graces waited out) and nothing changed for SECONDS")
    r.set_defaults(func=cmd_run)
    b = sub.add_parser("bootstrap", help="re-read the watched tables and tail the binlog from that snapshot")
    b.add_argument("--config", required=True)
    b.set_defaults(func=cmd_bootstrap)
    f = sub.add_parser("findings", help="print the findings in the store with their evidence")
    _finding_filters(f)
    f.add_argument("--format", choices=("table", "json"), default="table")
    f.set_defaults(func=cmd_findings)
    q = sub.add_parser("quarantine", help="list the Kafka records that could not be parsed, kept in the store")
    q.add_argument("--config", required=True)
    q.add_argument("--format", choices=("table", "json"), default="table")
    q.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N, by topic/partition/offset")
    q.set_defaults(func=cmd_quarantine)
    e = sub.add_parser("export", help="write an auditor's report of the findings with a header and a SHA-256")
    _finding_filters(e)
    e.add_argument("--format", choices=("csv", "json", "xlsx"), required=True)
    e.add_argument("--since", type=_timestamp, metavar="T",
                   help="findings seen at or after T (ISO-8601 date or datetime; UTC unless an offset is given)")
    e.add_argument("--until", type=_timestamp, metavar="T", help="findings seen before T (same form as --since)")
    e.add_argument("--mask", action="store_true", help="mask the personal fields of [export] mask_fields")
    e.add_argument("--out", required=True, metavar="FILE")
    _force_arg(e)
    e.set_defaults(func=cmd_export)
    v = sub.add_parser("verify", help="recompute a report's data and header hashes (exit 0: unchanged, 5: changed)")
    v.add_argument("report", metavar="REPORT")
    v.add_argument("--format", choices=("csv", "json", "xlsx"), help="when the file name does not end in it")
    v.add_argument("--public-key", metavar="PUB", help="an attestation: the signer's public key (attest-key writes it)")
    v.add_argument("--previous", metavar="FILE", help="an attestation: the one before it in the chain (default: the "
                                                      "file it names, in its folder)")
    v.set_defaults(func=cmd_verify)
    t = sub.add_parser("attest", help="write a signed, chained attestation of a period's trades and findings")
    t.add_argument("--config", required=True)
    t.add_argument("--since", type=_timestamp, required=True, metavar="T", help="the period's start (ISO-8601)")
    t.add_argument("--until", type=_timestamp, required=True, metavar="T", help="the period's end, exclusive")
    t.add_argument("--out", metavar="FILE", help="the JSON's path, its XLSX beside it (default: a new file in "
                                                 "[attest] directory)")
    t.add_argument("--previous", metavar="FILE", help="the attestation it chains to (default: the newest in "
                                                      "[attest] directory; none: the first of a chain)")
    _force_arg(t)
    t.set_defaults(func=cmd_attest)
    k = sub.add_parser("attest-key", help="make the Ed25519 key pair attestations are signed with, or print the "
                                          "public key of the config's")
    which = k.add_mutually_exclusive_group(required=True)
    which.add_argument("--out", metavar="DIR", help="write DIR/attest.key (private, mode 600) and DIR/attest.pub")
    which.add_argument("--config", help="print the public key of [attest] key_file")
    _force_arg(k)
    k.set_defaults(func=cmd_attest_key)
    a = sub.add_parser("ack", help="acknowledge open findings: their alert ends while someone handles them")
    _review_args(a)
    a.set_defaults(func=cmd_ack)
    c = sub.add_parser("close", help="close findings with a reason (the same fact seen again reopens them)")
    _review_args(c)
    c.add_argument("--reason", required=True, choices=names.CLOSE_REASONS)
    c.add_argument("--until", type=_timestamp, metavar="T", help="when an accepted risk expires (ISO-8601)")
    c.add_argument("--of", metavar="ID", help="the finding a duplicate duplicates")
    c.set_defaults(func=cmd_close)
    d = sub.add_parser("dashboard", help="serve the atomicity dashboard (Streamlit) for the monitor's store")
    d.add_argument("--config", required=True)
    d.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1; others need a login)")
    d.add_argument("--port", type=int, default=8501)
    d.set_defaults(func=cmd_dashboard)
    for name, what in (("alerts", "the Prometheus alert rules"), ("alert-tests", "the alert rules' promtool tests"),
                       ("grafana", "the Grafana dashboard (import it, pick the Prometheus datasource)")):
        s = sub.add_parser(name, help=f"print {what}, or write them with --out")
        s.add_argument("--out", metavar="FILE")
        _force_arg(s)
        if name in ("alerts", "alert-tests"):
            s.add_argument("--runbook-base", type=_runbook_base, metavar="URL",
                           help=f"put URL in place of {RUNBOOK_BASE} in every runbook_url (your own copy of the "
                                "docs, with the same #anchors)")
        s.set_defaults(func=cmd_shipped)
    return p


def main(argv: list[str] | None = None) -> int:
    logs.setup()
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"oncewatch: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except StoreFullError as exc:
        print(f"oncewatch: store error: {exc}", file=sys.stderr)
        return EXIT_DISK_FULL
    except StoreError as exc:
        print(f"oncewatch: store error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (reviews.ReviewError, OutRefusedError) as exc:
        print(f"oncewatch: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return EXIT_OK
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one clear line, details in the log
        logging.getLogger("oncewatch").error("internal error", exc_info=True, extra={"event": "internal_error"})
        print(f"oncewatch: internal error: {type(exc).__name__}: {exc} (a bug; please report it with the log)",
              file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
