"""`SandboxPool`: warm sandboxes per spec, admission by capacity, reuse and replacement.

The pool is an env `SandboxProvider` (`acquire(spec, env)` / `release(sandbox, env, reusable)`),
so an env made with `sandbox_provider=pool` takes its sandboxes from here instead of starting
its own. What it does for a run:

- **capacity**: at most `capacity` sandboxes are usable at once (in use, warm, starting or
  being reset). A sandbox being removed no longer counts: its processes are SIGKILLed at once
  and only the daemon's bookkeeping remains, so the next episode need not wait for it. An
  `acquire` beyond capacity waits until one is released, or evicts a warm sandbox of another
  spec.
- **pre-warming**: `prewarm(spec, n, demand=f)` sets a target of `n` idle sandboxes of that
  spec; a background task starts them ahead of demand and refills the target as they are
  taken, so container start overlaps with inference instead of adding to it. With `demand`,
  the target is capped by `f()` (work still waiting for a sandbox) plus the acquires waiting
  here, so the end of a run does not start sandboxes nobody will use.
- **reuse**: a sandbox released with `reusable=True` (the env declares `reusable_sandbox` and
  the episode had no infrastructure error) is reset in the background by the env's optional
  `reset_sandbox(sandbox)` coroutine and goes back to the warm set.
- **replacement**: a warm sandbox found dead, one whose reset failed, and one released as not
  reusable are closed in the background; a fresh one is started in their place when needed.

Sandboxes of every kind are pooled alike: terminal ones (docker, bwrap) and browser contexts.
The pool opens them through a `SandboxOpener`, which owns what the backends keep warm (the
Chromium processes behind the browser contexts) and is closed with the pool, so nothing a run
started outlives it.

Stats: starts, reuses, failures, replacements, evictions and the full list of acquire waits.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, NamedTuple

from corral.errors import InfraError, SandboxError
from corral.runner.trajectory import Span
from corral.sandbox import SandboxOpener
from corral.sandbox.base import BackendConfig, Sandbox
from corral.sandbox.spec import SandboxSpec

__all__ = ["Opener", "PoolStats", "SandboxPool", "span_sink", "spec_key"]

log = logging.getLogger(__name__)

Opener = Callable[[SandboxSpec, str], Awaitable[Sandbox]]

# The episode running in this context sets a list here; acquire appends its "sandbox_wait" span.
span_sink: contextvars.ContextVar[list[Span] | None] = contextvars.ContextVar(
    "corral_pool_span_sink", default=None)


@dataclass
class PoolStats:
    """Counters and wait times of a pool (wait = from `acquire` call to a sandbox in hand)."""

    acquires: int = 0
    starts: int = 0
    reuses: int = 0
    warm_hits: int = 0
    failures: int = 0
    replaced: int = 0
    evictions: int = 0
    closes: int = 0
    peak_live: int = 0  # the most sandboxes held at once (in use, warm, starting, resetting)
    wait_seconds: list[float] = field(default_factory=list)
    start_seconds: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Counters plus the wait and start-time lists (full histograms, not only means)."""
        return {"acquires": self.acquires, "starts": self.starts, "reuses": self.reuses,
                "warm_hits": self.warm_hits, "failures": self.failures,
                "replaced": self.replaced, "evictions": self.evictions, "closes": self.closes,
                "peak_live": self.peak_live, "wait_seconds": list(self.wait_seconds),
                "start_seconds": list(self.start_seconds)}


@dataclass(eq=False)
class _Entry:
    sandbox: Sandbox
    key: str
    spec: SandboxSpec
    env_id: str
    uses: int = 0


class _Target(NamedTuple):
    spec: SandboxSpec
    env_id: str
    count: int
    demand: Callable[[], int] | None


def spec_key(spec: SandboxSpec) -> str:
    """Sandboxes are interchangeable exactly when their specs are equal."""
    return spec.model_dump_json()


