"""`[kafka]`'s security keys: how every Kafka client of the monitor authenticates and encrypts (issue 46).

Plain data checked at load, each mistake named by its key; the secrets (SASL password, key password) stay
`Secret`s, read when a client is made (oncewatch.collectors.kafka_client), never printed. The token of
OAUTHBEARER is a file, re-read whenever it changes, so whatever renews it needs no restart of the monitor.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from oncewatch.core.sections import ConfigError, Secret, Section, existing_file, read_secret

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
SASL_KEYS = ("sasl_mechanism", "sasl_username", "sasl_password_env", "sasl_password_file", "sasl_oauth_token_file")
SSL_KEYS = ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_key_password_env", "ssl_key_password_file",
            "ssl_check_hostname")


@dataclass(frozen=True)
class KafkaSecurity:
    protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: Secret = Secret(key="kafka.sasl_password")
    sasl_oauth_token_file: str | None = None
    ssl_cafile: str | None = None  # None: the system's CAs
    ssl_certfile: str | None = None  # a client certificate: mutual TLS
    ssl_keyfile: str | None = None
    ssl_key_password: Secret = Secret(key="kafka.ssl_key_password")
    ssl_check_hostname: bool = True

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol.endswith("SSL")


def _only_for(s: Section, keys: tuple[str, ...], what: str, protocol: str) -> None:
    for name in keys:
        if name in s.data:
            raise ConfigError(f"{s.key(name)}: only for security_protocol {what}, and it is {protocol}")


def parse(s: Section, base: Path) -> KafkaSecurity:
    """The security keys of the `[kafka]` section `s` (its other keys are config._kafka's)."""
    protocol = s.str("security_protocol", "PLAINTEXT", choices=PROTOCOLS)
    out = KafkaSecurity(protocol)
    if out.sasl:
        mechanism = s.str("sasl_mechanism", required=True, choices=MECHANISMS)
        username, password = s.opt_str("sasl_username"), read_secret(s, base, "sasl_password")
        token = existing_file(s, "sasl_oauth_token_file", base)
        if mechanism == "OAUTHBEARER":
            if token is None:
                raise ConfigError(f"{s.key('sasl_oauth_token_file')}: missing (required for OAUTHBEARER: a file "
                                  f"holding the token, re-read when it changes)")
            for name, given in (("sasl_username", username), ("sasl_password_env", password.given)):
                if given:
                    raise ConfigError(f"{s.key(name)}: not for OAUTHBEARER (its token file says who it is)")
        else:
            if not username:
                raise ConfigError(f"{s.key('sasl_username')}: missing (required for {mechanism})")
            if not password.given:
                raise ConfigError(f"{s.key('sasl_password_env')}: missing: give sasl_password_env or "
                                  f"sasl_password_file (required for {mechanism})")
            if token is not None:
                raise ConfigError(f"{s.key('sasl_oauth_token_file')}: only for sasl_mechanism OAUTHBEARER")
        out = KafkaSecurity(protocol, mechanism, username, password, token)
    else:
        _only_for(s, SASL_KEYS, "SASL_PLAINTEXT or SASL_SSL", protocol)
    if not out.tls:
        _only_for(s, SSL_KEYS, "SSL or SASL_SSL", protocol)
        return out
    certfile, keyfile = existing_file(s, "ssl_certfile", base), existing_file(s, "ssl_keyfile", base)
    key_password = read_secret(s, base, "ssl_key_password")
    if keyfile and not certfile:
        raise ConfigError(f"{s.key('ssl_certfile')}: missing: ssl_keyfile is the key of a client certificate")
    if key_password.given and not (keyfile or certfile):
        raise ConfigError(f"{s.key('ssl_key_password_env')}: there is no ssl_keyfile or ssl_certfile to unlock")
    return KafkaSecurity(out.protocol, out.sasl_mechanism, out.sasl_username, out.sasl_password,
                         out.sasl_oauth_token_file, existing_file(s, "ssl_cafile", base), certfile, keyfile, key_password,
                         s.bool("ssl_check_hostname", True))
