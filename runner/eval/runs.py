"""Work on stored evaluations without a model: `reverify` (rescore) and `compare` (side by side).

`reverify(RUN_DIR)` replays every stored trajectory's actions (the assistant messages, in
order) into a fresh episode of the same task with the env's *current* code (its own sandbox
for terminal envs), so the rewards are those of today's verifier for yesterday's behaviour,
with no inference. It reports the tasks whose scores changed and writes
`RUN_DIR/reverify.json`; the store is left as it was. A limitation of replaying messages:
text an assistant wrote beside its tool calls is not replayed (the env stored only the calls),
which matters only for a reward that reads that text.

`compare(RUN_A, RUN_B)` puts two evaluations of the same tasks (two models, two checkpoints)
side by side per task: avg, pass@k of each and the differences.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, Sequence

from corral.fileio import write_json_atomic
from corral.runner.eval.stats import ks_for, summarize_samples
from corral.runner.eval.evaluation import plan_samples, read_plan, summarize_run
from corral.runner.store import load_run
from corral.runner.trajectory import Status, Trajectory

__all__ = ["REVERIFY", "compare", "replay_actions", "rescore", "reverify"]

REVERIFY = "reverify.json"


def replay_actions(messages: Sequence[dict[str, Any]]) -> list[Any]:
    """The agent's actions of a stored episode: per assistant message, its tool calls, else
    its text."""
    from corral.types import ToolCall

    actions: list[Any] = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        calls = message.get("tool_calls") or []
        actions.append([ToolCall(name=c["name"], arguments=c.get("arguments") or {})
                        for c in calls] if calls else message.get("content") or "")
    return actions


async def rescore(traj: Trajectory, task: dict[str, Any]) -> float:
    """The reward the env's current code gives `traj`'s actions on `task` (module docstring)."""
    from corral.registry import make

    env = make(traj.env_id)
    try:
        await env.areset(seed=traj.metadata.get("seed"), options={"task": task})
        for action in replay_actions(traj.messages):
            if env.episode.done:
                break
            await env.astep(action)
        if not env.episode.done:  # it ended by a deadline or a context limit
            await env.afinish(truncated=True)
        return float(env.episode.reward)
    finally:
        await env.aclose()


async def reverify(run_dir: str | os.PathLike[str], *, concurrency: int = 8) -> dict[str, Any]:
    """Rescore an evaluation's stored trajectories (module docstring). Returns `changed` (task
    keys whose samples' rewards changed), per-trajectory `rewards` old → new, and the
    `before` / `after` summaries; writes them to `RUN_DIR/reverify.json`."""
    plan = read_plan(run_dir)
    _, trajectories = load_run(run_dir)
    limit = asyncio.Semaphore(concurrency)

    async def one(traj: Trajectory) -> tuple[str, float]:
        task = plan["envs"][traj.env_id]["tasks"][int(traj.metadata["task_index"])]
        async with limit:
            return traj.id, await rescore(traj, task)

    usable = [t for t in trajectories if t.status is not Status.INFRA_ERROR
              and t.env_id in plan["envs"]]
    new = dict(await asyncio.gather(*(one(t) for t in usable)))
    ks = ks_for(plan["samples"])
    changed_ids = {t.id for t in usable if abs(new[t.id] - t.reward) > 1e-9}
    changed = sorted({f"{t.env_id}::{t.task_id}" for t in usable if t.id in changed_ids})
    result = {"changed": changed,
              "rewards": {t.id: {"task": f"{t.env_id}::{t.task_id}", "old": t.reward,
                                 "new": new[t.id]} for t in usable if t.id in changed_ids},
              "rescored": len(usable),
              "before": summarize_samples(plan_samples(plan, trajectories), ks),
              "after": summarize_samples(plan_samples(plan, trajectories, new), ks)}
    write_json_atomic(Path(run_dir) / REVERIFY, result)
    return result


def _side(task: dict[str, Any], ks: Sequence[int]) -> dict[str, Any]:
    return {"avg": task["avg"], **{f"pass@{k}": task["pass"].get(str(k)) for k in ks}}


def compare(run_a: str | os.PathLike[str], run_b: str | os.PathLike[str]) -> dict[str, Any]:
    """Two evaluations side by side per task (module docstring); k values common to both."""
    a, b = summarize_run(run_a), summarize_run(run_b)
    ks = [k for k in a["ks"] if k in b["ks"]]
    both = [key for key in a["tasks"] if key in b["tasks"]]
    tasks = {}
    for key in both:
        ta, tb = a["tasks"][key], b["tasks"][key]
        delta = None if ta["avg"] is None or tb["avg"] is None else tb["avg"] - ta["avg"]
        tasks[key] = {"a": _side(ta, ks), "b": _side(tb, ks), "delta_avg": delta,
                      "delta_pass": {str(k): None if ta["pass"][str(k)] is None
                                     or tb["pass"][str(k)] is None
                                     else tb["pass"][str(k)] - ta["pass"][str(k)] for k in ks}}
    return {"ks": ks, "tasks": tasks,
            "a": {"run": str(run_a), "model": a["model"], "overall": a["overall"]},
            "b": {"run": str(run_b), "model": b["model"], "overall": b["overall"]},
            "only_in": {"a": sorted(set(a["tasks"]) - set(b["tasks"])),
                        "b": sorted(set(b["tasks"]) - set(a["tasks"]))}}
