"""Warnings for a setup that shows more than it should: a secret file that others on the machine may
read, a listener reachable from other machines (docs/architecture.md §8: listeners bind to 127.0.0.1 unless
configured otherwise).

Neither is refused: a shared group or a dashboard behind a firewall can be meant. Each is a
warning that names the place and the fix; callers log it (`log`) and show it where they can.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from oncewatch.core.config import Config

SECRET_FILE_OPEN = "secret_file_open"
LISTENER_NOT_LOOPBACK = "listener_not_loopback"


@dataclass(frozen=True)
class Exposure:
    event: str  # the log's event name
    message: str  # what is exposed and how to fix it
    facts: dict[str, str]  # the log's fields: a path, a mode, a host; never a secret


def is_loopback(host: str | None) -> bool:
    """True for localhost and loopback addresses; a name or an empty host ('every interface') is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


def listener(host: str | None, what: str, fix: str) -> Exposure | None:
    """`what` (e.g. "/metrics") listening on `host`: a warning unless it is loopback."""
    if is_loopback(host):
        return None
    where = host or "every interface"
    return Exposure(LISTENER_NOT_LOOPBACK,
                    f"{what} listens on {where}, so other machines can reach it; {fix}",
                    {"listener": what, "host": where})


def secret_file(path: str | Path, what: str) -> Exposure | None:
    """The secret file `what` names: a warning when its group or others have any access to it."""
    try:
        mode = os.stat(path).st_mode & 0o777
    except OSError:  # whoever reads the secret says why it cannot
        return None
    if not mode & 0o077:
        return None
    return Exposure(SECRET_FILE_OPEN,
                    f"{what} {path} is open to its group or others (mode {mode:o}); "
                    f"`chmod 600 {path}` so that only its owner can read it",
                    {"path": str(path), "mode": f"{mode:o}"})


def of_config(cfg: Config) -> list[Exposure]:
    """The monitor's: its /metrics listener and the secret files its config names."""
    found = [listener(cfg.metrics.host, "/metrics", "set [metrics] host = \"127.0.0.1\" unless Prometheus "
                      "scrapes from another machine, and then firewall the port")
             if cfg.metrics.port else None]
    secrets = [("mysql.password_file", cfg.mysql.password), ("export.mask_key_file", cfg.export.mask_key)]
    if cfg.attest is not None:
        secrets.append(("attest.key_file", cfg.attest.key))
    for key, secret in secrets:
        if secret.file:
            found.append(secret_file(secret.file, key))
    return [e for e in found if e]


def log(logger: logging.Logger, exposures: list[Exposure]) -> None:
    for e in exposures:
        logger.warning(e.message, extra={"event": e.event, **e.facts})
