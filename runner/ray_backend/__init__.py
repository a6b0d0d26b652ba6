"""`backend="ray"`: environments and their sandboxes live in Ray actors; the policy stays here.

    ray.init(address="auto")                 # or nothing: a local Ray instance is started
    async with Runner(envs=[...], policy=policy, backend="ray", sandbox_capacity=256) as r:
        ...

The episode loop (`corral.runner.episode`) runs unchanged in the driver, next to the policy and
its router (the GPU side). What it does to its env (`areset`, `astep`, the verifier, `aclose`)
goes to a `RayEpisodeWorker` actor that holds env instances and a `SandboxPool`: sandboxes,
their commands and the verifiers run wherever Ray places the workers, so sandbox/CPU capacity
scales across machines apart from the GPUs. The driver sees each env through a `RayEnvProxy`, a
thin proxy whose `episode` mirrors the actor's after every call; messages cross the wire
incrementally. Because the loop, the tokenization and the policy calls are the same code as
the asyncio backend, the same seeds give the same trajectories.

Capacity: the run's `sandbox_capacity` is split over the workers (their pools' capacities sum
to it) and episodes are admitted by the same capacity semaphore as in the asyncio backend, each
to the worker with the most free room. Errors raised in a worker come back as the same
exception (an `InfraError` stays an `InfraError`, so the runner retries it); a worker that dies
surfaces as `SandboxDied` for the episodes it held.

Across nodes: a node that runs sandboxes advertises a custom resource, `sandbox`, whose amount
is the sandboxes it holds (`ray start --resources '{"sandbox": 64}'`; GPU nodes advertise
none). When the cluster has it, there is one worker per such node, the run's capacity is dealt
out over them up to each node's amount, and each worker reserves its share (`{"sandbox":
share}`, softly pinned to its node), so sandbox capacity scales with the sandbox nodes alone.
When a node dies, its workers' episodes fail as infrastructure errors (`SandboxDied`) and the
runner retries them on the other workers (nothing lost, nothing counted twice); the worker is
restarted wherever its share fits; until it runs, episodes go to running workers, and one
sent to it that waits past `start_timeout_s` retires it (its share leaves the run). As on the
asyncio backend, only `Runner.on_deck()` episodes beyond the capacity decode their first turn
ahead of a slot.

Options (`Runner(..., backend_options={...})` when the runner passes them, else defaults):
`workers` (default: one per `sandbox` node, else the cluster's CPUs; at most the capacity),
`worker_cpus` (CPUs Ray reserves per worker, default 1), `sandbox_resource` (the resource's
name, default "sandbox"; None: place by CPUs only), `start_timeout_s` (default 120),
`ray_init` (kwargs for `ray.init` when Ray is not initialised yet).
"""

from __future__ import annotations

from corral.runner.ray_backend.executor import RayExecutor, deal, make_executor, sandbox_nodes
from corral.runner.ray_backend.proxy import RayEnvProxy
from corral.runner.ray_backend.worker import RayEpisodeWorker

__all__ = ["RayEnvProxy", "RayEpisodeWorker", "RayExecutor", "deal", "make_executor",
           "sandbox_nodes"]
