"""The `oncewatch` command: check a config, bootstrap, tail, run the monitor, read findings.

Exit codes (also in the README): 0 done; 1 unexpected internal error; 2 bad config or usage;
3 a source refused us or lost data we need (purged binlog, access denied).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Callable

from oncewatch import logs
from oncewatch.config import ConfigError, describe, load
from oncewatch.store import StoreError

EXIT_OK, EXIT_INTERNAL, EXIT_CONFIG, EXIT_SOURCE = 0, 1, 2, 3


def cmd_check_config(args: argparse.Namespace) -> int:
    cfg = load(args.config)
    print(json.dumps(describe(cfg), indent=2, default=str))
    return EXIT_OK


def cmd_tail_binlog(args: argparse.Namespace) -> int:
    """Print each committed transaction of the watched tables as one JSON line (demo, debugging)."""
    from collectors.binlog import BinlogCollector
    from oncewatch.records import plain

    cfg = load(args.config)
    collector = BinlogCollector(cfg.mysql, None)
    _on_signals(collector.stop)
    for tx in collector.transactions():
        for row in tx.rows:
            print(json.dumps(plain(row.to_dict()), ensure_ascii=False), flush=True)
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    """Run the monitor until SIGTERM/SIGINT, or with --until-idle until both streams are read to their
    ends and nothing changed for that many seconds."""
    from collectors.binlog import BinlogError
    from oncewatch.monitor import Monitor, SourceUnavailableError

    cfg = load(args.config)
    monitor = Monitor(cfg)
    _on_signals(monitor.stop)
    try:
        monitor.run(until_idle=args.until_idle)
    except (BinlogError, SourceUnavailableError) as exc:
        print(f"oncewatch: {exc}", file=sys.stderr)
        return EXIT_SOURCE
    return EXIT_OK


def cmd_bootstrap(args: argparse.Namespace) -> int:
    """Re-read the watched tables and restart the binlog tail from that snapshot's position."""
    from oncewatch.monitor import Monitor

    cfg = load(args.config)
    position = Monitor(cfg).bootstrap()
    print(json.dumps({"bootstrapped_at": position.to_dict()}))
    return EXIT_OK


def _on_signals(stop: Callable[[], None]) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="oncewatch", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check-config", help="validate a config file and print it resolved, secrets masked")
    c.add_argument("config")
    c.set_defaults(func=cmd_check_config)
    t = sub.add_parser("tail-binlog", help="print committed row changes of the watched tables as JSON lines")
    t.add_argument("--config", required=True)
    t.set_defaults(func=cmd_tail_binlog)
    r = sub.add_parser("run", help="run the monitor (collectors, checks, store, /metrics)")
    r.add_argument("--config", required=True)
    r.add_argument("--until-idle", type=float, metavar="SECONDS",
                   help="exit 0 once both streams are read to their ends and nothing changed for SECONDS")
    r.set_defaults(func=cmd_run)
    b = sub.add_parser("bootstrap", help="re-read the watched tables and tail the binlog from that snapshot")
    b.add_argument("--config", required=True)
    b.set_defaults(func=cmd_bootstrap)
    return p


def main(argv: list[str] | None = None) -> int:
    logs.setup()
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"oncewatch: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except StoreError as exc:
        print(f"oncewatch: store error: {exc}; check store.path", file=sys.stderr)
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
