"""`python -m devservices.stack up [--no-paging]|down|status`: the development services, all on loopback, started or
stopped together. A real MariaDB (devservices.mariadb), a real Kafka broker (devservices.broker), PostgreSQL for the
shared store (devservices.postgres), a Kafka Connect worker with Debezium's MariaDB connector
(devservices.kafka_connect), and the paging path, Debian's Prometheus and Alertmanager (devservices.paging).

`up` installs what is missing (Debian packages, the Kafka, Connect and Debezium jars from Maven Central), initialises
data dirs once under `.devstack/`, starts each service in the background, waits until it really answers and prints
where it listens; it is a no-op for a service that already runs. `--no-paging` leaves Prometheus and the Alertmanager
out (`make test`'s lanes whose tests page nothing: an idle Prometheus evaluating the alert rules every second uses
a core's hundredth). `down` stops only processes this command started
(their pid files live in `.devstack/`). This module is the command alone: nothing imports it.
"""

from __future__ import annotations

import subprocess
import sys

from devservices import broker, kafka_connect, mariadb, paging, postgres
from devservices.base import (HOST, KAFKA_PORT, MARIADB_PORT, StackError, ensure_debian_packages, log, port_open,
                              read_pid)


def up(with_paging: bool = True) -> None:
    ensure_debian_packages()
    mariadb.mariadb_up()
    postgres.up()
    broker.kafka_up()
    kafka_connect.up()
    if with_paging:
        paging.up()


def down() -> None:
    stopped = (paging.down() + kafka_connect.down() + postgres.down()
               + [("kafka", broker.kafka_down()), ("mariadb", mariadb.mariadb_down())])
    for name, was_running in stopped:
        log(f"{name} stopped" if was_running else f"{name} was not started by this script")


def status() -> int:
    rc = 0
    for svc, port in ((mariadb.MARIADB, MARIADB_PORT), (broker.KAFKA, KAFKA_PORT), *kafka_connect.SERVICES,
                      *paging.SERVICES, *postgres.SERVICES):
        pid = read_pid(svc)
        if pid is None:
            rc = 1
            log(f"{svc.name}: stopped")
        else:
            log(f"{svc.name}: running (pid {pid}) on {HOST}:{port}, "
                f"{'answering' if port_open(port) else 'NOT answering'}")
    return rc


def main(argv: list[str]) -> int:
    if argv not in (["up"], ["up", "--no-paging"], ["down"], ["status"]):
        print("usage: python -m devservices.stack up [--no-paging]|down|status", file=sys.stderr)
        return 2
    try:
        if argv[0] == "up":
            up(with_paging=argv[1:] != ["--no-paging"])
        elif argv[0] == "down":
            down()
        else:
            return status()
    except (StackError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", None)
        log(f"error: {exc}{(': ' + detail.decode(errors='replace').strip()) if isinstance(detail, bytes) else ''}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
