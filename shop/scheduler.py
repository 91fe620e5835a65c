"""Timed jobs on a pool of worker threads, each with its own payment service (one connection).

Jobs run no earlier than their due time, in due order; how late the latest one started
(`max_late`) says whether the pool keeps up with the rate asked for. The first exception a
job raises stops the pool and is kept in `error` for the runner to raise.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable

from oncewatch.shop.service import PaymentService

Job = Callable[[PaymentService], None]


class Scheduler:
    def __init__(self, workers: int, make_service: Callable[[], PaymentService]):
        self._make_service = make_service
        self._heap: list[tuple[float, int, Job]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._stopping = False
        self.error: BaseException | None = None
        self.max_late = 0.0  # seconds; well above 0.2 the pool does not keep up with the rate
        self._threads = [threading.Thread(target=self._work, name=f"shop-worker-{i}", daemon=True)
                         for i in range(workers)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def at(self, due: float, job: Job) -> None:
        with self._cv:
            heapq.heappush(self._heap, (due, next(self._seq), job))
            self._cv.notify()

    def _next(self) -> Job | None:
        with self._cv:
            while not self._stopping:
                now = time.monotonic()
                if self._heap and self._heap[0][0] <= now:
                    due, _, job = heapq.heappop(self._heap)
                    self.max_late = max(self.max_late, now - due)
                    return job
                self._cv.wait(self._heap[0][0] - now if self._heap else None)
            return None

    def _work(self) -> None:
        try:
            service = self._make_service()
        except Exception as exc:  # noqa: BLE001 - kept for the runner, which stops the run
            self._fail(exc)
            return
        try:
            while (job := self._next()) is not None:
                job(service)
        except Exception as exc:  # noqa: BLE001 - same
            self._fail(exc)
        finally:
            service.close()

    def _fail(self, exc: BaseException) -> None:
        with self._cv:
            self.error = self.error or exc
            self._stopping = True
            self._cv.notify_all()

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        for thread in self._threads:
            thread.join(timeout=10)
