"""`RayExecutor`: runs episodes' env work in `RayEpisodeWorker` actors, and how a run's
sandbox capacity is dealt out over the cluster's sandbox nodes."""

from __future__ import annotations

import contextlib
import asyncio
import itertools
import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from corral.errors import CorralError, SandboxDied
from corral.runner.episode import EpisodeLimits, WorkItem, run_episode
from corral.runner.executor import EnvSource, admission_slot, on_deck
from corral.runner.policy import Policy
from corral.runner.ray_backend.proxy import RayEnvProxy
from corral.runner.ray_backend.worker import RayEpisodeWorker
from corral.runner.trajectory import Trajectory

__all__ = ["RayExecutor", "SpecFactory", "deal", "make_executor", "sandbox_nodes"]

log = logging.getLogger(__name__)

class RayExecutor:
    """Runs episodes' env work in `RayEpisodeWorker` actors (the runner's `Executor`)."""

    def __init__(self, sources: list[EnvSource], probes: list[Any], policy: Policy,
                 limits: EpisodeLimits, inference: asyncio.Semaphore, capacity: int, *,
                 entries: Sequence[Any] | None = None,
                 workers: int | None = None, worker_cpus: float = 1.0,
                 sandbox_backend: str = "auto", run_id: str = "ray", prewarm: int | None = None,
                 sandbox_resource: str | None = "sandbox", start_timeout_s: float = 120.0,
                 ray_init: dict[str, Any] | None = None, deck: int = 1) -> None:
        import ray
        from ray import cloudpickle  # Ray serializes with its own copy of cloudpickle

        if not ray.is_initialized():
            ray.init(**{"include_dashboard": False, **(ray_init or {})})
        self.sources, self.probes, self.policy, self.limits = sources, probes, policy, limits
        self.inference = inference
        self.admission = asyncio.Semaphore(capacity)
        self.deck = asyncio.Semaphore(capacity + max(1, deck))  # as LocalExecutor's
        self.start_timeout_s = start_timeout_s
        # sandbox nodes (alive, advertising the resource) -> the share each worker reserves
        rooms = sandbox_nodes(sandbox_resource) if sandbox_resource else {}
        self.resource = sandbox_resource if rooms else None
        homes: list[str | None]
        if rooms and workers is None:
            homes, shares = deal(capacity, rooms)
        else:
            if workers is None:
                cpus = int(ray.cluster_resources().get("CPU", 1) // max(worker_cpus, 1e-9)) or 1
                workers = max(1, min(capacity, cpus))
            shares = [capacity // workers + (i < capacity % workers) for i in range(workers)]
            homes = [None] * len(shares)
        self.homes = [h for h, s in zip(homes, shares) if s > 0]
        self.capacities = [s for s in shares if s > 0]
        self.load = [0] * len(self.capacities)
        self.keys = itertools.count()
        entries = list(entries) if entries is not None else [s.factory for s in sources]
        factories = [_shippable(entry, source) for entry, source in zip(entries, sources)]
        for factory in factories:  # test modules and scripts are not importable in workers
            module = getattr(getattr(factory, "func", factory), "__module__", None)
            _pickle_by_value(module, cloudpickle)
        pooled = [(s.spec, s.label) for s in sources if s.pooled]
        actor_cls = ray.remote(RayEpisodeWorker)

        def spawn(worker: int) -> Any:
            share = self.capacities[worker]
            each = prewarm if prewarm is not None else max(1, share // max(1, len(pooled)))
            targets = [(spec, label, min(each, share)) for spec, label in pooled]
            options: dict[str, Any] = {"num_cpus": worker_cpus, "max_concurrency": 10_000}
            if self.resource is not None:  # reserve the share on a sandbox node, its own first
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                options["resources"] = {self.resource: share}
                if self.homes[worker] is not None:
                    options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                        self.homes[worker], soft=True)
            return actor_cls.options(**options).remote(factories, share,
                                                       sandbox_backend=sandbox_backend,
                                                       run_id=run_id, prewarm=targets)

        self._spawn = spawn
        self.actors = [spawn(i) for i in range(len(self.capacities))]
        self.replaced = 0
        self.retired: set[int] = set()
        self.nodes: list[str | None] = [None] * len(self.actors)
        # a worker's pending start (None once it runs)
        self._started: list[Any] = [actor.start.remote() for actor in self.actors]
        self._ready: asyncio.Future[None] | None = None
        self._stats: list[dict[str, Any]] = [{} for _ in self.actors]

    async def _wait_started(self) -> None:
        import ray

        try:
            nodes = await asyncio.wait_for(asyncio.gather(*self._started),
                                           self.start_timeout_s)
        except ray.exceptions.RayError as exc:
            first = str(exc).strip().splitlines()[-1]
            raise CorralError(f"the Ray sandbox workers could not start ({first}); the env "
                              "classes and their modules must be importable (or picklable) "
                              "on every Ray node") from exc
        except asyncio.TimeoutError:
            raise CorralError(f"the Ray sandbox workers were not placed within "
                              f"{self.start_timeout_s:.0f} s (shares {self.capacities} of the "
                              f"{self.resource or 'CPU'} resource; cluster has "
                              f"{ray.available_resources()}); lower sandbox_capacity or add "
                              "nodes") from None
        self.nodes = list(nodes)
        self._started = [None] * len(self.actors)  # all running: no start to wait for

    async def wait_ready(self, worker: int, method: str) -> None:
        """Wait until worker `worker` (a replacement, maybe) runs; one that cannot be placed
        within `start_timeout_s` is retired and the episode fails as an infra error."""
        if worker in self.retired:
            raise SandboxDied(f"Ray sandbox worker {worker} was retired (its node is gone); "
                              f"{method} not run")
        started = self._started[worker]
        if started is None:
            return
        try:
            self.nodes[worker] = await asyncio.wait_for(asyncio.shield(started),
                                                        self.start_timeout_s)
        except asyncio.TimeoutError:
            self.retire(worker, f"not placed within {self.start_timeout_s:.0f} s")
            raise SandboxDied(f"Ray sandbox worker {worker} could not be placed (no node has "
                              f"room for its {self.capacities[worker]} sandboxes); "
                              "retired") from None
        except Exception:  # the actor died starting: `_remote` below replaces it
            return
        if self._started[worker] is started:
            self._started[worker] = None

    def _running(self, worker: int) -> bool:
        """Whether worker `worker` has started (a replacement may wait for room)."""
        import ray

        started = self._started[worker]
        return started is None or bool(ray.wait([started], timeout=0)[0])

    def pick_worker(self) -> int:
        """The least loaded running worker (else the least loaded one still starting),
        counted as one episode busier (`release` undoes it)."""
        room = [(not self._running(i), self.load[i] / c, i)
                for i, c in enumerate(self.capacities) if i not in self.retired]
        if not room:
            raise SandboxDied("every Ray sandbox worker was lost; no node has room for one")
        index = min(room)[2]
        self.load[index] += 1
        return index

    def replace(self, worker: int, dead: Any) -> None:
        """Start a new actor in place of worker `worker` (once, however many episodes saw it
        die), wherever its share fits. Its sandboxes died with it; the runner retries their
        episodes."""
        if self.actors[worker] is dead and worker not in self.retired:
            log.warning("Ray sandbox worker %d died; starting a replacement", worker)
            self.actors[worker] = self._spawn(worker)
            self._started[worker] = self.actors[worker].start.remote()
            self.replaced += 1

    def retire(self, worker: int, why: str) -> None:
        """Take worker `worker` out of the run (its share cannot be placed anywhere now)."""
        import ray

        if worker in self.retired:
            return
        log.warning("Ray sandbox worker %d retired: %s; the run goes on with %d sandboxes",
                    worker, why, sum(c for i, c in enumerate(self.capacities)
                                     if i != worker and i not in self.retired))
        self.retired.add(worker)
        ray.kill(self.actors[worker])

    def release(self, worker: int) -> None:
        self.load[worker] = max(0, self.load[worker] - 1)

    async def run(self, item: WorkItem, attempt: int) -> Trajectory:
        """One attempt at `item`: admitted by capacity, env work on the least-loaded worker."""
        if self._ready is None:  # every episode waits for the same start-up
            self._ready = asyncio.ensure_future(self._wait_started())
        await asyncio.shield(self._ready)
        env = RayEnvProxy(self, item.env_index, self.probes[item.env_index])
        pooled = self.sources[item.env_index].pooled
        try:
            if not pooled:
                return await run_episode(env, self.policy, item, self.limits, self.inference,
                                         attempt=attempt)
            async with on_deck(self.deck) as spans:
                return await run_episode(env, self.policy, item, self.limits, self.inference,
                                         attempt=attempt, spans=spans,
                                         admission=admission_slot(self.admission))
        finally:
            if pooled and env._worker is not None:
                asyncio.ensure_future(self._refresh(env._worker))

    async def _refresh(self, worker: int) -> None:
        if worker in self.retired or self._started[worker] is not None:
            return  # gone, or not running yet: nothing to ask
        try:
            self._stats[worker] = await asyncio.wait_for(self.actors[worker].stats.remote(),
                                                         self.start_timeout_s)
        except Exception:  # stats are best effort; the worker's failure surfaces elsewhere
            log.debug("stats of Ray worker %d unavailable", worker, exc_info=True)

    def stats(self) -> dict[str, Any]:
        """Workers, their capacities and their pool stats (summed over workers). Workers report
        after each episode, asynchronously, so the figures lag a little until `close`."""
        pool: dict[str, Any] = {}
        for snapshot in self._stats:
            for key, value in snapshot.get("pool", {}).items():
                if isinstance(value, list):
                    pool.setdefault(key, []).extend(value)
                elif isinstance(value, (int, float)):
                    pool[key] = pool.get(key, 0) + value
        return {"backend": "ray", "workers": len(self.actors), "capacities": self.capacities,
                "replaced_workers": self.replaced, "retired_workers": sorted(self.retired),
                "resource": self.resource, "nodes": list(self.nodes),
                "env_instances": sum(s.get("env_instances", 0) for s in self._stats),
                "pool": pool}

    async def close(self) -> None:
        """Shut the workers down (closing their sandboxes) and kill the actors."""
        import ray

        await asyncio.gather(*(self._refresh(i) for i in range(len(self.actors))))
        running = [a for i, a in enumerate(self.actors) if i not in self.retired and (
            self._started[i] is None or ray.wait([self._started[i]], timeout=0)[0])]
        results = await asyncio.gather(
            *(asyncio.wait_for(a.shutdown.remote(), self.start_timeout_s) for a in running),
            return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                log.warning("a Ray worker failed to shut down cleanly: %s", result)
        for actor in self.actors:
            ray.kill(actor)


def sandbox_nodes(resource: str) -> dict[str, int]:
    """Alive nodes advertising `resource` -> how many sandboxes each holds."""
    import ray

    return {node["NodeID"]: int(node["Resources"][resource]) for node in ray.nodes()
            if node.get("Alive") and node.get("Resources", {}).get(resource, 0) >= 1}


def deal(capacity: int, rooms: dict[str, int]) -> tuple[list[str | None], list[int]]:
    """Deal `capacity` sandboxes out over the nodes one at a time, up to each node's room:
    (node ids, shares). Past the cluster's total the run holds the total (logged)."""
    homes: list[str | None] = list(rooms)
    shares = [0] * len(homes)
    left = capacity
    while left and any(shares[i] < rooms[h] for i, h in enumerate(homes)):
        for i, home in enumerate(homes):
            if left and shares[i] < rooms[home]:
                shares[i] += 1
                left -= 1
    if left:
        log.warning("sandbox_capacity %d exceeds the cluster's sandbox resource (%d); the run "
                    "holds %d sandboxes at once", capacity, sum(rooms.values()), sum(shares))
    return homes, shares


def _shippable(entry: Any, source: EnvSource) -> Callable[[], Any]:
    """A factory a worker can call: for an env id, its registered entry point and kwargs (the
    worker need not have imported the module that registered it); else the factory itself."""
    if not isinstance(entry, str):
        return source.factory
    from corral.registry import spec

    env_spec = spec(entry)
    return SpecFactory(env_spec.load(), env_spec.id, dict(env_spec.kwargs), tuple(env_spec.tags))


@dataclass(frozen=True)
class SpecFactory:
    """`spec.make()` as a picklable factory for workers: the instance carries the spec's id and
    tags (a class listed in a manifest does not name them in code); `func` is the entry point,
    whose module is shipped by value when workers cannot import it."""

    func: Callable[..., Any]
    env_id: str
    kwargs: dict[str, Any]
    tags: tuple[str, ...] = ()

    def __call__(self) -> Any:
        from corral.catalog import EnvSpec

        return EnvSpec(self.env_id, self.func, dict(self.kwargs), tags=list(self.tags)).make()


def _pickle_by_value(module: str | None, cloudpickle: Any) -> None:
    import sys

    if module is None or module == "__main__" or module.startswith("corral"):
        return
    mod = sys.modules.get(module)
    if mod is not None:
        with contextlib.suppress(ValueError):  # built-in or already registered
            cloudpickle.register_pickle_by_value(mod)


def make_executor(runner: Any, probes: list[Any]) -> RayExecutor:
    """The runner's hook for `backend="ray"`. The driver's own pool is not used: its
    pre-warming is switched off and the workers pre-warm their pools instead."""
    options = dict(runner.backend_options)
    prewarm = runner.prewarm
    runner.prewarm = 0
    executor = RayExecutor(runner.sources, probes, runner.policy, runner.limits,
                           asyncio.Semaphore(runner.inference_concurrency),
                           runner.sandbox_capacity, entries=runner.env_entries,
                           sandbox_backend=runner.sandbox_backend,
                           run_id=runner.run_id, prewarm=prewarm,
                           deck=runner.on_deck(), **options)
    return executor
