"""`RayEnvProxy`: the driver's view of an env living in a `RayEpisodeWorker`."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from corral.errors import SandboxDied
from corral.runner.pool import span_sink

__all__ = ["RayEnvProxy"]

log = logging.getLogger(__name__)


class RayEnvProxy:
    """The driver's view of an env living in a `RayEpisodeWorker`.

    Pure functions of a task (`pick_task`, `instruction`, `tool_schemas`) run on a local probe
    instance of the same env; everything that touches the episode goes to the actor.
    """

    def __init__(self, executor: Any, env_index: int, probe: Any) -> None:
        # `executor` is the `RayExecutor` that owns the workers (not imported: it imports this)
        self._executor, self._index, self._probe = executor, env_index, probe
        self._worker: int | None = None  # picked at the first remote call (after admission)
        self._actor: Any = None  # the actor holding this episode (a replacement holds none)
        self.env_id = probe.env_id
        self.system_prompt = probe.system_prompt
        self.sandbox_spec = probe.sandbox_spec
        self.max_turns = probe.max_turns
        self.episode: Any = None
        self._key = f"e{next(executor.keys)}"

    def pick_task(self, options: dict[str, Any] | None) -> Any:
        return self._probe.pick_task(options)

    def instruction(self, task: Any) -> str:
        return self._probe.instruction(task)

    def tool_schemas(self) -> list[dict[str, Any]]:
        return self._probe.tool_schemas()

    @property
    def worker(self) -> int:
        """The actor this env's episode lives in (the least loaded one when first asked)."""
        if self._worker is None:
            self._worker = self._executor.pick_worker()
        return self._worker

    async def _remote(self, method: str, *args: Any) -> Any:
        import ray

        worker = self.worker
        if self._actor is None:  # the episode's first call: on the worker's actor of now
            await self._executor.wait_ready(worker, method)
            self._actor = self._executor.actors[worker]
        elif self._actor is not self._executor.actors[worker]:
            raise SandboxDied(f"Ray sandbox worker {worker} was lost during this episode; "
                              f"{method} not run")
        actor = self._actor
        ref = getattr(actor, method).remote(*args)
        try:
            answer = await ref
        except asyncio.CancelledError:
            ray.cancel(ref)
            raise
        except ray.exceptions.RayError as exc:
            if isinstance(exc, ray.exceptions.RayActorError):
                self._executor.replace(worker, actor)
            raise SandboxDied(f"Ray sandbox worker {worker} failed during {method}: "
                              f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
        self._sync(answer.get("state"))
        sink = span_sink.get()
        if sink is not None:
            sink.extend(answer.get("spans", ()))
        if "raise" in answer:
            raise answer["raise"]
        return answer.get("result")

    def _sync(self, state: dict[str, Any] | None) -> None:
        if state is None:
            return
        from corral.env import Episode

        since = state.pop("since")
        messages = state.pop("messages")
        if self.episode is None or since == 0:
            self.episode = Episode(task=state["task"], messages=[])
        episode = self.episode
        del episode.messages[since:]
        episode.messages.extend(messages)
        for name, value in state.items():
            setattr(episode, name, value)

    async def areset(self, *, seed: int | None = None,
                     options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        await self._remote("reset", self._key, self._index, seed, options, self.max_turns)
        task = self.episode.task
        return self.instruction(task), {"task_id": task.id, "turn": 0}

    async def astep(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        since = len(self.episode.messages) if self.episode is not None else 0
        return await self._remote("step", self._key, action, since)

    async def afinish(self, *, truncated: bool = True) -> dict[str, Any]:
        since = len(self.episode.messages) if self.episode is not None else 0
        return await self._remote("finish", self._key, since, truncated)

    async def aclose(self) -> None:
        if self._worker is None:
            return  # never reached an actor: nothing to close there
        infra_error = self.episode.infra_error if self.episode is not None else None
        try:
            if self._actor is not None and self._actor is self._executor.actors[self._worker]:
                await self._remote("close", self._key, infra_error)
            # else the episode never reached an actor, or it died with its sandboxes
        finally:
            self._executor.release(self._worker)
