"""The `oncewatch-shop` command: run the simulated payment shop with chosen faults and style.

Exit codes: 0 done (the ground truth was written where asked); 1 the run failed or left
incidents (traffic no fault explains); 2 bad options; 3 MariaDB or Kafka refused or failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys

import pymysql
from kafka.errors import KafkaError

from oncewatch.shop.consumers import DownstreamError
from oncewatch.shop.faults import MODES, FaultSpecError
from oncewatch.shop.layout import SHAPES
from oncewatch.shop.runner import ShopError, run
from oncewatch.shop.settings import STYLES, KafkaTarget, MySQLTarget, SettingsError, ShopSettings

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SOURCE = 0, 1, 2, 3
PASSWORD_ENV = "ONCEWATCH_SHOP_MYSQL_PASSWORD"


class _LogfmtFormatter(logging.Formatter):
    """`level logger msg key=value ...`: the `extra={...}` facts stay visible and greppable."""

    _STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        facts = " ".join(f"{k}={json.dumps(v, default=str)}" for k, v in vars(record).items()
                         if k not in self._STANDARD)
        return f"{record.levelname.lower()} {record.name} {record.getMessage()} {facts}".rstrip()


def build_parser() -> argparse.ArgumentParser:
    modes = "\n".join(f"  {m.name:<26} {m.rule:<4} {m.story}"
                      + ("" if m.styles == STYLES else f" (style {' or '.join(m.styles)})") for m in MODES)
    p = argparse.ArgumentParser(
        prog="oncewatch-shop", description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"fault modes (--faults all | none | mode=rate,... | F<n>=rate,...):\n{modes}")
    d = ShopSettings()
    p.add_argument("--seed", type=int, default=d.seed, help="fixes which orders get which faults (default %(default)s)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--orders", type=int, default=d.orders, help="how many orders (default %(default)s)")
    size.add_argument("--duration", type=float, help="seconds of traffic instead of a count")
    p.add_argument("--rate", type=float, default=d.rate, help="new orders per second (default %(default)s)")
    p.add_argument("--faults", default=d.faults, help="fault mix, e.g. all, none, send_lost=0.05,F1=0.02")
    p.add_argument("--style", choices=STYLES, default=d.style, help="how events reach Kafka (default %(default)s)")
    p.add_argument("--shape", choices=SHAPES, default=d.shape,
                   help="shop: one schema, flat events (examples/shop.toml); mall: sharded tables in two schemas, a "
                        "callback log, amounts in cents, enveloped events (examples/mall.toml); default %(default)s")
    p.add_argument("--truth", metavar="PATH", help="write the ground truth JSON here")
    p.add_argument("--reset", action="store_true", help="drop and recreate the shop tables and the topic")
    p.add_argument("--workers", type=int, default=d.workers, help="service threads (default %(default)s)")
    p.add_argument("--mysql", default=f"{d.mysql.host}:{d.mysql.port}", help="host:port of MariaDB/MySQL")
    p.add_argument("--mysql-user", default=d.mysql.user, help=f"user (password from ${PASSWORD_ENV})")
    p.add_argument("--database", default=d.mysql.database,
                   help="schema of the shop tables (the mall's: <database>_0 and <database>_1)")
    p.add_argument("--bootstrap", default=d.kafka.bootstrap_servers, help="Kafka bootstrap servers")
    p.add_argument("--topic", default=d.kafka.topic, help="the shop's event topic")
    p.add_argument("--groups", default=",".join(d.kafka.groups), metavar="SHIPPING,POINTS",
                   help="the two downstream consumer groups (default %(default)s); two shops on one topic "
                        "need their own, or their consumers share the partitions")
    p.add_argument("--log-level", default="INFO")
    return p


def settings_from(args: argparse.Namespace) -> ShopSettings:
    host, _, port = args.mysql.rpartition(":")
    if not port.isdigit():
        raise SettingsError(f"--mysql: expected host:port, got {args.mysql!r}")
    mysql = MySQLTarget(host=host, port=int(port), user=args.mysql_user, database=args.database,
                        **({"password": os.environ[PASSWORD_ENV]} if PASSWORD_ENV in os.environ else {}))
    return ShopSettings(seed=args.seed, orders=args.orders, duration=args.duration, rate=args.rate,
                        faults=args.faults, style=args.style, shape=args.shape, truth_path=args.truth,
                        reset=args.reset,
                        workers=args.workers, mysql=mysql,
                        kafka=KafkaTarget(bootstrap_servers=args.bootstrap, topic=args.topic,
                                          groups=_groups(args.groups)))


def _groups(text: str) -> tuple[str, str]:
    groups = tuple(g.strip() for g in text.split(","))
    if len(groups) != 2 or not all(groups):
        raise SettingsError(f"--groups: two consumer group names, comma-separated, got {text!r}")
    return groups[0], groups[1]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the run like Ctrl-C: workers, relay, groups wind down


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LogfmtFormatter())
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    logging.getLogger("kafka").setLevel(logging.WARNING)  # its INFO lines are connection chatter
    try:
        truth = run(settings_from(args))
    except (FaultSpecError, SettingsError) as exc:
        print(f"oncewatch-shop: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (pymysql.MySQLError, KafkaError) as exc:
        print(f"oncewatch-shop: {type(exc).__name__}: {exc} (are the dev services up? "
              f"python -m devservices.stack up)", file=sys.stderr)
        return EXIT_SOURCE
    except (ShopError, DownstreamError, TimeoutError) as exc:
        print(f"oncewatch-shop: run failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("oncewatch-shop: stopped before the end of the run; no ground truth written", file=sys.stderr)
        return EXIT_FAILED
    by_rule: dict[str, int] = {}
    for fault in truth.faults:
        by_rule[fault.rule] = by_rule.get(fault.rule, 0) + 1
    print(json.dumps({"orders": truth.orders, "faults": by_rule, "truth": args.truth, **truth.stats}))
    if truth.incidents:
        print(f"oncewatch-shop: {len(truth.incidents)} incidents, first: {truth.incidents[0]}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
