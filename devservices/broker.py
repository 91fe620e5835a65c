"""The dev stack's Kafka broker: Apache Kafka 4, single-node KRaft, run from its Maven Central jars, with the
secured listeners of devservices.tls beside its PLAINTEXT one."""

from __future__ import annotations

import signal
import subprocess
import uuid
from pathlib import Path

from devservices import tls
from devservices.base import (HOST, KAFKA_CONTROLLER_PORT, KAFKA_PORT, ROOT, STATE, Service, already_up, java_argv,
                              log, port_open, spawn, stop, stop_if_config_changed, wait_until)

KAFKA_POM_DIR = ROOT / "devservices" / "kafka"
KAFKA = Service("kafka", STATE / "kafka" / "kafka.pid", STATE / "kafka" / "kafka.log",
                str(STATE / "kafka" / "server.properties"))


def ensure_kafka_jars() -> Path:
    lib = KAFKA_POM_DIR / "lib"
    if not any(lib.glob("kafka_2.13-*.jar")):
        log("fetching Apache Kafka jars from Maven Central")
        subprocess.run(["mvn", "-q", "-B", "-Dstyle.color=never", "-f", str(KAFKA_POM_DIR / "pom.xml"),
                        "dependency:copy-dependencies"], check=True)
    return lib

def kafka_dir() -> Path:
    return STATE / "kafka"


def kafka_config() -> str:
    """PLAINTEXT for the stack's own clients, and the secured listeners of devservices.tls beside it."""
    d = kafka_dir()
    listeners, advertised, protocols = tls.listeners()
    return f"""process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers={HOST}:{KAFKA_CONTROLLER_PORT}
listeners=PLAINTEXT://{HOST}:{KAFKA_PORT},CONTROLLER://{HOST}:{KAFKA_CONTROLLER_PORT},{listeners}
advertised.listeners=PLAINTEXT://{HOST}:{KAFKA_PORT},{advertised}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,{protocols}
{tls.kafka_properties()}log.dirs={d / 'data'}
num.partitions=3
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=5000
auto.create.topics.enable=false
message.max.bytes=2097152
log.retention.hours=168
"""


def write_kafka_config() -> Path:
    props = kafka_dir() / "server.properties"
    props.write_text(kafka_config())
    return props


def kafka_ready() -> bool:
    from kafka import KafkaAdminClient  # the venv's kafka-python; imported late so `status` needs none

    if not port_open(KAFKA_PORT):
        return False
    # A probe that gives up soon and is tried again: a broker started again after SIGKILL is fenced until its old
    # session expires, and a bootstrap begun meanwhile could hold the probe for its whole 30 s default.
    admin = KafkaAdminClient(bootstrap_servers=f"{HOST}:{KAFKA_PORT}", request_timeout_ms=5000,
                             bootstrap_timeout_ms=5000, client_id="devstack-probe")
    try:
        admin.list_topics()
        return True
    finally:
        admin.close()


def kafka_up() -> None:
    svc = KAFKA
    stop_if_config_changed(svc, kafka_dir() / "server.properties", kafka_config(), kafka_down)
    if already_up(svc, KAFKA_PORT):
        return
    lib = ensure_kafka_jars()
    d = kafka_dir()
    d.mkdir(parents=True, exist_ok=True)
    props = write_kafka_config()
    if not (d / "data" / "meta.properties").exists():
        log("formatting Kafka KRaft storage")
        cluster_id = subprocess.run(java_argv(lib, "kafka.tools.StorageTool", "random-uuid", heap="256m"),
                                    check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        subprocess.run(java_argv(lib, "kafka.tools.StorageTool", "format", "-c", str(props),
                                 "-t", cluster_id or uuid.uuid4().hex, "--standalone", heap="256m"),
                       check=True, capture_output=True)
    proc = spawn(svc, java_argv(lib, "kafka.Kafka", str(props)))
    wait_until("kafka", kafka_ready, proc, svc, 120)
    tls.ensure_scram_user()
    log(f"kafka listening on {HOST}:{KAFKA_PORT} (KRaft single node, controller on {KAFKA_CONTROLLER_PORT}; "
        f"SASL_SSL with SCRAM user {tls.SCRAM_USER} on {tls.KAFKA_SASL_SSL_PORT}, mutual TLS on {tls.KAFKA_SSL_PORT})")


def kafka_down() -> bool:
    return stop(KAFKA)


def kafka_kill() -> bool:
    """The broker ended by SIGKILL, as a crash ends it (no controlled shutdown); True when it was running."""
    return stop(KAFKA, sig=signal.SIGKILL)

