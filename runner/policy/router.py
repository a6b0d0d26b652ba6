"""`Router`: which inference replica serves a request.

- A new trajectory (a `session_id` not seen yet, or none) goes to the healthy replica with the
  fewest outstanding requests (ties: the one that has served fewest requests, then list order).
- Later requests of the same session stick to the replica that served it, where its prefix
  (the whole conversation so far) is likely still cached.
- Unless that replica is overloaded: when its outstanding load exceeds
  `overload_factor * least + overload_slack` (least = the least-loaded healthy replica), the
  session moves there and sticks to its new replica.
- A replica marked unhealthy (connection refused, timed out) is skipped for `cooldown` seconds;
  its sessions move. If every replica is cooling down, the one that recovers soonest is used.
  A replica taken out (`take_out`: its weights could not be updated) never recovers.

The router does no I/O; `acquire` / `release` bracket each request.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Sequence

__all__ = ["Router", "RouterStats"]


@dataclass(slots=True)
class RouterStats:
    """Routing counters: requests per replica, sticky hits, moves, new sessions."""

    requests: Counter = field(default_factory=Counter)
    sticky_hits: int = 0
    moves: int = 0
    overload_moves: int = 0
    unhealthy_moves: int = 0
    new_sessions: int = 0
    unhealthy_marks: int = 0

    def as_dict(self) -> dict[str, object]:
        return {"requests": dict(self.requests), "sticky_hits": self.sticky_hits,
                "moves": self.moves, "overload_moves": self.overload_moves,
                "unhealthy_moves": self.unhealthy_moves, "new_sessions": self.new_sessions,
                "unhealthy_marks": self.unhealthy_marks}


class Router:
    """Session-sticky, least-outstanding-requests, overload-aware routing over replicas."""

    def __init__(self, replicas: Sequence[str], *, overload_factor: float = 2.0,
                 overload_slack: int = 2, cooldown: float = 5.0, max_sessions: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not replicas:
            raise ValueError("Router needs at least one replica")
        if len(set(replicas)) != len(replicas):
            raise ValueError(f"replicas are listed twice: {list(replicas)}")
        self.replicas = list(replicas)
        self.overload_factor = overload_factor
        self.overload_slack = overload_slack
        self.cooldown = cooldown
        self.max_sessions = max_sessions
        self.stats = RouterStats()
        self._clock = clock
        self._outstanding = {r: 0 for r in self.replicas}
        self._down_until = {r: 0.0 for r in self.replicas}
        self._sessions: OrderedDict[str, str] = OrderedDict()  # LRU: session -> replica
        self._lock = threading.Lock()  # the router may be shared by threads (Ray, servers)

    # --- state --------------------------------------------------------------------------------
    def outstanding(self, replica: str) -> int:
        """Requests acquired on `replica` and not yet released."""
        return self._outstanding[replica]

    def healthy(self, replica: str) -> bool:
        return self._down_until[replica] <= self._clock()

    def session_replica(self, session_id: str) -> str | None:
        """The replica a session currently sticks to."""
        return self._sessions.get(session_id)

    # --- routing ------------------------------------------------------------------------------
    def _least_loaded(self, exclude: str | None = None) -> str:
        others = [r for r in self.replicas if r != exclude] or self.replicas
        # All cooling down: try the one that comes back first rather than fail.
        candidates = ([r for r in others if self.healthy(r)]
                      or [min(others, key=lambda r: self._down_until[r])])
        return min(candidates, key=lambda r: (self._outstanding[r], self.stats.requests[r]))

    def _overloaded(self, replica: str, least: str) -> bool:
        limit = self.overload_factor * self._outstanding[least] + self.overload_slack
        return self._outstanding[replica] > limit

    def acquire(self, session_id: str | None = None, *, exclude: str | None = None) -> str:
        """Pick a replica for one request and count it as outstanding; pair with `release`.

        `exclude` skips a replica for this pick (a retry after it failed).
        """
        with self._lock:
            current = self._sessions.get(session_id) if session_id is not None else None
            if current is None:
                choice = self._least_loaded(exclude)
                if session_id is not None:
                    self.stats.new_sessions += 1
            elif current == exclude or not self.healthy(current):
                choice = self._least_loaded(exclude=current)
                if choice != current:
                    self.stats.moves += 1
                    self.stats.unhealthy_moves += 1
            else:
                least = self._least_loaded()
                if least != current and self._overloaded(current, least):
                    choice = least
                    self.stats.moves += 1
                    self.stats.overload_moves += 1
                else:
                    choice = current
                    self.stats.sticky_hits += 1
            if session_id is not None:
                self._sessions[session_id] = choice
                self._sessions.move_to_end(session_id)
                while len(self._sessions) > self.max_sessions:
                    self._sessions.popitem(last=False)
            self._outstanding[choice] += 1
            self.stats.requests[choice] += 1
            return choice

    def release(self, replica: str) -> None:
        """A request on `replica` finished (successfully or not)."""
        with self._lock:
            self._outstanding[replica] = max(0, self._outstanding[replica] - 1)

    def mark_unhealthy(self, replica: str) -> None:
        """Skip `replica` for `cooldown` seconds (it refused or dropped a connection)."""
        with self._lock:
            self._down_until[replica] = self._clock() + self.cooldown
            self.stats.unhealthy_marks += 1

    def take_out(self, replica: str) -> None:
        """Never pick `replica` again while another is healthy (its weights could not be
        updated, or it is gone); its sessions move."""
        with self._lock:
            self._down_until[replica] = math.inf

    def mark_healthy(self, replica: str) -> None:
        """`replica` answered: end its cool-down early."""
        with self._lock:
            self._down_until[replica] = 0.0

    def forget(self, session_id: str) -> None:
        """Drop a finished trajectory's stickiness."""
        with self._lock:
            self._sessions.pop(session_id, None)
