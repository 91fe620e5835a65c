"""The lifecycle every running part of a group instance shares (issue 44): the router, the judges, the offsets
poller.

A part is configured by its constructor, which connects nothing (a part can be made, looked at and thrown away
with every server away); `start()` opens what it reads and writes and runs it in a thread of its own; `stop()` ends
that thread and waits for it, which closes what it opened; `status()` says how it stands, as a typed value
(core.protocol). An error that ends a part's thread is handed to the `failed` callback its owner gave it (the
member, which stops the instance, loudly): no part dies silently.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable

Failed = Callable[[str, BaseException], None]
# A running part that has not gone round its loop for this long is stuck: its owner says where (`stuck`).
STUCK_SECONDS = 60.0


class GroupPart:
    """A part's thread and stop signal; subclasses give `name`, `_open`, `_run` and `_close`."""

    name = "part"

    def __init__(self, failed: Failed):
        self._failed = failed
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.lapped = time.monotonic()  # when its thread last went round its loop (`lap`)
        self._said_stuck = False

    def start(self) -> None:
        """What the part reads and writes opened (in this thread: an error here is the caller's), then its work in
        a thread of its own."""
        try:
            self._open()
        except BaseException:
            self._close()  # what was opened before the error
            raise
        self.lap()
        self._thread = threading.Thread(target=self._guarded, name=f"group-{self.name}", daemon=True)
        self._thread.start()

    def ask_stop(self) -> None:
        """Its thread asked to end (several parts are asked at once, then each `stop`ped)."""
        self._stopping.set()

    def stop(self) -> None:
        """Its thread ended, and what it opened closed; a part never started has nothing to stop."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def lap(self) -> None:
        """Its thread went round its loop (each part's `_run` says so at every round)."""
        self.lapped, self._said_stuck = time.monotonic(), False

    def stuck(self, now: float) -> str | None:
        """Where its thread stands (its stack, the innermost call first), when it runs and has not gone round its
        loop for STUCK_SECONDS (`now`: time.monotonic()); once, until it goes round again."""
        thread = self._thread
        if thread is None or not thread.is_alive() or self._said_stuck or now - self.lapped < STUCK_SECONDS:
            return None
        self._said_stuck = True
        frame = sys._current_frames().get(thread.ident or 0)
        return "".join(reversed(traceback.format_stack(frame))) if frame is not None else "(no frame)"

    def _guarded(self) -> None:
        try:
            self._run(self._stopping)
        except BaseException as exc:  # noqa: BLE001 - any failure is the owner's to act on, said there
            self._failed(self.name, exc)
        finally:
            self._close()

    def _open(self) -> None:
        """Connect what the part needs (the default: nothing)."""

    def _run(self, stop: threading.Event) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        """Close what `_open` opened, some of it or all (the default: nothing)."""
