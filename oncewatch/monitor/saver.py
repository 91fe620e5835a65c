"""Who writes the judge's checkpoints (oncewatch.monitor.checkpoints) into the store (`[store] writer`): the judge
itself (`InlineSaver`, the default), or a process of its own (`ProcessSaver`, "process"), so that the judge goes on
with the rules while a checkpoint is written (docs/architecture.md §9). The second costs about a sixth more CPU in
all, the checkpoints crossing pickled, and halves the judge's CPU a record: it pays most on a machine with cores to
spare (README, [store]).

At most one checkpoint is in flight. The judge never reads a state older than the one it handed on: the engine's
spilled state read back from the store is read through the delta in flight (`handed`, engine_state.ColdEntries),
and the judge's other uses of the store wait for it to be written first (`settle`): the engine's rarer drops,
retention and the disk budget. So the two never write the same rows at once. What is written is one transaction
either way, so a kill -9 of the monitor (the writer's process dies with it) resumes from the last checkpoint
written, as before.

A failure to write is raised in the judge at its next use of the saver, with the writer's traceback
(`remote_traceback`), and the writer's process ends: the monitor stops as it would have on the failed write itself
(oncewatch.monitor.supervise decides what follows). A writer's process that dies without a word raises
`SaverDiedError`, and the supervisor starts the monitor again from the last checkpoint written, counting it.
"""

from __future__ import annotations

import logging
import os
import traceback
from multiprocessing.connection import Connection
from typing import Any

from oncewatch.checks.settings import Settings
from oncewatch.core import forkserver
from oncewatch.core.config import Config
from oncewatch.monitor.checkpoints import Checkpoint, write
from oncewatch.monitor.entities import EntityIndex
from oncewatch.monitor.remote import as_child, how_it_ended, log_levels, sendable
from oncewatch.store import Store, StoreError

log = logging.getLogger(__name__)

NAME = "store"  # the writer's process is `ow-store` in ps and top, and its part's name in the CPU per part
STOP_SECONDS = 10.0  # what the writer's process is given to end once the last checkpoint is written


class SaverDiedError(StoreError):
    """The store's writer process ended without a word (killed, out of memory): the checkpoint in flight is lost."""


class InlineSaver:
    """Writes each checkpoint at once, in the caller's process."""

    def __init__(self, store: Store, index: EntityIndex, within_seconds: float):
        self.store = store
        self.index = index
        self.within_seconds = within_seconds
        self._changed = False
        self.pid: int | None = None

    def start(self) -> None:
        pass

    def save(self, cp: Checkpoint) -> None:
        with self.store.batch() as tx:
            self._changed = write(tx, cp, self.index, self.within_seconds) or self._changed

    def settle(self, block: bool = True) -> None:
        """Nothing is ever in flight here."""

    def handed(self) -> dict[str, Any] | None:
        return None

    def changed(self) -> bool:
        """Whether a checkpoint written since the last call changed a finding."""
        changed, self._changed = self._changed, False
        return changed

    def stop(self) -> None:
        pass


class ProcessSaver:
    """Writes the checkpoints in a process of its own, forked from the forkserver (oncewatch.core.forkserver), over
    its own connection to the store; configured here, started by `start`."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self._conn: Connection | None = None
        self._process: Any = None
        self._in_flight: Checkpoint | None = None
        self._changed = False
        self.pid: int | None = None

    def start(self) -> None:
        context = forkserver.context()
        self._conn, child = context.Pipe(duplex=True)
        self._process = context.Process(target=_writer, name=f"oncewatch-{NAME}", daemon=True,
                                        args=(self.cfg, child, os.getpid(), log_levels()))
        self._process.start()
        self.pid = self._process.pid
        child.close()
        log.info("store writer process started", extra={"event": "store_writer_started", "pid": self.pid})

    def save(self, cp: Checkpoint) -> None:
        """`cp` handed on once the checkpoint before it is written."""
        self.settle()
        assert self._conn is not None, "start() first"
        try:
            self._conn.send(cp)
        except OSError:
            raise self._died() from None
        self._in_flight = cp

    def handed(self) -> dict[str, Any] | None:
        """The engine's state delta of the checkpoint in flight, None when none is (engine_state.ColdEntries)."""
        return self._in_flight.delta if self._in_flight is not None else None

    def settle(self, block: bool = True) -> None:
        """Wait for the checkpoint in flight to be written (`block=False`: only look whether it is). Raises what
        writing it raised."""
        if self._in_flight is not None and self._conn is not None:
            while not self._conn.poll(1.0 if block else 0):
                if not block:
                    break
                if not self._process.is_alive() and not self._conn.poll(0):
                    raise self._died()
            else:
                try:
                    outcome, value = self._conn.recv()
                except (EOFError, OSError):
                    raise self._died() from None
                self._in_flight = None
                if outcome == "failed":
                    raise value
                self._changed = self._changed or value

    def changed(self) -> bool:
        """Whether a checkpoint written since the last call changed a finding."""
        changed, self._changed = self._changed, False
        return changed

    def stop(self) -> None:
        """The writer's process ended, once what is in flight is written (a clean stop) or as it is (a failure)."""
        process, conn = self._process, self._conn
        if process is None or conn is None:
            return
        try:
            conn.send(None)
        except OSError:
            pass
        process.join(STOP_SECONDS)
        if process.is_alive():
            log.warning("the store's writer process did not end when asked: killed",
                        extra={"event": "store_writer_killed", "pid": process.pid})
            process.kill()
            process.join(STOP_SECONDS)
        conn.close()
        self._process = self._conn = None

    def _died(self) -> SaverDiedError:
        how = how_it_ended(self._process)
        return SaverDiedError(f"the store's writer process (pid {self.pid}) ended without a word ({how}): the "
                              f"checkpoint it was writing is lost, and the monitor resumes from the one before")


def _writer(cfg: Config, conn: Connection, monitor: int, levels: dict[str, int]) -> None:
    """The writer's process: each checkpoint received written in one transaction, and said so."""
    as_child(NAME, monitor, levels)
    store = Store(cfg.store.target)
    index = EntityIndex(Settings.from_config(cfg))
    try:
        while True:
            try:
                cp = conn.recv()
            except (EOFError, OSError):
                return
            if cp is None:
                return
            try:
                with store.batch() as tx:
                    changed = write(tx, cp, index, cfg.slo.within_seconds)
            except BaseException as exc:  # noqa: BLE001 - every failure goes to the judge, which raises it
                conn.send(("failed", sendable(exc, traceback.format_exc())))
                return
            conn.send(("ok", changed))
    finally:
        store.close()


__all__ = ["InlineSaver", "ProcessSaver", "SaverDiedError"]
