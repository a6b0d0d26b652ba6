"""Held-out scoring while a model trains: one sample per task, in memory, no run directory.

`evaluate` is the full evaluation (avg@k and pass@k on an env's eval split, a resumable run
directory, `eval.html`); a training run scores its policy every few steps on held-out tasks and
needs only the mean reward and pass rate, with the run's own episode limits, sandbox capacity
and external agent. Both live here so evaluation has one home (`corral.runner.eval`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from corral.runner.trajectory import Trajectory

__all__ = ["reward_by_env", "score_held_out"]


def reward_by_env(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Mean reward per env (reports draw one curve per env)."""
    sums: dict[str, list[float]] = {}
    for traj in trajectories:
        sums.setdefault(traj.env_id, []).append(traj.reward)
    return {env: sum(v) / len(v) for env, v in sums.items()}


async def score_held_out(envs: Sequence[Any], policy: Any, tasks: int,
                         **runner_options: Any) -> dict[str, Any]:
    """Mean reward and pass rate of `policy` on `tasks` held-out tasks of `envs` (env ids,
    specs or task slices, as `Runner` takes them), one sample each; `runner_options` go to
    the `Runner` (seed, limits, capacity, agent ...). A task passes at its env's threshold."""
    from corral.runner import Runner

    async with Runner(list(envs), policy, **runner_options) as runner:
        trajs = await runner.collect(tasks, group=1)
        thresholds = {source.label: source.threshold for source in runner.sources}
    rewards = [t.reward for t in trajs]
    solved = sum(t.reward >= thresholds.get(t.env_id, 1.0) - 1e-9 for t in trajs)
    return {"tasks": len(rewards), "reward_mean": sum(rewards) / max(1, len(rewards)),
            "pass_rate": solved / max(1, len(rewards)), "by_env": reward_by_env(trajs)}
