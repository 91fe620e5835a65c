"""Reading one TOML table with errors that name the dotted key, and secrets that are never inline.

`Section` hands out typed values and remembers which keys were asked for, so `done()` can refuse
the unknown ones (a misspelt key never falls back to a default silently). `Secret` says where a
secret comes from (an environment variable or a file); its value is read only when needed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MASK = "********"


class ConfigError(ValueError):
    """The config file is wrong; the message names the key and what to change."""


# ---------------------------------------------------------------- reading helpers

BYTE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20,
              "gib": 2**30, "tib": 2**40}


class Section:
    """A view of one TOML table that tracks the keys it was asked for, to reject unknown ones."""

    def __init__(self, data: Any, path: str):
        if not isinstance(data, dict):
            raise ConfigError(f"{path or 'the file'}: expected a table, got {type(data).__name__}")
        self.data = data
        self.path = path
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def _get(self, name: str, default: Any, required: bool) -> Any:
        self.used.add(name)
        if name not in self.data:
            if required:
                raise ConfigError(f"{self.key(name)}: missing (required)")
            return default
        return self.data[name]

    def str(self, name: str, default: str | None = None, *, required: bool = False,
            choices: tuple[str, ...] | None = None) -> str:
        value = self._get(name, default, required)
        if not isinstance(value, str) or (required and not value):
            raise ConfigError(f"{self.key(name)}: expected a non-empty string, got {value!r}")
        if choices and value not in choices:
            raise ConfigError(f"{self.key(name)}: must be one of {', '.join(choices)}, got {value!r}")
        return value

    def bool(self, name: str, default: bool) -> bool:
        value = self._get(name, default, False)
        if not isinstance(value, bool):
            raise ConfigError(f"{self.key(name)}: expected true or false, got {value!r}")
        return value

    def opt_str(self, name: str) -> str | None:
        value = self._get(name, None, False)
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{self.key(name)}: expected a string, got {value!r}")
        return value

    def int(self, name: str, default: int | None = None, *, required: bool = False,
            minimum: int | None = None, maximum: int | None = None) -> int:
        value = self._get(name, default, required)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{self.key(name)}: expected an integer, got {value!r}")
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            bounds = (f"between {minimum} and {maximum}" if minimum is not None and maximum is not None
                      else f"at least {minimum}" if minimum is not None else f"at most {maximum}")
            raise ConfigError(f"{self.key(name)}: must be {bounds}, got {value}")
        return value

    def float(self, name: str, default: float | None = None, *, required: bool = False,
              minimum: float = 0.0) -> float:
        value = self._get(name, default, required)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigError(f"{self.key(name)}: expected a number, got {value!r}")
        if value < minimum:
            raise ConfigError(f"{self.key(name)}: must be at least {minimum}, got {value}")
        return float(value)

    def size(self, name: str, default: int, *, minimum: int, why: str) -> int:
        """A size in bytes: an integer, or a number and a unit ("50 MiB", "2 GB"); 0 is none, else at least
        `minimum` (`why` says why, in the error)."""
        value = self._get(name, default, False)
        size: float | None = None
        if isinstance(value, int) and not isinstance(value, bool):
            size = value
        elif isinstance(value, str) and (m := re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", value)):
            unit = BYTE_UNITS.get(m[2].lower() or "b")
            size = None if unit is None else float(m[1]) * unit
        if size is None:
            raise ConfigError(f"{self.key(name)}: expected a size in bytes, an integer or a number and a unit "
                              f"(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), got {value!r}")
        if size and size < minimum:
            raise ConfigError(f"{self.key(name)}: at least {minimum / 2**20:g} MiB ({why}), or 0 for none; got {value!r}")
        return int(size)

    def str_list(self, name: str, default: list[str] | None = None, *, required: bool = False,
                 nonempty: bool = False) -> tuple[str, ...]:
        value = self._get(name, default if default is not None else [], required)
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f"{self.key(name)}: expected a list of non-empty strings, got {value!r}")
        if nonempty and not value:
            raise ConfigError(f"{self.key(name)}: must list at least one entry")
        return tuple(value)

    def names(self, name: str, *, required: bool = False) -> tuple[str, ...]:
        """One name or a list of them: a column or the columns of a composite key (in key order)."""
        value = self._get(name, None, required)
        if value is None:
            return ()
        if isinstance(value, str) and value:
            return (value,)
        if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
            if len(set(value)) != len(value):
                raise ConfigError(f"{self.key(name)}: a column is listed twice in {value!r}")
            return tuple(value)
        raise ConfigError(f"{self.key(name)}: expected a name or a non-empty list of names (a composite key), "
                          f"got {value!r}")

    def scale(self, name: str = "amount_scale") -> int:
        """A power of ten an amount is divided by (100: the values are cents of the unit), so amounts stored in
        different units compare exactly."""
        value = self.int(name, 1, minimum=1)
        if str(value).rstrip("0") != "1":
            raise ConfigError(f"{self.key(name)}: must be a power of ten (1, 10, 100, 1000, ...) so that amounts "
                              f"convert exactly, got {value}")
        return value

    def str_map(self, name: str) -> dict[str, str]:
        """A table of names to names (aliases)."""
        value = self.table(name)
        for k, v in value.items():
            if not isinstance(v, str) or not v:
                raise ConfigError(f"{self.key(name)}.{k}: expected a non-empty string, got {v!r}")
        return dict(value)

    def section(self, name: str, *, required: bool = False) -> Section:
        return Section(self._get(name, {}, required), self.key(name))

    def sections(self, name: str) -> list[Section]:
        value = self._get(name, [], False)
        if not isinstance(value, list):
            raise ConfigError(f"{self.key(name)}: expected an array of tables ([[{self.key(name)}]])")
        return [Section(v, f"{self.key(name)}[{i}]") for i, v in enumerate(value)]

    def table(self, name: str) -> dict[str, Any]:
        value = self._get(name, {}, False)
        if not isinstance(value, dict):
            raise ConfigError(f"{self.key(name)}: expected a table, got {value!r}")
        return value

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise ConfigError(f"{self.key(unknown[0])}: unknown key (misspelt? see README 'Configuration')")


def existing_file(s: Section, name: str, base: Path) -> str | None:
    """The optional key `name` naming a file (relative to the config's folder), which must exist."""
    value = s.opt_str(name)
    if value is None:
        return None
    path = Path(value) if Path(value).is_absolute() else (base / value).resolve()
    if not path.is_file():
        raise ConfigError(f"{s.key(name)}: no such file {str(path)!r}")
    return str(path)


def qualified_table(value: str, key: str) -> str:
    """'schema.table', either part may be a pattern (oncewatch.core.tables)."""
    if value.count(".") != 1 or not all(value.split(".")):
        raise ConfigError(f"{key}: expected 'schema.table', got {value!r} (a pattern such as "
                          f"'shop_*.pay_order_*' stands for every shard it matches)")
    return value


# ---------------------------------------------------------------- secrets

@dataclass(frozen=True)
class Secret:
    """Where a secret comes from; the value is read when needed and never printed."""

    env: str | None = None
    file: str | None = None
    key: str = "password"  # the dotted key it was given by, less its _env/_file, for errors

    @property
    def given(self) -> bool:
        return bool(self.env or self.file)

    def value(self) -> str:
        if self.env:
            if self.env not in os.environ:
                raise ConfigError(f"environment variable {self.env} is not set (named by {self.key}_env)")
            return os.environ[self.env]
        if self.file:
            try:
                return Path(self.file).read_text().strip()
            except OSError as exc:
                raise ConfigError(f"{self.key}_file {self.file}: cannot read it ({exc.strerror})") from exc
        return ""

    def __repr__(self) -> str:
        return f"Secret(env={self.env!r}, file={self.file!r})"


def read_secret(s: Section, base: Path, name: str = "password") -> Secret:
    """The secret `name` of a section, given as `{name}_env` or `{name}_file`, never inline."""
    if name in s.data:
        s.used.add(name)
        raise ConfigError(f"{s.key(name)}: secrets are not read from the config file; "
                          f"use {name}_env = \"VAR\" or {name}_file = \"/path\"")
    env, file = s.opt_str(f"{name}_env"), s.opt_str(f"{name}_file")
    if env and file:
        raise ConfigError(f"{s.key(name + '_env')}: give {name}_env or {name}_file, not both")
    if file and not Path(file).is_absolute():
        file = str((base / file).resolve())
    return Secret(env=env, file=file, key=s.key(name))
