"""What the engine needs of a loaded config: the shop's shape, the announcements, the thresholds."""

from __future__ import annotations

from dataclasses import dataclass

from oncewatch.core.config import Config
from oncewatch.core.domain import Announce, Domain, Rules


@dataclass(frozen=True)
class Settings:
    """Everything the engine needs, taken from a loaded `Config`."""

    domain: Domain
    announce: tuple[Announce, ...]
    rules: Rules

    @classmethod
    def from_config(cls, cfg: Config) -> Settings:
        return cls(domain=cfg.domain, announce=cfg.announce, rules=cfg.rules)
