"""Rejection-sampling fine-tuning (RFT) between warm-up and RL, in one run.

A round collects `rft_episodes` episodes of the training tasks (groups of `group` samples)
with the current policy, keeps those that solved their task (reward at least the env's
`pass_threshold`) and takes `rft_steps` supervised steps on them, with their exact token ids
(`corral.trainer.sft.supervised_warmup`, which publishes the new weights). It is the loop of
`corral collect`/`corral eval`, `corral export --filter success` and `--sft-from`, without the
files in between: on a model that rarely solves its tasks, its own successes make the cheapest
warm start (expert iteration, STaR). Each round is one line of `rft.jsonl`; its supervised
steps go to `sft.jsonl` with `"stage": "rft-<round>"`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from corral.runner.trajectory import Trajectory

from .config import TrainConfig
from .sft import supervised_warmup

__all__ = ["rft_round", "solved_episodes"]

log = logging.getLogger(__name__)


def solved_episodes(trajectories: list[Trajectory], thresholds: dict[str, float]
                    ) -> list[Trajectory]:
    """The trainable episodes that solved their task and generated something, by task id
    (one per distinct completion: a group that solved a task eight times alike counts once)."""
    kept: dict[tuple[str, str, tuple[int, ...]], Trajectory] = {}
    for traj in trajectories:
        threshold = thresholds.get(traj.env_id, 1.0)
        if traj.trainable and traj.generated_tokens and traj.reward >= threshold - 1e-9:
            kept.setdefault((traj.env_id, traj.task_id, tuple(traj.token_ids)), traj)
    return list(kept.values())


async def rft_round(config: TrainConfig, index: int, policy: Any, trainer: Any,
                    envs: list[Any], log_step: Callable[[dict[str, Any]], None]
                    ) -> dict[str, Any]:
    """Round `index` (from 1): collect, keep the solved episodes, fine-tune on them. Returns
    the round's record (episodes, solved, kept, pass rate, the supervised loss first and
    last; `skipped` when nothing solved)."""
    from corral.runner import Runner

    async with Runner(envs, policy, sandbox_capacity=config.sandbox_capacity,
                      inference_concurrency=config.inference_concurrency,
                      limits=config.episode_limits(), seed=config.seed + 7_000_003 * index,
                      env_weights=config.env_weights()) as runner:
        trajectories = await runner.collect(config.rft_episodes, group=config.group)
        thresholds = {source.label: source.threshold for source in runner.sources}
    kept = solved_episodes(trajectories, thresholds)
    solved = sum(t.trainable and t.reward >= thresholds.get(t.env_id, 1.0) - 1e-9
                 for t in trajectories)
    record: dict[str, Any] = {"round": index, "version": policy.version,
                              "episodes": len(trajectories), "solved": solved,
                              "pass_rate": solved / max(1, len(trajectories)),
                              "kept": len(kept)}
    if not kept:
        record["skipped"] = "no episode solved its task: nothing to imitate"
        log.warning("RFT round %d: none of %d episodes solved its task; no fine-tuning",
                    index, len(trajectories))
        return record
    steps = await asyncio.to_thread(
        supervised_warmup, trainer, kept, config.rft_steps,
        batch_size=min(config.sft_batch, len(kept)), lr=config.sft_lr or config.lr)
    for step in steps:
        log_step({"step": step.step, "sft_loss": step.metrics.get("sft_loss"),
                  "applied": step.applied, "stage": f"rft-{index}"})
    losses = [s.metrics.get("sft_loss") for s in steps]
    record.update(sft_loss_first=losses[0], sft_loss_last=losses[-1], version=policy.version)
    log.info("RFT round %d: %d of %d episodes solved, %d kept, %d steps, loss %.4f -> %.4f",
             index, solved, len(trajectories), len(kept), len(steps), losses[0] or 0.0,
             losses[-1] or 0.0)
    return record
