"""What every Kafka client of the monitor is made with: the brokers and `[kafka]`'s security (issue 46).

`connection()` is the one place a client's bootstrap servers, protocol, SASL and TLS settings come from: the
events consumer and admin, the offsets poller, the CDC consumer, a group's router, judges and lease all take it,
so a secured cluster is reached by all of them or by none. `refusal()` turns a client that could not bootstrap
into what to fix: kafka-python says only "Unable to bootstrap" and logs the broker's reason, which is caught
here and put in a message that names the config key.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kafka import errors as kerrors
from kafka.net.sasl.oauth import AbstractTokenProvider

from oncewatch.core.config import KafkaConfig
from oncewatch.core.kafka_security import KafkaSecurity

# kafka-python logs each failed bootstrap connection here, with the exception as the second argument.
BOOTSTRAP_LOGGER = "kafka.net.manager"
DISCONNECTED = "socket disconnected"  # kafka-python's words for a connection the broker closed
SASL_KEYS = "kafka.sasl_password_env / kafka.sasl_password_file (or kafka.sasl_username)"


class TokenFile(AbstractTokenProvider):
    """OAUTHBEARER's token, read from a file and read again whenever the file changes (whatever renews it
    writes it there)."""

    def __init__(self, path: str):
        super().__init__()
        self.path = Path(path)
        self._lock = threading.Lock()
        self._seen: tuple[int, int] | None = None
        self._token = ""

    def token(self) -> str:
        with self._lock:
            stat = self.path.stat()
            if (stat.st_mtime_ns, stat.st_size) != self._seen:
                self._token = self.path.read_text().strip()
                self._seen = (stat.st_mtime_ns, stat.st_size)
            return self._token


def security_settings(sec: KafkaSecurity) -> dict[str, Any]:
    """kafka-python's settings for `[kafka]`'s security keys; the secrets are read now."""
    out: dict[str, Any] = {"security_protocol": sec.protocol}
    if sec.sasl:
        out["sasl_mechanism"] = sec.sasl_mechanism
        if sec.sasl_mechanism == "OAUTHBEARER":
            out["sasl_oauth_token_provider"] = TokenFile(str(sec.sasl_oauth_token_file))
        else:
            out["sasl_plain_username"] = sec.sasl_username
            out["sasl_plain_password"] = sec.sasl_password.value()
    if sec.tls:
        out.update(ssl_cafile=sec.ssl_cafile, ssl_certfile=sec.ssl_certfile, ssl_keyfile=sec.ssl_keyfile,
                   ssl_password=sec.ssl_key_password.value() or None, ssl_check_hostname=sec.ssl_check_hostname)
    return out


def connection(cfg: KafkaConfig) -> dict[str, Any]:
    """The settings every client of the monitor starts from: where the brokers are and how to reach them."""
    return {"bootstrap_servers": list(cfg.bootstrap_servers), **security_settings(cfg.security)}


@contextmanager
def bootstrap_failures() -> Iterator[list[BaseException]]:
    """The exceptions of the bootstrap connections that fail meanwhile, as kafka-python logs them."""
    seen: list[BaseException] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            args = record.args if isinstance(record.args, tuple) else ()
            seen.extend(a for a in args if isinstance(a, BaseException))

    logger = logging.getLogger(BOOTSTRAP_LOGGER)
    handler = Catch(logging.WARNING)
    level = logger.level
    if not logger.isEnabledFor(logging.WARNING):
        logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield seen
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _reason(exc: BaseException) -> str:
    """The words of the broker or of the TLS layer, without kafka-python's wrapping and OpenSSL's source line."""
    text = str(exc.args[0]) if isinstance(exc, kerrors.KafkaError) and exc.args else str(exc)
    return re.sub(r"\s*\(_ssl\.c:\d+\)", "", text.removeprefix("Handshake failed: ")) or type(exc).__name__


def refusal(cfg: KafkaConfig, failures: list[BaseException]) -> tuple[str, str]:
    """(the config key to look at, the broker's or the TLS layer's reason) for a client that could not bootstrap,
    from the failures `bootstrap_failures` caught; the most telling failure wins (an authentication or TLS
    failure over the disconnects that follow it)."""
    sec = cfg.security
    login = SASL_KEYS if sec.sasl_mechanism != "OAUTHBEARER" else "kafka.sasl_oauth_token_file"
    for exc in failures:
        if isinstance(exc, kerrors.SaslAuthenticationFailedError):
            return login, _reason(exc)
    for exc in failures:
        text = str(exc).upper()
        if "CERTIFICATE_VERIFY_FAILED" in text:
            if "MISMATCH" in text or "HOSTNAME" in text:
                return "kafka.ssl_check_hostname (and the host names in kafka.bootstrap_servers)", _reason(exc)
            return "kafka.ssl_cafile", _reason(exc)
        if "ALERT_BAD_CERTIFICATE" in text or "CERTIFICATE_REQUIRED" in text:
            return ("kafka.ssl_certfile and kafka.ssl_keyfile (the broker wants a client certificate it trusts)",
                    _reason(exc))
        if "[SSL" in text:
            return "kafka.security_protocol (the TLS handshake failed: does the listener take TLS?)", _reason(exc)
    for exc in failures:
        if isinstance(exc, kerrors.UnsupportedSaslMechanismError) or "mechanism" in str(exc).lower():
            return "kafka.sasl_mechanism", _reason(exc)
    lost = [exc for exc in failures if isinstance(exc, kerrors.KafkaConnectionError)]
    if sec.sasl and lost and all(DISCONNECTED in str(exc) for exc in lost):
        # The broker answers a refused login and closes the connection at once; kafka-python 3.0.12 drops an
        # answer that comes in one read with the close (net/transport.py _read_from_sock), so the broker's
        # reason is often lost: what is left is a close right after the TLS handshake went through.
        return (f"{login} or kafka.sasl_mechanism",
                f"the broker closed the connection during the {sec.sasl_mechanism} login, as it does on a wrong "
                f"user name, password or token (its own words were lost with the close)")
    reason = _reason((lost or failures)[-1]) if failures else "no answer"
    return (f"kafka.security_protocol (the broker closed the connection: is the listener at "
            f"{', '.join(cfg.bootstrap_servers)} one for {sec.protocol}?) or kafka.bootstrap_servers"), reason

