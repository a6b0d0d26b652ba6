"""`ReplicaFence`: the weight version of every replica, and the fence a weight publish raises.

vLLM and SGLang do not say which weights produced a completion, so Corral keeps the version of
each replica itself and tags a completion with the version its replica held when the request
was sent. That tag is exact only if a publish never overlaps a request on the same replica:

* the client (`OpenAIPolicy`, on its event loop) brackets every request with `enter` /
  `leave`; `enter` waits while the replica is fenced and returns its version;
* the publisher (any thread; the trainer's) holds `fence(replica)` around pause → reload →
  resume: new requests wait on the client side, and the fence is raised only once every
  request already sent to that replica has come back (tagged with the old version);
* `commit` sets the new version inside the fence; `disable` takes a replica out for good (a
  failed reload must never serve old weights under a new tag): waiting requests are then
  refused and the client retries them on another replica.

The server-side pause (`/pause?mode=wait`) is still needed for clients Corral does not know
about and for the engine's own queues; this fence makes the version tags exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

__all__ = ["ReplicaFence"]


@dataclass
class _Replica:
    version: int
    inflight: int = 0
    fenced: bool = False
    disabled: str | None = None  # why, when taken out
    waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = field(default_factory=list)


class ReplicaFence:
    """Per-replica versions and publish fences, shared by a client and a publisher."""

    def __init__(self, replicas: Sequence[str], version: int = 0) -> None:
        self._replicas = {r: _Replica(version) for r in replicas}
        self._lock = threading.Condition()

    # --- state --------------------------------------------------------------------------------
    @property
    def replicas(self) -> list[str]:
        return list(self._replicas)

    def version(self, replica: str) -> int:
        """The weight version `replica` serves now."""
        return self._replicas[replica].version

    def newest(self) -> int:
        """The highest version any replica still in service serves."""
        live = [s.version for s in self._replicas.values() if s.disabled is None]
        return max(live or [s.version for s in self._replicas.values()])

    def disabled(self) -> dict[str, str]:
        """Replicas taken out of service, with the reason."""
        return {r: s.disabled for r, s in self._replicas.items() if s.disabled is not None}

    def inflight(self, replica: str) -> int:
        """Requests of this client on `replica` now."""
        return self._replicas[replica].inflight

    def fenced(self, replica: str) -> bool:
        """Whether a publish holds `replica`'s fence now."""
        return self._replicas[replica].fenced

    def live(self) -> list[str]:
        return [r for r, s in self._replicas.items() if s.disabled is None]

    # --- client side (event loop) -------------------------------------------------------------
    async def enter(self, replica: str) -> int | None:
        """Wait while `replica` is fenced, then count a request in flight on it and return the
        version its tokens will come from; None when the replica is out of service."""
        while True:
            with self._lock:
                state = self._replicas[replica]
                if state.disabled is not None:
                    return None
                if not state.fenced:
                    state.inflight += 1
                    return state.version
                future = asyncio.get_running_loop().create_future()
                state.waiters.append((asyncio.get_running_loop(), future))
            await future  # woken by the publisher when the fence comes down

    def leave(self, replica: str) -> None:
        """A request entered on `replica` came back (or failed)."""
        with self._lock:
            state = self._replicas[replica]
            state.inflight = max(0, state.inflight - 1)
            self._lock.notify_all()

    # --- publisher side (any thread) ----------------------------------------------------------
    @contextlib.contextmanager
    def fence(self, replica: str, timeout: float = 600.0) -> Iterator[None]:
        """Hold new requests for `replica` and wait (up to `timeout` s) for those in flight;
        the body then reloads weights knowing no request of this client straddles them."""
        deadline = time.monotonic() + timeout
        with self._lock:
            state = self._replicas[replica]
            state.fenced = True
            while state.inflight and (left := deadline - time.monotonic()) > 0:
                self._lock.wait(left)
            drained = not state.inflight
        try:
            if not drained:
                raise TimeoutError(f"{state.inflight} requests on {replica} were still running "
                                   f"after {timeout:.0f} s")
            yield
        finally:
            with self._lock:
                state.fenced = False
                self._wake(state)

    def commit(self, replica: str, version: int) -> None:
        """`replica` now serves `version` (call inside its fence, after the reload)."""
        with self._lock:
            self._replicas[replica].version = int(version)

    def set_all(self, version: int) -> None:
        """Every replica serves `version` (engines that were started from those weights)."""
        with self._lock:
            for state in self._replicas.values():
                state.version = int(version)

    def disable(self, replica: str, reason: str) -> None:
        """Take `replica` out of service: its waiting and future requests go elsewhere."""
        with self._lock:
            state = self._replicas[replica]
            state.disabled = reason
            self._wake(state)

    @staticmethod
    def _wake(state: _Replica) -> None:
        waiters, state.waiters = state.waiters, []
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # that loop has closed: nobody waits
                loop.call_soon_threadsafe(_resolve, future)


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
