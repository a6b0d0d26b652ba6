"""Exponential backoff with jitter inside a time budget, for anything retried against
infrastructure that may come back (a restarting Docker daemon, a sandbox host, a server).

    backoff = Backoff(base=0.5, factor=2.0, cap=8.0, budget=60.0)
    for retry in itertools.count(1):
        ...                                   # try; on an infrastructure failure:
        pause = backoff.pause(retry, spent=time.monotonic() - first_failure)
        if pause is None:
            break                             # the budget is spent: give up
        await asyncio.sleep(pause)

Retry k waits a random time in [d/2, d] with d = min(cap, base * factor**(k-1)): the schedule
still grows, and many waiters failing together (every episode of a run when dockerd restarts)
come back spread out instead of as one burst.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """A retry schedule: `base` seconds before the first retry, times `factor` per retry, at
    most `cap` per pause, and no pause that would end more than `budget` seconds after the
    first failure."""

    base: float = 0.5
    factor: float = 2.0
    cap: float = 8.0
    budget: float = 60.0

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < self.base or self.factor < 1 or self.budget < 0:
            raise ValueError("backoff needs 0 <= base <= cap, factor >= 1 and budget >= 0")

    def ceiling(self, retry: int) -> float:
        """The longest pause before retry number `retry` (1 = the first retry)."""
        return min(self.cap, self.base * self.factor ** max(0, retry - 1))

    def pause(self, retry: int, spent: float = 0.0,
              rng: random.Random | None = None) -> float | None:
        """Seconds to wait before retry `retry`, `spent` seconds after the first failure; None
        when the longest wait of that retry could end beyond the budget (decided before the
        jitter is drawn, so whether a retry happens does not depend on chance)."""
        ceiling = self.ceiling(retry)
        if spent + ceiling > self.budget:
            return None
        return ceiling / 2 + (rng or random).random() * ceiling / 2
