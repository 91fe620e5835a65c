"""A distributed Kafka Connect cluster of two workers on the dev stack's Kafka, for the tests that move a connector's
task from one worker to the other (a rebalance). Opt-in: `make services` and the dev stack never start it.

Both workers run ConnectDistributed with the same group.id, their configs, source offsets and statuses in topics
of their own on the stack's Kafka (`<GROUP>-configs`, `-offsets`, `-status`), each with its REST API on a port of
its own: CLUSTER_PORTS, after the standalone worker's CONNECT_PORT. The standalone worker keeps running beside them.
A worker that leaves the group (stopped, or killed and so gone after its session timeout) has its tasks handed to
the other at once (`scheduled.rebalance.max.delay.ms` 0: by default the group waits five minutes for it to come
back), and a task moved resumes from the offsets last flushed to the offsets topic, every second here.
"""

from __future__ import annotations

import signal
import time
import urllib.error
from pathlib import Path

from devservices.kafka_connect import (CONNECT_PORT, PLUGINS, WORKER_LIB, connector_config, ensure_debezium_user,
                                     ensure_jars, rest)
from devservices.base import (HOST, KAFKA_PORT, STATE, Service, StackError, already_up, java_argv, log, spawn, stop,
                              wait_until)

GROUP = "oncewatch-connect-cluster"
CLUSTER_PORTS = (CONNECT_PORT + 1, CONNECT_PORT + 2)
CLUSTER_DIR = STATE / "connect-cluster"
SESSION_TIMEOUT_MS = 6000  # how soon the group takes a killed worker for gone (default 10 s)


def worker(n: int) -> Service:
    folder = CLUSTER_DIR / f"worker-{n}"
    return Service(f"connect-worker-{n}", folder / "connect.pid", folder / "connect.log",
                   str(folder / "worker.properties"))


def worker_id(n: int) -> str:
    """How the cluster names worker `n` in a connector's status (its REST host and port)."""
    return f"{HOST}:{CLUSTER_PORTS[n]}"


def write_worker_config(n: int) -> Path:
    props = Path(worker(n).marker)
    props.parent.mkdir(parents=True, exist_ok=True)
    props.write_text(f"""bootstrap.servers={HOST}:{KAFKA_PORT}
group.id={GROUP}
listeners=http://{HOST}:{CLUSTER_PORTS[n]}
rest.advertised.host.name={HOST}
rest.advertised.port={CLUSTER_PORTS[n]}
config.storage.topic={GROUP}-configs
offset.storage.topic={GROUP}-offsets
status.storage.topic={GROUP}-status
config.storage.replication.factor=1
offset.storage.replication.factor=1
status.storage.replication.factor=1
offset.storage.partitions=1
status.storage.partitions=1
key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
key.converter.schemas.enable=true
value.converter.schemas.enable=true
offset.flush.interval.ms=1000
scheduled.rebalance.max.delay.ms=0
session.timeout.ms={SESSION_TIMEOUT_MS}
heartbeat.interval.ms=1000
plugin.path={PLUGINS}
plugin.discovery=service_load
topic.creation.enable=true
""")
    return props


def start(*workers: int) -> None:
    """Workers `workers` (0, 1; both by default) running and answering on their REST ports, started side by side."""
    ensure_jars()
    ensure_debezium_user()
    started = []
    for n in workers or range(len(CLUSTER_PORTS)):
        svc, port = worker(n), CLUSTER_PORTS[n]
        if already_up(svc, port):
            continue
        props = write_worker_config(n)
        argv = java_argv(WORKER_LIB, "org.apache.kafka.connect.cli.ConnectDistributed", str(props))
        started.append((n, spawn(svc, argv)))
    for n, proc in started:
        port = CLUSTER_PORTS[n]
        wait_until(f"kafka connect worker {n}", lambda p=port: rest("GET", "/", port=p) is not None, proc, worker(n),
                   120)
        log(f"kafka connect worker {n} of {GROUP} listening on {HOST}:{port}")


def down(n: int | None = None, sig: int = signal.SIGTERM) -> None:
    """Worker `n` stopped (SIGKILL with `sig`: gone without leaving the group), or both."""
    for i in range(len(CLUSTER_PORTS)) if n is None else (n,):
        stop(worker(i), sig=sig)


def task_worker(name: str, port: int, on: str | None = None, timeout: float = 120) -> str:
    """The worker (worker_id) on which connector `name`'s task 0 runs, asked of the worker on `port`, once it runs
    (on worker `on`, where given: the status of a worker killed says RUNNING until the group has moved its task).
    A failed task is an error with its trace's first line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = rest("GET", f"/connectors/{name}/status", port=port)
        except OSError:  # 404 before the config reached it, or a worker rejoining the group
            status = {}
        for task in status.get("tasks", []):
            if task.get("state") == "FAILED":
                raise StackError(f"the task of {name} failed: {(task.get('trace') or '').splitlines()[:1]}; see "
                                 f"{CLUSTER_DIR}/worker-*/connect.log")
            if task.get("id") == 0 and task.get("state") == "RUNNING" and on in (None, task["worker_id"]):
                return task["worker_id"]
        time.sleep(0.5)
    raise StackError(f"the task of {name} is not running{f' on {on}' if on else ''} after {timeout:.0f} s; see "
                     f"{CLUSTER_DIR}/worker-*/connect.log")


def register(name: str, **overrides: str) -> None:
    """Create or update a Debezium MariaDB connector on the cluster (the dev one's config with `overrides`)."""
    rest("PUT", f"/connectors/{name}/config", {**connector_config(), **overrides}, port=CLUSTER_PORTS[0])


def unregister(name: str) -> None:
    """Connector `name` deleted from the cluster, through whichever worker answers."""
    for port in CLUSTER_PORTS:
        try:
            rest("DELETE", f"/connectors/{name}", port=port)
            return
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return
        except OSError:
            continue
