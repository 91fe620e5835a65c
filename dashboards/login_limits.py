"""How many password tries the dashboard takes, per client address and from all of them together.

One limiter per server process (`LIMITER`), shared by every browser session: Streamlit runs each
session's script in a thread of one process, so a module-level object behind a lock sees every
try, where a delay inside a session was multiplied by opening more sessions (50 sessions gave 31
tries/s). The limits (`Limits()`):

- at most 5 tries per client address in any 60 s, and at most 30 from all addresses together;
- after 5 wrong passwords in a row from one address it is locked out for 30 s, doubling with each
  further wrong password up to 15 min (an address that keeps guessing gets about 4 tries an hour);
- the right password forgets the address's tries and failures; the tries from all addresses stay
  counted.

A refused try is not counted and never reaches the password check, so it tells nothing about the
password. The limit on all addresses together also means that someone guessing can keep the right
person out for as long as the guessing lasts: the price of a bound that does not depend on how
many addresses the guesser has.

Memory: an address is remembered only once one of its tries has been taken (at most 30 a minute)
and forgotten a day after its last one, so at most 43,200 addresses are held.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

# Where Streamlit does not know the client (a loopback connection, or a proxy in front): all such
# tries share one address, so they are limited together rather than not at all.
UNKNOWN = "unknown"
ADDRESS, SERVER = "address", "server"  # what a refusal is about


@dataclass(frozen=True)
class Limits:
    per_address: int = 5
    overall: int = 30
    window_seconds: float = 60.0
    lockout_after: int = 5
    lockout_first_seconds: float = 30.0
    lockout_max_seconds: float = 900.0
    forget_after_seconds: float = 86_400.0

    def lockout_seconds(self, failures: int) -> float:
        """How long `failures` wrong passwords in a row lock an address out (0: not at all)."""
        if failures < self.lockout_after:
            return 0.0
        doublings = min(failures - self.lockout_after, 32)  # 30 s * 2**32 is far past any cap
        return min(self.lockout_first_seconds * 2 ** doublings, self.lockout_max_seconds)


@dataclass(frozen=True)
class Refusal:
    """A try not taken: whose limit (ADDRESS or SERVER), and when the next one would be."""

    reason: str
    retry_after: float  # seconds
    failures: int  # wrong passwords in a row from this address so far
    refused: int  # tries refused in a row (of this address for ADDRESS, of all for SERVER), this one included


@dataclass(frozen=True)
class Failure:
    """A wrong password, counted."""

    failures: int  # wrong passwords in a row from this address, this one included
    retry_after: float  # seconds until this address may try again (0: at once)


@dataclass
class _Address:
    last: float
    tries: deque[float] = field(default_factory=deque)  # when its tries within the window were taken
    failures: int = 0
    locked_until: float = 0.0
    refused: int = 0


class LoginLimiter:
    """Call `admit` before checking a password, then `failed` or `succeeded` with its outcome."""

    def __init__(self, limits: Limits = Limits(), clock: Callable[[], float] = time.monotonic):
        self.limits = limits
        self._clock = clock
        self._lock = threading.Lock()
        self._addresses: OrderedDict[str, _Address] = OrderedDict()  # least recently tried first
        self._tries: deque[float] = deque()  # every address's tries within the window
        self._refused = 0  # tries refused in a row by the limit on all addresses

    def admit(self, address: str) -> Refusal | None:
        """Take a try from `address` (None), or say why not and for how long."""
        with self._lock:
            now = self._clock()
            self._expire(now)
            state = self._addresses.get(address)
            if state is not None:
                _drop_before(state.tries, now - self.limits.window_seconds)
                wait = self._blocked_for(state, now)
                if wait > 0:
                    state.refused += 1
                    return Refusal(ADDRESS, wait, state.failures, state.refused)
            if len(self._tries) >= self.limits.overall:
                self._refused += 1
                return Refusal(SERVER, self._tries[0] + self.limits.window_seconds - now,
                               state.failures if state else 0, self._refused)
            if state is None:
                state = self._addresses[address] = _Address(last=now)
            state.last, state.refused, self._refused = now, 0, 0
            self._addresses.move_to_end(address)
            state.tries.append(now)
            self._tries.append(now)
            return None

    def failed(self, address: str) -> Failure:
        """Count a wrong password from an address whose try was just admitted."""
        with self._lock:
            now = self._clock()
            state = self._addresses.setdefault(address, _Address(last=now))
            state.failures += 1
            lockout = self.limits.lockout_seconds(state.failures)
            if lockout:
                state.locked_until = now + lockout
            return Failure(state.failures, self._blocked_for(state, now))

    def succeeded(self, address: str) -> None:
        with self._lock:
            self._addresses.pop(address, None)

    def _blocked_for(self, state: _Address, now: float) -> float:
        """Seconds until `state`'s address may try again: its lockout, or its oldest try leaving the window."""
        by_rate = (state.tries[0] + self.limits.window_seconds - now
                   if len(state.tries) >= self.limits.per_address else 0.0)
        return max(state.locked_until - now, by_rate, 0.0)

    def _expire(self, now: float) -> None:
        """Drop the tries that left the window and the addresses not seen for a day (an address's own
        tries are dropped when it tries again, so that a try costs the same however many are held)."""
        _drop_before(self._tries, now - self.limits.window_seconds)
        while self._addresses:
            oldest = next(iter(self._addresses.values()))
            if now - oldest.last < self.limits.forget_after_seconds:
                break
            self._addresses.popitem(last=False)


def _drop_before(tries: deque[float], horizon: float) -> None:
    while tries and tries[0] <= horizon:
        tries.popleft()


LIMITER = LoginLimiter()
