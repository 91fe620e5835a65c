"""The cycle collector's settings of every process of the monitor: the judge's, its readers' and its store writer's.

Every record read allocates a handful of dicts that die within the batch, and the engine keeps a large, long-lived
state that every full collection walks. Almost none of it forms reference cycles, so reference counting frees it
and the cycle collector mostly finds nothing: running it far less often saves about a tenth of the cost of reading
a Kafka record (bench/kafka_ingest.py) and lets at most 50,000 young objects of cyclic garbage wait a little longer.
A process that receives batches pickled allocates their every object at once: under Python's defaults (a young
collection every 700 allocations) unpickling a checkpoint's state delta took three times as long.
"""

from __future__ import annotations

import gc

# Young generation collected every 50,000 allocations instead of 700, the whole heap a tenth as often.
GC_THRESHOLDS = (50_000, 20, 100)


def tune_gc() -> None:
    """This process's collector set as the monitor's (`oncewatch run` and each process it forks call it)."""
    gc.set_threshold(*GC_THRESHOLDS)


__all__ = ["GC_THRESHOLDS", "tune_gc"]
