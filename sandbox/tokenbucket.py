"""A creation-rate limit per Docker host (cloud hosts cap create calls)."""

from __future__ import annotations

import threading
import time

__all__ = ["TokenBucket"]


class TokenBucket:
    """A creation-rate limit: `rate` tokens per second, at most `burst` saved up. `reserve()`
    takes a token now and says how long to wait before using it, so waiters queue in order
    without a lock held across the wait (thread-safe; any event loop)."""

    def __init__(self, rate: float | None, burst: int = 1) -> None:
        self.rate, self.burst = rate, burst
        self._tokens = float(burst)
        self._stamp = time.monotonic()
        self._lock = threading.Lock()

    def _refill(self, now: float) -> None:
        assert self.rate is not None
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def reserve(self) -> float:
        """Take a token; seconds to wait before it is due (0 when one was saved up)."""
        if self.rate is None:
            return 0.0
        with self._lock:
            self._refill(time.monotonic())
            self._tokens -= 1
            return max(0.0, -self._tokens / self.rate)

    def delay(self) -> float:
        """Seconds until a token would be due, without taking one."""
        if self.rate is None:
            return 0.0
        with self._lock:
            self._refill(time.monotonic())
            return max(0.0, (1 - self._tokens) / self.rate)