class SandboxPool:
    """A bounded, pre-warmed pool of sandboxes shared by the envs of a run."""

    def __init__(self, capacity: int = 8, *, backend: str | BackendConfig = "auto",
                 run_id: str = "adhoc", opener: Opener | None = None) -> None:
        """`opener(spec, env_id)` starts one sandbox (default: a `SandboxOpener` preferring
        `backend` (a name of the backend table, "auto", or a backend's config such as
        `DockerConfig(hosts=...)`), labelling them with `run_id`)."""
        if capacity < 1:
            raise ValueError(f"sandbox capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.backend = backend
        self.run_id = run_id
        self.sandboxes = SandboxOpener(backend, run_id=run_id)
        self._opener = opener or self._open
        self.stats = PoolStats()
        self._warm: dict[str, deque[_Entry]] = {}
        self._targets: dict[str, _Target] = {}
        self._starting: dict[str, int] = {}
        self._waiting: dict[str, int] = {}  # acquires blocked on capacity, per spec
        self._in_use: dict[int, _Entry] = {}
        self._live = 0  # every sandbox counted against capacity (any state)
        self._cond = asyncio.Condition()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._removals = asyncio.Semaphore(1)  # container removals, one at a time
        self._closed = False

    # --- views ---------------------------------------------------------------------------------
    @property
    def live(self) -> int:
        """Sandboxes counted against capacity right now."""
        return self._live

    @property
    def in_use(self) -> int:
        return len(self._in_use)

    def warm_count(self, spec: SandboxSpec | None = None) -> int:
        """Idle sandboxes ready to hand out (of `spec`, or of every spec)."""
        if spec is not None:
            return len(self._warm.get(spec_key(spec), ()))
        return sum(len(q) for q in self._warm.values())

    def snapshot(self) -> dict[str, Any]:
        """Stats plus the current occupancy."""
        return {**self.stats.as_dict(), "capacity": self.capacity, "live": self._live,
                "in_use": self.in_use, "warm": self.warm_count()}

    # --- the provider protocol -----------------------------------------------------------------
    async def acquire(self, spec: SandboxSpec, env: Any = None) -> Sandbox:
        """A sandbox for `spec`: a warm one if any, else a fresh one within capacity."""
        self._check_open()
        key = spec_key(spec)
        env_id = str(getattr(env, "env_id", None) or type(env).__name__)
        started, wall = time.perf_counter(), time.time()
        try:
            entry = await self._take_or_reserve(key)
            if entry is None:
                entry = await self._start(key, spec, env_id)
            else:
                self.stats.warm_hits += 1
                self.stats.reuses += int(entry.uses > 0)
            entry.uses += 1
            self._in_use[id(entry.sandbox)] = entry
            self.stats.acquires += 1
            return entry.sandbox
        finally:
            self.stats.wait_seconds.append(time.perf_counter() - started)
            sink = span_sink.get()
            if sink is not None:
                sink.append(Span("sandbox_wait", wall, time.time()))
            self._refill(key)

    async def release(self, sandbox: Sandbox, env: Any = None, reusable: bool = False) -> None:
        """Give a sandbox back: reset and keep it when `reusable`, else close it (background)."""
        entry = self._in_use.pop(id(sandbox), None)
        if entry is None:  # not ours (or released twice): just make sure it is closed
            await sandbox.close()
            return
        if reusable and sandbox.alive and not self._closed:
            self._spawn(self._reset_and_keep(entry, env))
        else:
            await self._give_back_unit()  # removal does not hold capacity (module docstring)
            self._spawn(self._close_entry(entry, give_back=False))
            self._refill(entry.key)

    # --- pre-warming ---------------------------------------------------------------------------
    async def prewarm(self, spec: SandboxSpec, count: int, *, env_id: str = "",
                      wait: bool = False, demand: Callable[[], int] | None = None) -> None:
        """Keep `count` idle sandboxes of `spec` ready (at most `demand()` plus the acquires
        waiting, when `demand` is given); `wait=True` returns once they are (or once capacity
        allows no more)."""
        self._check_open()
        key = spec_key(spec)
        self._targets[key] = _Target(spec, env_id, max(0, count), demand)
        self._refill(key)
        if wait:
            async with self._cond:
                await self._cond.wait_for(
                    lambda: self._closed or self.warm_count(spec) >= self._wanted(key)
                    or (self._live >= self.capacity and not self._starting.get(key)))

    def refill(self, spec: SandboxSpec) -> None:
        """Start what the pre-warming target of `spec` wants now (its `demand` went up)."""
        self._refill(spec_key(spec))

    # --- internals -----------------------------------------------------------------------------
    async def _take_or_reserve(self, key: str) -> _Entry | None:
        """A warm entry of `key`, or None after reserving one unit of capacity for a start."""
        async with self._cond:
            while True:
                self._check_open()
                queue = self._warm.get(key)
                while queue:
                    entry = queue.popleft()
                    if entry.sandbox.alive:
                        return entry
                    log.warning("a warm %s sandbox died while idle; replacing it", entry.env_id)
                    self.stats.failures += 1
                    self.stats.replaced += 1
                    self._live -= 1  # we hold the lock; the loop below may take the unit
                    self._spawn(self._close_entry(entry, give_back=False))
                if self._live < self.capacity:
                    self._reserve_start(key)
                    return None
                victim = self._evictable(key)
                if victim is not None:  # its capacity unit passes to us; it closes meanwhile
                    self.stats.evictions += 1
                    self._starting[key] = self._starting.get(key, 0) + 1
                    self._spawn(self._close_entry(victim, give_back=False))
                    return None
                self._waiting[key] = self._waiting.get(key, 0) + 1
                try:
                    await self._cond.wait()
                finally:
                    self._waiting[key] -= 1

    def _evictable(self, key: str) -> _Entry | None:
        for other, queue in self._warm.items():
            if other != key and queue:
                return queue.popleft()
        return None

    async def _start(self, key: str, spec: SandboxSpec, env_id: str) -> _Entry:
        """Start one sandbox on a capacity unit reserved (and counted in `_starting`) by the
        caller; gives the unit back on error."""
        t0 = time.perf_counter()
        try:
            sandbox = await asyncio.wait_for(self._opener(spec, env_id),
                                             timeout=getattr(spec, "startup_timeout", 60.0) + 5)
        except BaseException as exc:
            self._starting[key] -= 1
            await self._give_back_unit()
            if isinstance(exc, asyncio.CancelledError):
                raise
            self.stats.failures += 1
            if isinstance(exc, InfraError):
                raise
            raise SandboxError(f"could not start a sandbox for {env_id}: "
                               f"{type(exc).__name__}: {exc}") from exc
        await sandbox.prepare()  # its shells start here too, not on the episode's clock
        self._starting[key] -= 1
        self.stats.starts += 1
        self.stats.start_seconds.append(time.perf_counter() - t0)
        return _Entry(sandbox, key, spec, env_id)

    async def _open(self, spec: SandboxSpec, env_id: str) -> Sandbox:
        return await self.sandboxes.open(spec, env_id=env_id)

    def _wanted(self, key: str) -> int:
        """Idle sandboxes of `key` to keep: the target, capped by demand and capacity."""
        target = self._targets.get(key)
        if target is None:
            return 0
        count = target.count
        if target.demand is not None:
            count = min(count, max(0, target.demand()) + self._waiting.get(key, 0))
        return min(count, self.capacity)

    def _refill(self, key: str) -> None:
        target = self._targets.get(key)
        if target is None or self._closed:
            return
        missing = self._wanted(key) - len(self._warm.get(key, ())) - self._starting.get(key, 0)
        for _ in range(max(0, min(missing, self.capacity - self._live))):
            self._reserve_start(key)
            self._spawn(self._warm_one(key, target.spec, target.env_id))

    def _reserve_start(self, key: str) -> None:
        """Count one more sandbox of `key` against capacity, as starting."""
        self._live += 1
        self.stats.peak_live = max(self.stats.peak_live, self._live)
        self._starting[key] = self._starting.get(key, 0) + 1

    async def _warm_one(self, key: str, spec: SandboxSpec, env_id: str) -> None:
        try:
            entry = await self._start(key, spec, env_id or "prewarm")
        except InfraError as exc:
            log.warning("pre-warming a sandbox failed: %s", exc)
            return
        if self._closed:
            await self._close_entry(entry)
            return
        async with self._cond:
            self._warm.setdefault(key, deque()).append(entry)
            self._cond.notify_all()

    async def _reset_and_keep(self, entry: _Entry, env: Any) -> None:
        hook = getattr(env, "reset_sandbox", None)
        try:
            if hook is not None:
                await hook(entry.sandbox)
        except Exception as exc:  # a sandbox that cannot be reset is replaced, not reused
            log.warning("resetting a %s sandbox failed (%s: %s); replacing it", entry.env_id,
                        type(exc).__name__, exc)
            self.stats.failures += 1
            self.stats.replaced += 1
            await self._close_entry(entry)
            return
        if self._closed or not entry.sandbox.alive:
            await self._close_entry(entry)
            return
        async with self._cond:
            self._warm.setdefault(entry.key, deque()).append(entry)
            self._cond.notify_all()

    async def _close_entry(self, entry: _Entry, give_back: bool = True) -> None:
        try:
            if give_back:
                await entry.sandbox.close()
            else:  # its capacity is back already: kill it now, remove it one at a time, so
                # removals do not crowd the daemon's container starts, which episodes wait for
                await entry.sandbox.terminate()
                async with self._removals:
                    await entry.sandbox.close()
        except Exception as exc:  # closing is best effort; the reaper removes leftovers
            log.warning("closing a %s sandbox failed: %s", entry.env_id, exc)
        finally:
            self.stats.closes += 1
            if give_back:
                await self._give_back_unit()

    async def _give_back_unit(self) -> None:
        async with self._cond:
            self._live -= 1
            self._cond.notify_all()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("the sandbox pool is closed; open a new Runner")

    # --- shutdown ------------------------------------------------------------------------------
    async def drain(self) -> None:
        """Wait for background starts, resets and closes to finish."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        """Close every sandbox the pool holds (warm and still in use), then what their
        backends keep warm; idempotent."""
        if self._closed:
            return
        self._closed = True
        await self.drain()
        entries = [e for q in self._warm.values() for e in q] + list(self._in_use.values())
        self._warm.clear()
        self._in_use.clear()
        await asyncio.gather(*(self._close_entry(e) for e in entries), return_exceptions=True)
        await self.sandboxes.close()
        async with self._cond:
            self._cond.notify_all()

    async def __aenter__(self) -> "SandboxPool":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
