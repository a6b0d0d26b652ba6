"""Where episodes run. The runner hands work items to an `Executor`, one attempt at a time.

`LocalExecutor` (backend "asyncio") runs episodes in this process on the event loop: env
instances are kept per env and reused across episodes, sandboxes come from a `SandboxPool`,
and episodes that need a sandbox are admitted by a capacity semaphore (waiting there is
recorded as a "sandbox_wait" span). Before that, such an episode waits to be *on deck*: at
most `on_deck` episodes beyond the sandbox capacity decode their first turn ahead of a slot.
The first turn is decoded before the sandbox is needed so that it is ready when a slot frees;
decoded much earlier it only loads the inference servers (a run launches many groups ahead of
its slots) and slows the turns of the episodes that hold a sandbox, while it goes stale.
Other backends (`backend="ray"`) implement the same protocol, deck included, in
`corral.runner.ray_backend` with a `make_executor(runner)` function.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Protocol, Sequence

from corral.errors import CorralError
from corral.runner.boundary import TurnBoundary
from corral.runner.episode import BoundaryHook, EpisodeLimits, WorkItem, run_episode
from corral.runner.policy import Policy
from corral.runner.pool import SandboxPool, span_sink, spec_key
from corral.runner.trajectory import Span, Trajectory

__all__ = ["EnvFactory", "EnvSource", "Executor", "LocalExecutor", "admission_slot", "on_deck",
           "resolve_envs"]

EnvFactory = Callable[[], Any]


class Executor(Protocol):
    """Runs one attempt of a work item and returns its trajectory (status says how it ended;
    the runner retries infrastructure failures)."""

    async def run(self, item: WorkItem, attempt: int) -> Trajectory: ...

    def stats(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...


@dataclass
class EnvSource:
    """One env of a run: how to make instances, how many tasks, what sandbox it needs."""

    label: str
    factory: EnvFactory
    num_tasks: int
    spec: Any  # its default SandboxSpec, or None
    threshold: float = 1.0  # the env's pass_threshold: a reward at least this solved it

    @property
    def pooled(self) -> bool:
        """Whether its sandboxes come from the pool (every env with a sandbox: text envs have
        none)."""
        return self.spec is not None


@contextlib.asynccontextmanager
async def admission_slot(semaphore: asyncio.Semaphore) -> AsyncIterator[None]:
    """A slot of the sandbox capacity for one episode (`run_episode(admission=...)`); the wait
    becomes the episode's "sandbox_wait" span."""
    wall = time.time()
    await semaphore.acquire()
    try:
        sink = span_sink.get()
        if sink is not None:
            sink.append(Span("sandbox_wait", wall, time.time()))
        yield
    finally:
        semaphore.release()


@contextlib.asynccontextmanager
async def on_deck(deck: asyncio.Semaphore) -> AsyncIterator[list[Span]]:
    """A place on deck for one episode, held to its end (see the module docstring); yields the
    "sandbox_wait" span of the wait for it (none when there was no wait)."""
    asked, waited = time.time(), deck.locked()
    async with deck:
        yield [Span("sandbox_wait", asked, time.time())] if waited else []


def resolve_envs(envs: Sequence[str | EnvFactory]) -> tuple[list[EnvSource], list[Any]]:
    """Env ids (looked up with `corral.registry.make`) or factories → sources, plus one probe
    instance of each (reused as the first worker instance)."""
    from corral.registry import make

    if not envs:
        raise CorralError("Runner needs at least one environment: envs=['namespace/name-vN']")
    sources, probes = [], []
    for entry in envs:
        factory: EnvFactory = (lambda env_id=entry: make(env_id)) if isinstance(entry, str) \
            else entry
        env = factory()
        label = entry if isinstance(entry, str) else str(env.env_id or type(env).__name__)
        num_tasks = len(env.tasks)
        if num_tasks == 0:
            raise CorralError(f"environment {label} has no tasks; give it a dataset")
        sources.append(EnvSource(label, factory, num_tasks, env.sandbox_spec,
                                 float(getattr(env, "pass_threshold", 1.0))))
        probes.append(env)
    return sources, probes


