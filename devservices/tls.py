"""The dev stack's own certificate authority and the secured ways into its servers (issue 46).

`ensure()` makes, once per stack (`<state>/tls`, with openssl): a CA, a server certificate for the name
`localhost` alone (so a client that checks host names and dials 127.0.0.1 is refused: the wrong-host test), and
a client certificate for mutual TLS, all PEM. The broker takes them as PEM stores (no keytool needed). Its
secured listeners beside PLAINTEXT: SASL_SSL (SCRAM-SHA-256 and -512, user `SCRAM_USER` with the password in
`<state>/secrets/kafka_scram_password`; and OAUTHBEARER, whose unsecured tokens `unsecured_token` makes) on the Kafka port + 7, and SSL with a client certificate required on
the Kafka port + 8; both advertise `localhost`. Cheap: the keys are EC P-256, made in well under a second.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from devservices.base import HOST, KAFKA_PORT, STATE, StackError, log, secret_file

KAFKA_SASL_SSL_PORT = KAFKA_PORT + 7
KAFKA_SSL_PORT = KAFKA_PORT + 8
SERVER_NAME = "localhost"  # the only name in the servers' certificate
SCRAM_USER = "oncewatch-scram"
X509_USER = "oncewatch_x509"  # MariaDB: the monitor's grants and password, over TLS with a client certificate only
SCRAM_PASSWORD_FILE = STATE / "secrets" / "kafka_scram_password"
DAYS = 3650


@dataclass(frozen=True)
class Files:
    """The PEM files of one stack's TLS (server_store: the server's key then its certificate chain, the
    broker's PEM keystore)."""

    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    server_store: Path
    client_cert: Path
    client_key: Path


TLS_DIR = STATE / "tls"
FILES = Files(TLS_DIR, *(TLS_DIR / name for name in ("ca.pem", "server.pem", "server.key", "server-store.pem",
                                                     "client.pem", "client.key")))


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=FILES.dir)


def _signed(name: str, subject: str, extensions: str) -> None:
    """`<name>.key` and `<name>.pem` (PKCS#8 key, certificate signed by the stack's CA)."""
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", f"{name}.key")
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr")
    (FILES.dir / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", str(DAYS), "-sha256", "-extfile", f"{name}.ext", "-out", f"{name}.pem")


def ensure() -> Files:
    """The stack's CA, server and client certificates, made the first time."""
    if FILES.server_store.exists():
        return FILES
    FILES.dir.mkdir(parents=True, exist_ok=True)
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "ca.key")
    _openssl("req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=oncewatch dev stack CA", "-days", str(DAYS),
             "-sha256", "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
             "-out", "ca.pem")
    _signed("server", f"/CN={SERVER_NAME}", f"subjectAltName=DNS:{SERVER_NAME}\nextendedKeyUsage=serverAuth\n")
    _signed("client", "/CN=oncewatch", "extendedKeyUsage=clientAuth\n")
    FILES.server_store.write_text(FILES.server_key.read_text() + FILES.server_cert.read_text()
                                  + FILES.ca.read_text())
    for key in FILES.dir.glob("*.key"):
        key.chmod(0o600)
    log(f"made the stack's CA and certificates in {FILES.dir}")
    return FILES


def mariadb_properties() -> str:
    """MariaDB's my.cnf lines for TLS with the stack's certificates."""
    files = ensure()
    return f"ssl_ca={files.ca}\nssl_cert={files.server_cert}\nssl_key={files.server_key}\n"


def mariadb_users(monitor: str, password: str, schemas: tuple[str, ...] | list[str]) -> str:
    """SQL for X509_USER: the monitor's grants and password, and a client certificate required (REQUIRE X509)."""
    grants = "".join(f"GRANT SELECT ON `{s}`.* TO '{X509_USER}'@'127.0.0.1';" for s in schemas)
    return (f"CREATE USER IF NOT EXISTS '{X509_USER}'@'127.0.0.1' IDENTIFIED BY '{password}' REQUIRE X509;"
            f"ALTER USER '{X509_USER}'@'127.0.0.1' IDENTIFIED BY '{password}' REQUIRE X509;"
            f"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{X509_USER}'@'127.0.0.1';{grants}")


def unsecured_token(lifetime_seconds: float) -> str:
    """An OAUTHBEARER token the broker's default (unsecured, alg none) validator takes while it has not expired."""
    def part(claims: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()

    now = int(time.time())
    return f"{part({'alg': 'none'})}.{part({'sub': 'oncewatch', 'iat': now, 'exp': now + int(lifetime_seconds)})}."


def scram_password() -> str:
    return secret_file(SCRAM_PASSWORD_FILE)


def kafka_properties() -> str:
    """The broker's lines for its secured listeners (devservices.broker.kafka_config adds the listeners)."""
    files = ensure()
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    oauth = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
    return f"""sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256,OAUTHBEARER
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={scram}
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config={scram}
listener.name.sasl_ssl.oauthbearer.sasl.jaas.config={oauth}
ssl.keystore.type=PEM
ssl.keystore.location={files.server_store}
ssl.truststore.type=PEM
ssl.truststore.location={files.ca}
listener.name.ssl.ssl.client.auth=required
"""


def listeners() -> tuple[str, str, str]:
    """(listeners, advertised listeners, protocol map) entries of the secured listeners."""
    return (f"SASL_SSL://{HOST}:{KAFKA_SASL_SSL_PORT},SSL://{HOST}:{KAFKA_SSL_PORT}",
            f"SASL_SSL://{SERVER_NAME}:{KAFKA_SASL_SSL_PORT},SSL://{SERVER_NAME}:{KAFKA_SSL_PORT}",
            "SASL_SSL:SASL_SSL,SSL:SSL")


def ensure_scram_user() -> None:
    """The SCRAM user, both mechanisms, its password from SCRAM_PASSWORD_FILE (set again at every start)."""
    from kafka.admin import KafkaAdminClient, ScramMechanism, UserScramCredentialUpsertion

    admin = KafkaAdminClient(bootstrap_servers=f"{HOST}:{KAFKA_PORT}", request_timeout_ms=10000,
                             client_id="devstack-scram")
    try:
        for mechanism in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512):  # one per request, says Kafka
            error = admin.alter_user_scram_credentials([
                UserScramCredentialUpsertion(SCRAM_USER, mechanism, scram_password())]).get(SCRAM_USER)
            if error:
                raise StackError(f"could not set the SCRAM user {SCRAM_USER} ({mechanism.name}): {error}")
    finally:
        admin.close()
