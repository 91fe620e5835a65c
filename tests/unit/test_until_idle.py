"""`oncewatch run --until-idle N` ends N seconds after the last change once every reader has been alive that long:
each reader is looked at on every tick of the clock, not only once the rest holds (Monitor._idle_for).

Seen on the dev stack: `--until-idle 3` of a quiet shop took 13 s, `--until-idle 6` 25 s. A reader's time alive
(Reader.live_for) counts from the first look that finds its part alive, and the readers were looked at only once
nothing had changed for N seconds, so an audit waited out N twice and more; the suite runs one in most of its tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

from devservices.samples import shop_settings
from oncewatch.checks.engine import Engine
from oncewatch.monitor.inbox import Inbox
from oncewatch.monitor.loop import Monitor
from oncewatch.monitor.readers import Reader
from oncewatch.monitor.writer import Progress


class AlivePart:
    """A reader's part that reads nothing and says it is alive from the moment it starts, as a quiet source's does."""

    def __init__(self) -> None:
        self._alive_at: float | None = None

    def start(self) -> None:
        self._alive_at = time.time()

    def items(self, stop: threading.Event) -> Iterator[object]:
        stop.wait()
        return iter(())

    def alive_at(self) -> float | None:
        return self._alive_at

    def stop(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_quiet_monitor_is_idle_n_seconds_after_its_last_change_with_its_readers_alive_since_the_start():
    readers = {name: Reader(name, AlivePart, lambda item, stop: None) for name in ("binlog", "kafka_events")}
    for reader in readers.values():
        reader.start()
    try:
        started = time.time()
        while any(r.part.alive_at() is None for r in readers.values()):
            time.sleep(0.01)
        monitor = SimpleNamespace(progress=Progress(last_change_at=started, binlog_caught_up=True,
                                                    kafka_caught_up=True),
                                  queue=Inbox(100), readers=readers, engine=Engine(shop_settings()),
                                  _change_clock_moves=True, _waited=False)
        # The clock's ticks while the last change is under N seconds old: not idle, but each reader is seen alive.
        for tick in (0.5, 1.0, 2.0):
            assert not Monitor._idle_for(monitor, 3.0, started + tick)  # type: ignore[arg-type]
        # N seconds after the last change: idle, the readers alive for as long (seen at the first tick).
        assert Monitor._idle_for(monitor, 3.0, started + 3.6)  # type: ignore[arg-type]
        # A reader started again (a failure's restart) is not idle until it has been alive N seconds itself.
        readers["binlog"].stop()
        readers["binlog"].join(5)
        readers["binlog"].start()
        restarted = time.time()
        while readers["binlog"].part.alive_at() is None:
            time.sleep(0.01)
        assert not Monitor._idle_for(monitor, 3.0, restarted + 0.5)  # type: ignore[arg-type]
        assert not Monitor._idle_for(monitor, 3.0, restarted + 3.0)  # type: ignore[arg-type]
        assert Monitor._idle_for(monitor, 3.0, restarted + 3.6)  # type: ignore[arg-type]
    finally:
        for reader in readers.values():
            reader.stop()
            reader.join(5)
