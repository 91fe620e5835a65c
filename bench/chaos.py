"""The chaos soak of issue 42: at least 10 minutes of the shop's traffic with every fault mode on, while the broker,
MariaDB, the Kafka Connect worker and one member of a group are each SIGKILLed and started again at random instants
(seeded), every mode's monitor (binlog, CDC source, CDC check, group) judged against an undisturbed control reading
the same traffic from the same starting store (devservices/chaos.py says how).

Prints each kill as it happens, then per mode the findings per rule of the disturbed monitor and of its control,
what tells them apart (nothing but F15 replays in the CDC modes when it is right), and every monitor exit; exits 1
when a mode differs or a kind had fewer kills than asked. On the dev stack (set ONCEWATCH_DEV_* for a stack of
your own). Usage:

    .venv/bin/python bench/chaos.py [--minutes 10] [--rate 10] [--kills 3] [--modes binlog,cdc-source,cdc-check,group]
                                    [--seed 42] [--down 1,6] [--folder DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devservices.chaos import MODES, Soak, folder_of, run  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="of traffic")
    parser.add_argument("--rate", type=float, default=10.0, help="new orders per second")
    parser.add_argument("--kills", type=int, default=3, help="of each kind (broker, mariadb, connect, member)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--down", default="1,6", help="min,max seconds a killed service stays down")
    parser.add_argument("--folder", type=Path, help="keep the monitors' configs, stores and logs here")
    args = parser.parse_args()
    low, high = (float(x) for x in args.down.split(","))
    soak = Soak(seconds=args.minutes * 60, rate=args.rate, kills=args.kills, modes=tuple(args.modes.split(",")),
                seed=args.seed, down=(low, high))

    def say(line: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)

    with folder_of(args.folder) as folder:
        report = run(soak, folder, say)
    for line in report.lines():
        print(line, flush=True)
    print("RESULT:", "every disturbed monitor equals its control" if report.ok() else "DIFFERENCES (see above)")
    return 0 if report.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
