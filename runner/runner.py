"""`Runner`: asynchronous rollout collection into GRPO batches.

    async with Runner(envs=["corral/arithmetic-v0"], policy=policy,
                      sandbox_capacity=64, inference_concurrency=128, run_dir="runs/a") as runner:
        async for batch in runner.batches(size=256, group=8):
            ...                                  # train; then runner.on_policy_update(v)

How work flows: the runner plans groups deterministically from `seed` (group `g` is task
`task_index` of env `env_index`, drawn from `Random(f"corral:{seed}:{g}")`; its `group`
samples get their own sampling seeds; with `AssemblyConfig.dynamic_sampling` a task whose
groups keep coming back with equal rewards is drawn less, and a resumed run keeps the plans
its store holds) and keeps at least `ceil(groups_per_batch * (1 +
overprovision))` groups launched ahead of the consumer (`AssemblyConfig`). Beyond that it
keeps the executor saturated: when its envs run in pooled sandboxes and fewer work items are
in flight than sandbox capacity plus warm spares plus one group, it launches the next group,
also while the consumer is busy training, until a whole batch of ready groups waits to be
taken. Without
this, sandboxes idle at every batch cut while the last groups finish. Each sample is a task on
the event loop that runs one episode at a time through the `Executor` (within the run's
`EpisodeLimits`), retrying infrastructure failures up to `retries` times with exponential
backoff and jitter within `retry_budget` (`AssemblyConfig`), writes the finished
trajectory to the store, then to the `BatchAssembler`. A batch is cut as soon as enough whole
groups are ready (the straggler cut-off); everything still running keeps running and fills the
next batch, so no work is thrown away.

Two separate limits: `sandbox_capacity` (sandboxes alive / episodes holding one) and
`inference_concurrency` (generate calls in flight). Policy updates: `on_policy_update(v)` tells
the runner a new version exists; by default in-flight episodes finish (every token carries the
version that produced it, so the trainer can correct or drop by measured divergence); with
`AssemblyConfig(max_staleness=k)` episodes started before `v - k` are cancelled and
restarted; the trainer's throttle can call `cut_inflight()` to do that on demand.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import importlib
import itertools
import logging
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterable, Sequence

from corral.errors import CorralError, InfraError
from corral.runner.assembly import AssemblyConfig, RolloutTally, batch_summary
from corral.runner.boundary import TurnBoundary
from corral.runner.branching import Boundaries
from corral.runner.episode import EpisodeLimits, WorkItem
from corral.runner.executor import EnvFactory, EnvSource, Executor, LocalExecutor, resolve_envs
from corral.runner.metrics import RunMetrics, policy_stats
from corral.runner.policy import Policy
from corral.runner.pool import SandboxPool
from corral.fileio import write_json_atomic
from corral.runner.store import METRICS, TrajectoryStore
from corral.runner.trajectory import Batch, Status, Trajectory
from corral.runner.turnlog import TurnLog
from corral.sandbox import check_backend
from corral.sandbox.base import BackendConfig
from corral.sandbox.reaper import reap_run

__all__ = ["NoTrainableGroups", "REDRAWS", "Runner", "SLOW_STARTS", "TrajectoryCallback",
           "deck_depth", "default_spares"]

log = logging.getLogger(__name__)

REDRAWS = 16  # most draws of a group's task under dynamic sampling (then the last is taken)


class NoTrainableGroups(CorralError):
    """`batches()` gave up: every group for a long while was filtered (equal rewards) or
    discarded (infrastructure failures); `streak` groups in a row, whose rollouts `seen`
    tallies (pass rate, mean reward, fates)."""

    def __init__(self, message: str, streak: int, seen: RolloutTally | None = None,
                 first: bool = False) -> None:
        super().__init__(message)
        self.streak = streak
        self.seen = seen if seen is not None else RolloutTally()
        self.first = first  # no batch had been handed out yet

TrajectoryCallback = Callable[[Trajectory], None]

@dataclass
class _Flight:
    item: WorkItem
    task: asyncio.Task[None]
    version: int      # policy version when the work item started
    cut: bool = False


SLOW_STARTS = frozenset({"docker"})
"""Backends whose sandbox start takes longer than a first turn (a Docker container: 0.3 s on
an idle host, 0.8-0.9 s under a full run's churn on 2 cores; bubblewrap: about 0.05 s)."""


def default_spares(capacity: int, slow_starts: bool = False) -> int:
    """Warm spares a runner keeps by default: a quarter of its sandbox capacity (half with a
    backend of `SLOW_STARTS`), at least 1. Enough to cover the starts a burst of finishing
    episodes needs (an episode's sandbox starts when it goes on deck, and the deck is as deep
    as the spares); idle ones cost a sleeping container or bubblewrap process each."""
    return max(1, capacity // (2 if slow_starts else 4))


def deck_depth(capacity: int, warm_spares: int) -> int:
    """Episodes on deck beyond `capacity`: enough to take every warm spare at once, and at
    least a quarter of the capacity (at least 1)."""
    return max(warm_spares, default_spares(capacity))


def _check_arguments(envs: object, policy: object, limits: object, assembly: object,
                     seed: object, env_weights: Sequence[float] | None) -> None:
    """A TypeError or ValueError naming the argument, when the `Runner` is made: each of these
    would otherwise fail mid-run, in every episode, with an error that names none of them."""
    if isinstance(envs, (str, bytes)) or not isinstance(envs, Iterable):
        raise TypeError(f"envs must be a list of env ids or factories, got {envs!r}"
                        + (f"; pass [{envs!r}]" if isinstance(envs, str) else ""))
    if not callable(getattr(policy, "generate", None)):
        raise TypeError(f"policy must be a Policy (with an async generate), got "
                        f"{type(policy).__name__}")
    for name, value, kind in (("limits", limits, EpisodeLimits),
                              ("assembly", assembly, AssemblyConfig)):
        if value is not None and not isinstance(value, kind):
            raise TypeError(f"{name} must be an {kind.__name__} (or None), got "
                            f"{type(value).__name__}: {kind.__name__}(**{name}) makes one")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    if env_weights:
        weights = list(env_weights)
        if not all(isinstance(w, (int, float)) and 0 <= w < math.inf for w in weights) \
                or not sum(weights) > 0:
            raise ValueError(f"env_weights must be finite numbers >= 0, not all 0, got {weights}")


class Runner:
    """Collects trajectories from `envs` with `policy`; yields GRPO batches or one-shot lists.

    The knobs come in groups. Concurrency: `sandbox_capacity` (sandboxes alive at once) and
    `inference_concurrency` (generate calls in flight), set apart because they scale apart.
    Episodes: `limits` (turns, tokens, sampling, deadlines; `EpisodeLimits`). Batches:
    `assembly` (look-ahead, filtering, retries, staleness cut; `AssemblyConfig`). Sandboxes:
    `sandbox_backend` (a backend name, or its config: `DockerConfig(hosts=[...])` places the
    sandboxes on a fleet of Docker hosts), `prewarm` (sandboxes started per pooled spec before
    the first episode; default: capacity shared among the specs), `warm_spares` (sandboxes kept
    started beyond `sandbox_capacity`, so an episode admitted to a slot finds its sandbox ready
    and a start is not inside the slot; default `default_spares(capacity)`: a quarter of the
    capacity, half where the envs' sandboxes are Docker containers; 0 turns them off;
    the peak held is `stats()["executor"]["pool"]["peak_live"]`) and `pool` (a `SandboxPool`
    shared with other runners, which this one drains instead of closing). The run: `run_dir` (the
    trajectory store; a run resumes from it), `run_id`, `seed` (the task plan), `env_weights`
    (sampling weights of `envs`), and `backend` (`"asyncio"`, `"ray"` or an `Executor`) with its
    `backend_options`. `agent`: an `ExternalAgent` (`corral.runner.agents`) plays the episodes
    instead of the native loop, its model calls recorded by a proxy the runner serves
    (asyncio backend). `env_servers`: URLs of `corral serve-env` servers the env ids run on
    (sessions spread by free capacity; an episode whose server died is retried on another).
    """

    def __init__(self, envs: Sequence[str | EnvFactory], policy: Policy, *,
                 sandbox_capacity: int = 8, inference_concurrency: int = 32,
                 limits: EpisodeLimits | None = None, assembly: AssemblyConfig | None = None,
                 sandbox_backend: str | BackendConfig = "auto", prewarm: int | None = None,
                 warm_spares: int | None = None, pool: SandboxPool | None = None,
                 run_dir: str | os.PathLike[str] | None = None, run_id: str | None = None,
                 seed: int = 0, env_weights: Sequence[float] | None = None,
                 backend: str | Executor = "asyncio",
                 backend_options: dict[str, Any] | None = None,
                 env_servers: Sequence[str] | None = None, agent: Any = None) -> None:
        _check_arguments(envs, policy, limits, assembly, seed, env_weights)
        if agent is not None:
            from corral.runner.agents.external import ExternalAgent

            if not isinstance(agent, ExternalAgent):
                raise TypeError(f"agent must be an ExternalAgent, got {type(agent).__name__}")
            if backend != "asyncio":
                raise ValueError("an external agent runs on the asyncio backend only")
        if assembly is not None and assembly.tree_turns and (agent is not None
                                                             or backend != "asyncio"):
            raise ValueError("tree groups (assembly.tree_turns) run on the asyncio backend with "
                             "the native episode loop only")
        self.agent = agent
        self.proxy: Any = None
        if sandbox_capacity < 1 or inference_concurrency < 1:
            raise ValueError("sandbox_capacity and inference_concurrency must be at least 1")
        if warm_spares is not None and warm_spares < 0:
            raise ValueError(f"warm_spares must be 0 or more, got {warm_spares}")
        if isinstance(sandbox_backend, str):  # a typo answered now, with the closest names
            check_backend(sandbox_backend)
        self.env_entries = list(envs)
        if not self.env_entries:
            raise ValueError("envs is empty: name at least one env")
        self.policy = policy
        self.sandbox_capacity = sandbox_capacity
        self.inference_concurrency = inference_concurrency
        self.limits = limits if limits is not None else EpisodeLimits()
        self.assembly = assembly if assembly is not None else AssemblyConfig()
        self.sandbox_backend = sandbox_backend
        self.prewarm = prewarm
        self._spares_given = warm_spares is not None
        # the default depends on the backend the pooled envs resolve to (`start`)
        self.warm_spares = default_spares(sandbox_capacity) if warm_spares is None \
            else warm_spares
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.run_id = run_id or (self.run_dir.name if self.run_dir else f"corral-{os.getpid()}")
        self._named = run_id is not None or run_dir is not None  # its sandboxes may outlive it
        self.seed = seed
        self.env_weights = list(env_weights) if env_weights else None
        self.backend = backend
        self.backend_options = dict(backend_options or {})  # e.g. Ray: workers, ray_init
        # env servers (`corral serve-env`) the env ids run on: corral.serve.pool
        self.env_servers = list(env_servers or [])
        self.assembler = self.assembly.assembler()
        self.metrics = RunMetrics()
        self.sources: list[EnvSource] = []
        self.pool: SandboxPool | None = pool
        self._own_pool = pool is None
        self.executor: Executor | None = None
        self.store: TrajectoryStore | None = None
        self.boundaries: Boundaries | None = None
        self.counts = {"launched": 0, "finished": 0, "resumed": 0, "cut": 0, "batches": 0,
                       "resampled": 0}
        self._flights: dict[str, _Flight] = {}
        self._results: dict[str, Trajectory] = {}
        self._stored: dict[str, Trajectory] = {}
        self._consumed: list[str] = []
        self._consumed_set: set[str] = set()
        self._collect_groups: set[int] = set()
        self._next_group = 0
        # batches(): group size, groups per batch, look-ahead, saturation (items in flight)
        self._stream: tuple[int, int, int, int] | None = None
        self._topping_up = False
        # complete groups in a row without a trainable one, and since the last batch
        self.streak = RolloutTally()
        self._since_batch = RolloutTally()
        self._no_signal: dict[tuple[int, int], int] = {}  # (env, task) -> such groups in a row
        self._stored_plans: dict[int, tuple[int, int]] = {}  # a resumed store's group plans
        self._infra_streak = 0  # trajectories in a row that failed on infrastructure, finally
        self._infra_since: float | None = None  # when the first of them finished
        self._changed: asyncio.Event | None = None
        self._crash: BaseException | None = None
        self._stalled: InfraError | None = None
        self._listeners: list[TrajectoryCallback] = []
        self._started = False
        self._closing = False

    # --- lifecycle -----------------------------------------------------------------------------
    async def __aenter__(self) -> "Runner":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def config(self) -> dict[str, Any]:
        """The settings recorded in the run manifest (seed, envs and group must match to resume)."""
        return {"seed": self.seed, "envs": [s.label for s in self.sources],
                "sandbox_capacity": self.sandbox_capacity,
                "warm_spares": self.warm_spares,
                "inference_concurrency": self.inference_concurrency,
                "retries": self.assembly.retries,
                "max_turns": self.limits.max_turns, "max_tokens": self.limits.max_tokens,
                "temperature": self.limits.temperature,
                "overprovision": self.assembly.overprovision,
                "policy": type(self.policy).__name__, "run_id": self.run_id,
                **({"agent": self.agent.label} if self.agent is not None else {})}

    async def start(self) -> None:
        """Resolve envs, open the store (resuming what it holds), start the pool and pre-warm."""
        if self._started:
            return
        self._changed = asyncio.Event()
        entries = self.env_entries
        if self.env_servers:
            from corral.serve.client import remote_entries

            entries = await asyncio.to_thread(remote_entries, entries, self.env_servers)
        self.sources, probes = await asyncio.to_thread(resolve_envs, entries)
        if not self._spares_given:
            self.warm_spares = default_spares(self.sandbox_capacity,
                                              slow_starts=await self._slow_starts())
        if self.env_weights and len(self.env_weights) != len(self.sources):
            raise ValueError(f"env_weights has {len(self.env_weights)} entries for "
                             f"{len(self.sources)} envs")
        if self.run_dir is not None:
            self.store = TrajectoryStore(self.run_dir)
            stored = await asyncio.to_thread(self.store.open, self.config())
            self._stored = {t.id: t for t in stored}
            self._stored_plans = self._plans_of(stored)
            self._consumed = list(self.store.cursor.get("consumed_groups", []))
            self._consumed_set = set(self._consumed)
            self.counts["batches"] = int(self.store.cursor.get("batches", 0))
            if stored:
                log.info("resuming %s: %d trajectories stored, %d groups consumed",
                         self.run_dir, len(stored), len(self._consumed))
        turns = (TurnLog(self.run_dir) if self.run_dir is not None and self.assembly.turn_snapshots
                 and self.agent is None and self.backend == "asyncio" else None)
        self.boundaries = Boundaries(self.assembly, turns, self._spawn)
        if self.boundaries.recorded:
            log.info("resuming %s: %d episodes stopped mid-way", self.run_dir,
                     len(self.boundaries.recorded))
        if self._named:  # a killed earlier process of this run may have left sandboxes
            await asyncio.to_thread(reap_run, self.run_id, backend=self.sandbox_backend)
        if self.pool is None:
            # spares are held beyond the episode slots: a slot finds its sandbox started
            self.pool = SandboxPool(self.sandbox_capacity + self.warm_spares,
                                    backend=self.sandbox_backend,
                                    run_id=self.run_id)
        if self.agent is not None:
            from corral.runner.agents.proxy import AgentProxy

            self.proxy = await AgentProxy().start()
        self.executor = self._make_executor(probes)
        await self._prewarm()
        self._started = True

    async def _slow_starts(self) -> bool:
        """Whether a pooled env's sandboxes come from a backend of `SLOW_STARTS`."""
        from corral.errors import UnknownBackend
        from corral.sandbox.backends import config_row, resolve_backend

        backend = self.sandbox_backend
        if not isinstance(backend, str):  # a backend's config (a Docker fleet)
            return config_row(backend).name in SLOW_STARTS
        for source in self.sources:
            if not source.pooled:
                continue
            try:
                if await resolve_backend(source.spec, backend, strict=False) in SLOW_STARTS:
                    return True
            except UnknownBackend:  # said in full by the first sandbox the run opens
                continue
        return False

    def on_deck(self) -> int:
        """Episodes that decode their first turn ahead of a slot beyond the sandbox capacity
        (`deck_depth`)."""
        return deck_depth(self.sandbox_capacity, self.warm_spares)

    def _make_executor(self, probes: list[Any]) -> Executor:
        assert self.pool is not None
        if not isinstance(self.backend, str):
            return self.backend
        if self.backend == "asyncio":
            inference = asyncio.Semaphore(self.inference_concurrency)
            return LocalExecutor(self.sources, probes, self.policy, self.limits, inference,
                                 self.pool, self.sandbox_capacity, on_deck=self.on_deck(),
                                 agent=self.agent, proxy=self.proxy)
        try:
            module = importlib.import_module(f"corral.runner.{self.backend}_backend")
        except ModuleNotFoundError as exc:
            raise CorralError(f"unknown runner backend {self.backend!r} ({exc}); use 'asyncio' "
                              "or 'ray' (needs `pip install ray`)") from None
        return module.make_executor(self, probes)

    async def _prewarm(self) -> None:
        assert self.pool is not None
        pooled = {}
        for source in self.sources:
            if source.pooled:
                pooled.setdefault(source.spec.model_dump_json(), source)
        if not pooled:
            return
        each = self.prewarm if self.prewarm is not None else \
            max(1, self.pool.capacity // len(pooled))
        demand = getattr(self.executor, "demand", None)
        for source in pooled.values():  # sets targets; the starts run in the background
            await self.pool.prewarm(source.spec, each, env_id=source.label,
                                    demand=demand(source.spec) if demand else None)

    async def close(self) -> None:
        """Cancel in-flight episodes (their sandboxes are released), close the pool and the
        store, and write `metrics.json`. The policy is the caller's to close."""
        if not self._started or self._closing:
            return
        self._closing = True
        flights = [f.task for f in self._flights.values()]
        for task in flights:
            task.cancel()
        await asyncio.gather(*flights, return_exceptions=True)
        if self.executor is not None:
            await self.executor.close()
        if self.proxy is not None:
            await self.proxy.close()
        if self.pool is not None:
            await (self.pool.close() if self._own_pool else self.pool.drain())
        if self._named and self._own_pool:  # all of its sandboxes are closed: any left leaked
            await asyncio.to_thread(reap_run, self.run_id, mine=True,
                                    backend=self.sandbox_backend)
        if self.run_dir is not None:
            await asyncio.to_thread(self.write_metrics)
        if self.store is not None:
            self.store.close()
        if self.boundaries is not None:
            self.boundaries.close()

    # --- planning ------------------------------------------------------------------------------
    def plan_group(self, group: int) -> tuple[int, int]:
        """(env index, task index) of group number `group`: a pure function of the seed, and
        with `assembly.dynamic_sampling` below 1 of the no-signal history too (a task whose
        last n groups all got equal rewards is kept with probability `dynamic_sampling ** n`,
        else another is drawn, at most `REDRAWS` times)."""
        keep = self.assembly.dynamic_sampling
        if keep < 1 and group in self._stored_plans:  # resumed: the plan it was stored under
            return self._stored_plans[group]
        rng = random.Random(f"corral:{self.seed}:{group}")
        for _ in range(REDRAWS if keep < 1 else 1):
            env_index = (rng.choices(range(len(self.sources)), weights=self.env_weights)[0]
                         if self.env_weights else rng.randrange(len(self.sources)))
            chosen = env_index, rng.randrange(self.sources[env_index].num_tasks)
            flat = self._no_signal.get(chosen, 0)
            if not flat or rng.random() < keep ** flat:
                break
            self.counts["resampled"] += 1
        return chosen

    def _plans_of(self, stored: Iterable[Trajectory]) -> dict[int, tuple[int, int]]:
        """(env index, task index) of each stored group, from its trajectories' ids and
        metadata: under dynamic sampling a group's plan depends on what had come back when it
        was launched, so a resumed run reuses the stored plan rather than redrawing it."""
        index = {source.label: i for i, source in enumerate(self.sources)}
        plans: dict[int, tuple[int, int]] = {}
        for traj in stored:
            task = traj.metadata.get("task_index")
            if traj.group_id.startswith("g") and traj.group_id[1:].isdigit() and \
                    traj.env_id in index and isinstance(task, int):
                plans.setdefault(int(traj.group_id[1:]), (index[traj.env_id], task))
        return plans

    def work_items(self, group: int, size: int) -> list[WorkItem]:
        """The `size` samples of group `group` (deterministic ids and sampling seeds)."""
        env_index, task_index = self.plan_group(group)
        label = self.sources[env_index].label
        items = []
        for sample in range(size):
            digest = hashlib.sha256(f"{self.seed}:{group}:{sample}".encode()).digest()
            items.append(WorkItem(group, sample, env_index, label, task_index,
                                  int.from_bytes(digest[:4], "big")))
        return items

    def _launch_group(self, group: int, size: int) -> list[WorkItem]:
        items = self.work_items(group, size)
        if group not in self._collect_groups:
            self.assembler.expect(group, size)
        fresh = []
        for item in items:
            stored = self._stored.pop(item.id, None)
            if stored is not None and (stored.env_id, stored.metadata.get("task_index")) != (
                    item.env_id, item.task_index):
                stored = None  # planned another task this time (dynamic sampling): rerun
            if stored is not None:  # resumed: already collected before a restart
                self.counts["resumed"] += 1
                self._accept(stored, item)
            else:
                fresh.append(item)
        assert self.boundaries is not None
        pooled = self.sources[items[0].env_index].pooled if items else False
        # a tree group when none of it was stored (its trees branch at their roots' turns)
        for item in self.boundaries.plan(fresh, pooled) if len(fresh) == len(items) else fresh:
            self._spawn(item, self.boundaries.start_for(item, pooled))
        return items

    def _spawn(self, item: WorkItem, start: TurnBoundary | None = None) -> None:
        task = asyncio.ensure_future(self._run_item(item, start))
        flight = _Flight(item, task, self.policy.version)
        self._flights[item.id] = flight
        self.counts["launched"] += 1
        task.add_done_callback(lambda t, f=flight: self._flight_done(f, t))

    def _flight_done(self, flight: _Flight, task: asyncio.Task[None]) -> None:
        if self._flights.get(flight.item.id) is flight:
            del self._flights[flight.item.id]
        if task.cancelled():
            if flight.cut and not self._closing:  # restarted from scratch, current weights
                self._spawn(dataclasses.replace(flight.item, restart=flight.item.restart + 1))
            return
        exc = task.exception()
        if exc is not None and self._crash is None:
            log.error("work item %s crashed: %r", flight.item.id, exc)
            self._crash = exc
            self._notify()

    async def _run_item(self, item: WorkItem, start: TurnBoundary | None = None) -> None:
        assert self.executor is not None and self.boundaries is not None
        causes: list[str] = []
        backoff = self.assembly.backoff()
        first_failure: float | None = None
        for attempt in itertools.count(1):
            # a tree's root retried after it branched continues from its branch point
            start = self.boundaries.retry_start(item, start)
            hook = self.boundaries.hook(item)
            options: dict[str, Any] = {}
            if start is not None:
                options["start"] = start
            if hook is not None:
                options["at_boundary"] = hook
            traj = await self.executor.run(item, attempt, **options)
            if traj.status is not Status.INFRA_ERROR:
                break
            causes.append(traj.error or "unknown infrastructure error")
            if first_failure is None:
                first_failure = time.monotonic()
            # an immediate retry meets the same fault (a daemon restarting takes seconds):
            # wait, longer each time, within the retry budget
            pause = (backoff.pause(attempt, time.monotonic() - first_failure)
                     if attempt <= self.assembly.retries else None)
            if pause is None:
                break
            log.info("%s attempt %d failed (infra): %s; retrying in %.2f s", item.id, attempt,
                     traj.error, pause)
            await asyncio.sleep(pause)
        if causes:
            traj.metadata["infra_causes"] = causes
        if start is not None and item.id not in self.boundaries.trees:
            traj.metadata["resumed_at_turn"] = start.turn  # continued after a crash
        if item.id in self.boundaries.restarted:  # its backend could not snapshot
            traj.metadata["restarted_after_turn"] = self.boundaries.restarted.pop(item.id)
        await self.boundaries.finished(item, traj)
        self._note_infra(traj)
        if self.store is not None:
            await self.store.append(traj)
        await self.boundaries.stored(item)
        self.counts["finished"] += 1
        self._accept(traj, item)

    def _note_infra(self, traj: Trajectory) -> None:
        """Say on stderr (a warning) when episodes keep failing on infrastructure after their
        retries, and stop the run (`InfraError` from `batches`/`collect`) once only such
        failures have finished for longer than the retry budget: a dead env server or
        sandbox backend, which retrying further would only hammer."""
        if traj.status is not Status.INFRA_ERROR:
            self._infra_streak, self._infra_since = 0, None
            return
        now = time.monotonic()
        self._infra_streak += 1
        if self._infra_since is None:
            self._infra_since = now
        streak, spent = self._infra_streak, now - self._infra_since
        if streak >= 4 and streak & (streak - 1) == 0:  # 4, 8, 16 ...: heard, not flooded
            log.warning("%d episode(s) in a row failed on infrastructure after their retries; "
                        "last: %s", streak, traj.error)
        if spent > self.assembly.retry_budget and streak >= 2 and self._stalled is None:
            self._stalled = InfraError(
                f"stopping: every episode for {spent:.0f} s ({streak} in a row) failed on "
                f"infrastructure after its retries (retry budget {self.assembly.retry_budget:g}"
                f" s); last: {traj.error}")
            self._notify()

    def _accept(self, traj: Trajectory, item: WorkItem) -> None:
        if item.group in self._collect_groups:
            self._results[traj.id] = traj  # until collect() hands it over
        else:
            state = self.assembler.groups[item.group]
            fate = self.assembler.add(traj, item.group)
            if fate is not None:
                self._judged(state.trainable(), fate, item)
        for listener in self._listeners:
            listener(traj)
        self._top_up()
        self._notify()

    def _judged(self, members: list[Trajectory], fate: str, item: WorkItem) -> None:
        """Tally a complete group (the streak without signal, the rollouts since the last
        batch) and its task's no-signal history (dynamic sampling)."""
        threshold = self.sources[item.env_index].threshold
        rewards = [t.reward for t in members]
        solved = [r >= threshold - 1e-9 for r in rewards]
        if fate == "ready":
            self.streak = RolloutTally()
        else:
            self.streak.add(rewards, solved, fate)
        self._since_batch.add(rewards, solved, fate)
        task = (item.env_index, item.task_index)
        if fate == "filtered":
            self._no_signal[task] = self._no_signal.get(task, 0) + 1
        elif fate == "ready":
            self._no_signal.pop(task, None)

    def _top_up(self) -> None:
        """Launch groups for the active `batches()` stream: the look-ahead, then saturation."""
        if self._stream is None or self._closing or self._topping_up:
            return
        group, needed, ahead, saturation = self._stream
        self._topping_up = True  # resumed groups finish inside _launch_group: no recursion
        try:
            while (len(self.assembler.groups) < ahead
                   or (len(self.assembler.ready) < needed
                       and len(self._flights) + self._tree_waiting() < saturation)):
                self._launch_group(self._next_free_group(), group)
        finally:
            self._topping_up = False

    def _tree_waiting(self) -> int:
        return self.boundaries.waiting() if self.boundaries is not None else 0

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def _wait_change(self) -> None:
        assert self._changed is not None
        await self._changed.wait()
        self._changed.clear()
        if self._stalled is not None:
            raise self._stalled
        if self._crash is not None:
            raise CorralError(f"a rollout task crashed: {type(self._crash).__name__}: "
                              f"{self._crash}") from self._crash

    def _next_free_group(self) -> int:
        while f"g{self._next_group:06d}" in self._consumed_set:
            self._next_group += 1
        group = self._next_group
        self._next_group += 1
        return group

    # --- the two ways to collect ---------------------------------------------------------------
    def add_listener(self, callback: TrajectoryCallback) -> None:
        """Call `callback(trajectory)` for every finished trajectory (progress displays)."""
        self._listeners.append(callback)

    async def collect(self, n: int, *, group: int = 1) -> list[Trajectory]:
        """Collect `n` trajectories (in groups of `group` samples of one task) and return them
        in id order: every outcome, including infrastructure failures after their retries."""
        self._require_started()
        if n < 1 or group < 1:
            raise ValueError("collect needs n >= 1 and group >= 1")
        await self._record_group(group)
        ids: list[str] = []
        for _ in range(math.ceil(n / group)):
            g = self._next_free_group()
            self._collect_groups.add(g)
            ids.extend(item.id for item in self._launch_group(g, group))
        ids = ids[:n]
        while not all(i in self._results for i in ids):
            await self._wait_change()
        # handed over: the runner keeps no trajectory it returned (long runs stay bounded)
        return [self._results.pop(i) for i in ids]

    async def _record_group(self, group: int) -> None:
        """Record the group size in the run's manifest: a resume with another one would mix
        group sizes in one store (`StoreMismatch`)."""
        if self.store is not None:
            await asyncio.to_thread(self.store.record, group=group)

    async def batches(self, size: int = 256, group: int = 8, *,
                      max_batches: int | None = None) -> AsyncIterator[Batch]:
        """Yield batches of `size // group` whole groups (`size` must be a multiple of `group`).

        Time to trainable batch is measured from the moment the consumer asks for a batch to
        the moment one is ready; work still running is carried into the next batch."""
        self._require_started()
        if group < 1 or size < group or size % group:
            raise ValueError(f"size ({size}) must be a positive multiple of group ({group})")
        await self._record_group(group)
        needed = size // group
        ahead = max(needed, math.ceil(needed * (1 + self.assembly.overprovision)))
        later_give_up = 20 * ahead + 100
        produced = 0
        # runs without sandboxes keep only the look-ahead (see module docstring)
        pooled = any(source.pooled for source in self.sources)
        # enough items waiting for a slot that the warm spares have takers (pool demand); a
        # shared pool's spares are whatever room it has beyond this runner's slots
        spares = max(0, self.pool.capacity - self.sandbox_capacity) if self.pool else 0
        saturation = self.sandbox_capacity + spares + group if pooled else 0
        self._stream = (group, needed, ahead, saturation)
        try:
            while max_batches is None or produced < max_batches:
                asked = time.perf_counter()
                while True:
                    self._top_up()
                    batch = self.assembler.take(needed, self.policy.version)
                    if batch is not None:
                        break
                    first = self.counts["batches"] == 0
                    give_up = (self.assembly.first_signal_groups
                               if first and self.assembly.first_signal_groups else
                               later_give_up)
                    if self.streak.groups >= give_up:
                        raise NoTrainableGroups(
                            f"{self.streak.groups} groups in a row were filtered or discarded "
                            f"(equal rewards or infrastructure failures; "
                            f"{self.streak.describe()}); check the env and policy, or pass "
                            "assembly=AssemblyConfig(filter_zero_variance=False)",
                            self.streak.groups, dataclasses.replace(self.streak), first)
                    await self._wait_change()
                batch.stats.update(self._batch_stats(batch, time.perf_counter() - asked))
                self.metrics.record_batch(batch.stats)
                for group_id in self.assembler.group_ids(batch):
                    self._consumed.append(group_id)
                    self._consumed_set.add(group_id)
                self.counts["batches"] += 1
                if self.store is not None:
                    await asyncio.to_thread(self.store.update_cursor, self.counts["batches"],
                                            list(self._consumed))
                produced += 1
                self._top_up()  # refill for the next batch while the consumer trains
                yield batch
        finally:
            self._stream = None

    def _batch_stats(self, batch: Batch, waited: float) -> dict[str, Any]:
        """A batch's figures; `rollouts` tallies every complete group since the previous
        batch, filtered ones included (the policy's own pass rate and mean reward)."""
        rollouts, self._since_batch = self._since_batch, RolloutTally()
        return {"index": self.counts["batches"], "time_to_batch": waited,
                "inflight": len(self._flights), "policy_version": batch.policy_version,
                "assembled_at": time.time(), "rollouts": rollouts.as_dict(),
                **batch_summary(batch)}

    # --- policy updates ------------------------------------------------------------------------
    def on_policy_update(self, version: int) -> int:
        """The trainer published `version`. Servers that do not report versions are told it;
        with `assembly.max_staleness` set, episodes started before `version - max_staleness`
        are cut and restarted. Returns how many were cut."""
        set_version = getattr(self.policy, "set_version", None)
        if set_version is not None and self.policy.version < version:
            set_version(version)
        max_staleness = self.assembly.max_staleness
        if max_staleness is None:
            return 0
        return self.cut_inflight(older_than=version - max_staleness)

    def cut_inflight(self, older_than: int | None = None) -> int:
        """Cancel in-flight episodes started under a policy version below `older_than`
        (default: the current version) and restart them from scratch; their sandboxes are
        replaced. Returns how many were cut (counted in `counts["cut"]`)."""
        limit = self.policy.version if older_than is None else older_than
        cut = 0
        for flight in list(self._flights.values()):
            if flight.version < limit and not flight.cut:
                flight.cut = True
                flight.task.cancel()
                cut += 1
        self.counts["cut"] += cut
        return cut

    # --- introspection -------------------------------------------------------------------------
    @property
    def inflight(self) -> int:
        """Work items running now."""
        return len(self._flights)

    def stats(self) -> dict[str, Any]:
        """Counters, assembly totals, executor/pool stats and policy/router stats."""
        turns = self.boundaries.counts if self.boundaries is not None else {}
        return {"counts": dict(self.counts, **turns, inflight=len(self._flights)),
                "assembly": self.assembler.totals.as_dict(),
                "executor": self.executor.stats() if self.executor is not None else {},
                "policy": policy_stats(self.policy)}

    def write_metrics(self) -> Path | None:
        """Write `RUN_DIR/metrics.json` (also done by `close`)."""
        if self.run_dir is None:
            return None
        from corral.runner.store import load_run

        _, trajectories = load_run(self.run_dir)
        data = self.metrics.build(trajectories, self.stats())
        path = self.run_dir / METRICS
        write_json_atomic(path, data)
        return path

    def _require_started(self) -> None:
        if not self._started:
            raise CorralError("use the Runner as `async with Runner(...) as runner:` "
                              "(or await runner.start()) before collecting")
        if self._closing:
            raise CorralError("this Runner is closed; create a new one")
