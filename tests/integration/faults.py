"""A bug injected into a reader's collector, wherever the collector runs.

The offsets poller runs in a thread of the monitor, where a monkeypatch of its class reaches it. The binlog tail and
the Kafka events run in processes of their own, started from the forkserver (oncewatch.monitor.remote), which see
none of the test's monkeypatches: there the bug travels in the part's spec (`Faulty`, pickled to the child with
it), and its calls are counted in shared memory made for the forkserver's children (`Strike`), so the test sees
the calls of every process, a restarted reader's included.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass
from typing import Any

import pytest

from oncewatch.core import forkserver
from oncewatch.core.protocol import Part
from oncewatch.monitor import loop
from oncewatch.monitor.remote import Build


class InjectedBug(Exception):
    """Not a collector error type: what a bug in a reader raises."""


class Strike:
    """The calls of the injected method, and when it first raised (set once), in every process."""

    def __init__(self) -> None:
        shared = forkserver.context()
        self.raised = shared.Event()
        self._at = shared.Value("d", 0.0)
        self.calls = shared.Value("i", 0)

    @property
    def at(self) -> float:
        return self._at.value

    def call(self) -> int:
        with self.calls.get_lock():
            self.calls.value += 1
            return self.calls.value

    def strike(self) -> None:
        with self._at.get_lock():
            if not self.raised.is_set():
                self._at.value = time.monotonic()
                self.raised.set()


@dataclass(frozen=True)
class Bug:
    """`cls.method` raises InjectedBug on its `nth` call, and with `every_time` on every call after; `message`
    names it in the exception (default: where and which call)."""

    cls: type
    method: str
    nth: int = 1
    every_time: bool = False
    message: str = ""

    def strikes(self, calls: int) -> bool:
        return calls == self.nth or (self.every_time and calls > self.nth)

    def wrap(self, original: Any, strike: Strike) -> Any:
        """`original` (a function or a bound method) with the bug in front of it."""
        def failing(*args: Any, **kwargs: Any) -> Any:
            calls = strike.call()
            if self.strikes(calls):
                strike.strike()
                raise InjectedBug(self.message or f"injected into {self.cls.__name__}.{self.method}, call {calls}")
            return original(*args, **kwargs)
        return failing


@dataclass(frozen=True)
class Faulty:
    """A reader's part spec whose part carries `bug`: built in the reader's process from the pickled spec."""

    spec: Build
    bug: Bug
    strike: Strike

    def __call__(self, ahead: Any) -> Part:
        part = self.spec(ahead)
        setattr(part, self.bug.method, self.bug.wrap(getattr(part, self.bug.method), self.strike))
        return part


def inject(monkeypatch: pytest.MonkeyPatch, reader: str, bug: Bug) -> Strike:
    """`bug` in the collector of `reader` (oncewatch.core.names): in its class, for a reader in the monitor's own
    thread, and in its part's spec, for a reader in a process of its own."""
    strike = Strike()
    original = loop.remote

    def remote(name: str, build: Build, ahead: Any = None) -> Any:
        return original(name, Faulty(build, bug, strike) if name == reader else build, ahead)

    monkeypatch.setattr(loop, "remote", remote)
    monkeypatch.setattr(bug.cls, bug.method, bug.wrap(getattr(bug.cls, bug.method), strike))
    return strike


__all__ = ["Bug", "Faulty", "InjectedBug", "Strike", "inject"]
