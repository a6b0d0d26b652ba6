"""Held-out evaluation during a training run: the lines of `eval.jsonl`."""

from __future__ import annotations

from typing import Any

from .config import TrainConfig
from .runlog import reward_by_env
from .tasks import EnvEntry

__all__ = ["held_out_eval"]


async def held_out_eval(config: TrainConfig, policy: Any, step: int, envs: list[EnvEntry],
                        stage: str = "rl") -> dict[str, Any]:
    """Mean reward and pass rate on held-out tasks (a task slice's test part, else a separate
    seed's task plan over the whole dataset), one sample per task."""
    from corral.runner import Runner

    async with Runner(envs, policy, sandbox_capacity=config.sandbox_capacity,
                      inference_concurrency=config.inference_concurrency,
                      limits=config.episode_limits(), seed=config.seed + 1_000_003,
                      env_weights=config.env_weights(), agent=config.external_agent()) as ev:
        trajs = await ev.collect(config.eval_tasks, group=1)
        thresholds = {source.label: source.threshold for source in ev.sources}
    rewards = [t.reward for t in trajs]
    solved = sum(t.reward >= thresholds.get(t.env_id, 1.0) - 1e-9 for t in trajs)
    return {"step": step, "stage": stage, "version": policy.version, "tasks": len(rewards),
            "reward_mean": sum(rewards) / max(1, len(rewards)),
            "pass_rate": solved / max(1, len(rewards)), "by_env": reward_by_env(trajs)}
