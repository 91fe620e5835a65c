"""What the engine needs of a loaded config: the shop's shape, the announcements, the thresholds."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from oncewatch.core.config import Config
from oncewatch.core.domain import Announce, Domain, Rules
from oncewatch.core.tables import Watched


@dataclass(frozen=True)
class Settings:
    """Everything the engine needs, taken from a loaded `Config`."""

    domain: Domain
    announce: tuple[Announce, ...]
    rules: Rules
    # mysql.tables, in order: which entry a real table falls under where patterns overlap (the first listed);
    # empty: the tables the domain and the announcements name
    tables: tuple[str, ...] = ()
    # [cdc] mode = "check": the CDC topics' transactions are lined up with the binlog's (checks.pipeline)
    cdc_check: bool = False

    @cached_property
    def watched(self) -> Watched:
        """Which entry a real table falls under, for every part of the engine and the monitor alike."""
        d = self.domain
        named = [t.table for t in (d.orders, d.payments, d.callbacks, *d.effects) if t is not None]
        return Watched(self.tables or dict.fromkeys([*named, *(a.table for a in self.announce)]))

    @classmethod
    def from_config(cls, cfg: Config) -> Settings:
        return cls(domain=cfg.domain, announce=cfg.announce, rules=cfg.rules, tables=cfg.mysql.tables,
                   cdc_check=cfg.cdc is not None and cfg.cdc.mode == "check")