class LocalExecutor:
    """Episodes as asyncio tasks in this process (backend "asyncio")."""

    def __init__(self, sources: list[EnvSource], probes: list[Any], policy: Policy,
                 limits: EpisodeLimits, inference: asyncio.Semaphore, pool: SandboxPool,
                 sandbox_capacity: int, on_deck: int = 1, agent: Any = None,
                 proxy: Any = None) -> None:
        """`on_deck`: episodes allowed to decode their first turn while every slot is taken
        (at least 1). `agent` + `proxy`: an `ExternalAgent` plays the episodes
        (`corral.runner.agents.run_agent_episode`) instead of the native loop."""
        self.agent, self.proxy = agent, proxy
        self.sources, self.policy, self.limits = sources, policy, limits
        self.inference, self.pool = inference, pool
        self.capacity = sandbox_capacity
        self.admission = asyncio.Semaphore(sandbox_capacity)
        self.deck = asyncio.Semaphore(sandbox_capacity + max(1, on_deck))
        self._waiting: Counter[str] = Counter()  # pooled items on deck without a slot, per spec
        self._arrived = False  # has any work item come yet?
        self._free: list[list[Any]] = [[self._attach(env)] for env in probes]
        self.made = len(probes)

    def _attach(self, env: Any) -> Any:
        if env.sandbox_spec is not None:
            env.sandbox_provider = self.pool
        return env

    def _checkout(self, index: int) -> Any:
        free = self._free[index]
        if free:
            return free.pop()
        self.made += 1
        return self._attach(self.sources[index].factory())

    async def run(self, item: WorkItem, attempt: int, *, start: TurnBoundary | None = None,
                  at_boundary: BoundaryHook | None = None) -> Trajectory:
        """One attempt at `item`; `start`: continue from this turn boundary in a sandbox
        restored from its snapshot (no pool sandbox is wanted for it); `at_boundary`: the
        episode's boundary hook (`corral.runner.episode.BoundaryHook`)."""
        env = self._checkout(item.env_index)
        play: Any = run_episode
        if self.agent is not None:
            from corral.runner.agents.external import run_agent_episode

            play = functools.partial(run_agent_episode, agent=self.agent, proxy=self.proxy)
        elif start is not None or at_boundary is not None:
            play = functools.partial(run_episode, start=start, restore=self._restore,
                                     at_boundary=at_boundary)
        try:
            if not self.sources[item.env_index].pooled:
                return await play(env, self.policy, item, self.limits, self.inference,
                                  attempt=attempt)
            key = spec_key(self.sources[item.env_index].spec)
            async with on_deck(self.deck) as spans:
                self._arrived = True
                unslotted = [start is None]
                if start is None:  # on deck: its sandbox is wanted from now on
                    self._waiting[key] += 1
                    self.pool.refill(self.sources[item.env_index].spec)
                try:
                    return await play(env, self.policy, item, self.limits, self.inference,
                                      attempt=attempt, spans=spans,
                                      admission=self._admitted(key, unslotted))
                finally:
                    if unslotted[0]:  # it ended before its slot was granted
                        self._waiting[key] -= 1
        finally:
            self._free[item.env_index].append(env)

    @contextlib.asynccontextmanager
    async def _admitted(self, key: str, unslotted: list[bool]) -> AsyncIterator[None]:
        """The slot of an episode counted in `_waiting` since it went on deck (if it was): it
        stops counting there once the slot is granted."""
        async with admission_slot(self.admission):
            if unslotted[0]:
                self._waiting[key] -= 1
            unslotted[0] = False
            yield

    async def _restore(self, boundary: TurnBoundary) -> Any:
        """The sandbox an episode continues in from `boundary`: restored from its snapshot
        (None for an env without a sandbox), labelled with this run; closed when released."""
        if boundary.snapshot is None:
            return None
        from corral.errors import SandboxError
        from corral.sandbox import SandboxSnapshot

        snapshot = SandboxSnapshot.from_json(boundary.snapshot)
        limit = float(snapshot.spec.get("startup_timeout", 60.0)) + 5  # as the pool's starts
        try:  # a start that never finishes must not hold its group forever
            return await asyncio.wait_for(self.pool.sandboxes.restore(snapshot), timeout=limit)
        except TimeoutError:
            raise SandboxError(f"restoring a snapshot took over {limit:g} s") from None

    def demand(self, spec: Any) -> Callable[[], int]:
        """How many work items needing `spec` are on deck without a slot (decoding their first
        turn, or waiting for a slot): caps the pool's pre-warming, so the end of a run starts
        no sandbox nobody takes, while a sandbox starts for an episode as soon as it is on deck
        (a container start takes longer than a first turn). Before the first work item arrives
        a full load is expected (pre-warming while the caller gets ready is the point): every
        slot plus the pool's warm spares."""
        key = spec_key(spec)
        return lambda: self._waiting[key] if self._arrived else self.pool.capacity

    def stats(self) -> dict[str, Any]:
        return {"backend": "asyncio", "env_instances": self.made, "pool": self.pool.snapshot()}

    async def close(self) -> None:
        for free in self._free:
            for env in free:
                if env.episode is not None:
                    await env.aclose()
