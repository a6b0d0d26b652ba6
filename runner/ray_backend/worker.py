"""`RayEpisodeWorker`: the Ray actor that holds env instances and a sandbox pool (see the
package docstring)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, Callable, Sequence

from corral.runner.pool import SandboxPool, span_sink
from corral.runner.trajectory import Span

__all__ = ["RayEpisodeWorker"]

log = logging.getLogger(__name__)


_NOT_MIRRORED = ("messages", "sandbox")  # messages travel incrementally; sandboxes stay


def _episode_state(env: Any, since: int) -> dict[str, Any] | None:
    """What the driver's mirror of `env.episode` needs: its fields, messages from `since`."""
    episode = env.episode
    if episode is None:
        return None
    state = {f.name: getattr(episode, f.name) for f in dataclasses.fields(episode)
             if f.name not in _NOT_MIRRORED}
    state["messages"] = [dict(m) for m in episode.messages[since:]]
    state["since"] = since
    return state


class RayEpisodeWorker:
    """A Ray actor (see `ray.remote(RayEpisodeWorker)`): env instances and a sandbox pool.

    Every method returns a dict with the call's `result` (or `raise`: the exception the env
    raised), the episode `state` for the driver's mirror and the `spans` recorded meanwhile.
    """

    def __init__(self, factories: Sequence[Callable[[], Any]], capacity: int, *,
                 sandbox_backend: str = "auto", run_id: str = "ray",
                 prewarm: Sequence[tuple[Any, str, int]] = ()) -> None:
        self.factories = list(factories)
        self.capacity = capacity
        self.sandbox_backend, self.run_id = sandbox_backend, run_id
        self.prewarm_targets = list(prewarm)
        self.pool: SandboxPool | None = None
        self.free: list[list[Any]] = [[] for _ in self.factories]
        self.active: dict[str, tuple[int, Any]] = {}
        self.made = 0
        self.episodes = 0

    def _ensure_pool(self) -> SandboxPool:
        if self.pool is None:  # created on the actor's event loop, at the first call
            self.pool = SandboxPool(self.capacity, backend=self.sandbox_backend,
                                    run_id=self.run_id)
            for spec, env_id, count in self.prewarm_targets:
                asyncio.ensure_future(self.pool.prewarm(spec, count, env_id=env_id))
        return self.pool

    async def start(self) -> str:
        """Create the pool and start pre-warming; returns the id of the node it runs on."""
        import ray

        self._ensure_pool()
        return ray.get_runtime_context().get_node_id()

    def _checkout(self, index: int) -> Any:
        if self.free[index]:
            return self.free[index].pop()
        env = self.factories[index]()
        self.made += 1
        if env.sandbox_spec is not None:  # every kind of sandbox is pooled (runner.pool)
            env.sandbox_provider = self._ensure_pool()
        return env

    async def _call(self, key: str, since: int, fn: Callable[[Any], Any]) -> dict[str, Any]:
        _, env = self.active[key]
        spans: list[Span] = []
        token = span_sink.set(spans)
        answer: dict[str, Any] = {}
        try:
            answer["result"] = await fn(env)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the driver re-raises it in the episode loop
            answer["raise"] = exc
        finally:
            span_sink.reset(token)
        answer["state"] = _episode_state(env, since)
        answer["spans"] = spans
        return answer

    async def reset(self, key: str, env_index: int, seed: int | None,
                    options: dict[str, Any] | None, max_turns: int | None) -> dict[str, Any]:
        """Check out an env for episode `key` and reset it (sandbox acquired from the pool)."""
        env = self._checkout(env_index)
        if max_turns is not None:
            env.max_turns = max_turns
        self.active[key] = (env_index, env)
        self.episodes += 1
        return await self._call(key, 0, lambda e: e.areset(seed=seed, options=options))

    async def step(self, key: str, action: Any, since: int) -> dict[str, Any]:
        """`env.astep(action)` for episode `key`."""
        return await self._call(key, since, lambda e: e.astep(action))

    async def finish(self, key: str, since: int, truncated: bool) -> dict[str, Any]:
        """`env.afinish(truncated=...)`: end episode `key` now and run its final rewards."""
        return await self._call(key, since, lambda e: e.afinish(truncated=truncated))

    async def close(self, key: str, infra_error: str | None) -> dict[str, Any]:
        """Release episode `key`'s sandbox (replaced, not reused, after an infra error)."""
        entry = self.active.pop(key, None)
        if entry is None:
            return {"result": None}
        index, env = entry
        try:
            if env.episode is not None and infra_error is not None:
                env.episode.infra_error = infra_error
            await env.aclose()
        except Exception as exc:
            return {"raise": exc}
        finally:
            env.episode = None
            self.free[index].append(env)
        return {"result": None}

    def stats(self) -> dict[str, Any]:
        return {"env_instances": self.made, "episodes": self.episodes, "active": len(self.active),
                "pool": self.pool.snapshot() if self.pool is not None else {}}

    async def shutdown(self) -> None:
        """Close every env still open and the pool."""
        for key in list(self.active):
            await self.close(key, "worker shut down")
        if self.pool is not None:
            await self.pool.close()
