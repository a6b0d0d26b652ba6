"""Held-out evaluation during a training run: the lines of `eval.jsonl`."""

from __future__ import annotations

from typing import Any

from corral.runner.eval.heldout import score_held_out

from .config import TrainConfig
from .tasks import EnvEntry

__all__ = ["held_out_eval"]


async def held_out_eval(config: TrainConfig, policy: Any, step: int, envs: list[EnvEntry],
                        stage: str = "rl") -> dict[str, Any]:
    """Mean reward and pass rate on held-out tasks (a task slice's test part, else a separate
    seed's task plan over the whole dataset), one sample per task, scored by
    `corral.runner.eval.heldout.score_held_out`."""
    scores = await score_held_out(
        envs, policy, config.eval_tasks, sandbox_capacity=config.sandbox_capacity,
        inference_concurrency=config.inference_concurrency, limits=config.episode_limits(),
        seed=config.seed + 1_000_003, env_weights=config.env_weights(),
        agent=config.external_agent())
    return {"step": step, "stage": stage, "version": policy.version, **scores}
