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
    # mysql.tables, in order: which entry a real table falls under where patterns overlap (the first listed);
    # empty: the tables the domain and the announcements name
    tables: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, cfg: Config) -> Settings:
        return cls(domain=cfg.domain, announce=cfg.announce, rules=cfg.rules, tables=cfg.mysql.tables)
