"""The monitor process: preflight, readers, the writer, health and the loop that wires them.

    preflight.py  the sources answer and are set up as the monitor needs
    readers.py    each reading part (core.protocol.Part) in a thread, loud and bounded restarts
    writer.py     engine and store fed in one transaction per batch, checkpoints included
    entities.py   the drill-down keys stored beside every record
    health.py     caught-up verdicts and the health rows behind /metrics and the pages
    loop.py       Monitor: the main thread that runs them
    supervise.py  `oncewatch run`: a new Monitor from the checkpoint whenever the store's server went away
    garbage.py    the cycle collector's settings of each of the monitor's processes
"""

from oncewatch.monitor.entities import EntityIndex
from oncewatch.monitor.garbage import tune_gc
from oncewatch.monitor.loop import Monitor
from oncewatch.monitor.preflight import MonitorError, SourceUnavailableError
from oncewatch.monitor.readers import ReaderFailedError
from oncewatch.monitor.supervise import Supervisor

__all__ = ["EntityIndex", "Monitor", "MonitorError", "ReaderFailedError", "SourceUnavailableError", "Supervisor",
           "tune_gc"]
