"""Tree groups against flat groups at equal compute, on the tiny model's terminal slice (issue 32).

    python benchmarks/learning.py --env terminal --tree-vs-flat --out runs/learning-tree
    python benchmarks/learning.py --env terminal --tree-vs-flat --quick --out runs/lt-quick

`benchmarks/learning.py --env terminal` is one turn: a tree has nothing to share there. This
is its 2-turn variant (`--set slice=unique2`): the same sort-unique tasks of
`corral/term-text-v0` in bubblewrap sandboxes, but the oracle episode first inspects the input
(`cat /root/words.txt`, one `bash` call), reads the tool's answer, then writes
`/root/unique.txt` (a second call); episodes have at most 2 turns, and the env's own verifier
scores the file, whatever the calls were. What it does, all seeded:

1. builds the tiny model as `learning.py` does (`tiny_model`) and splits the slice's tasks;
2. warm start: the oracle plays `oracle_tasks` train tasks as real episodes (`run_episode` with
   a `ScriptedPolicy` answering the oracle's calls turn by turn, the tiny model's tokenizer), so
   the SFT examples are exactly the runner's 2-turn transcripts, tool output included (not
   trained on); `supervised_warmup` on them; held-out evaluation of the warm-started policy;
3. two RL arms from that same checkpoint (weights and optimizer state), one after the other,
   each with the same seeds (the same task plan, the same sampling seeds): **flat** GRPO groups
   (`AssemblyConfig(tree_turns=0)`) and **tree** groups (`tree_turns=1`: a group's samples
   share the root's first turn, played once in one sandbox, then branch from its snapshot; the
   trainer's advantages are per branch point, `corral.trainer.tree`). Same group size, batch,
   learning rate. Each arm trains until it has used `arm_cpu_s` CPU seconds (this process,
   model and trainer threads, plus the sandboxes' processes it reaped: equal compute on a
   machine others share, where wall time depends on their load) or `arm_wall_s` wall seconds,
   whichever comes first; the step in progress then finishes. Measured per arm: RL steps,
   trajectories trained on, generated tokens (every decode of the arm, discarded groups too),
   sandbox-seconds (setup or restore to the end of verify, over the finished trajectories),
   snapshot restores, CPU and wall seconds, load average;
4. held-out evaluation after each arm, every episode a real 2-turn sandbox episode
   (`evaluate_episodes`): greedy, and pass@1 at temperature 1 (`eval_samples` samples per task).

Printed `name=value` figures; `learning_tree.json` in `--out` has them, the settings and each
arm's per-step curve.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import os
import random
import resource
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

import corral as cr
from benchmarks.learning import (Settings, Slice, _one_thread, log, make_env, split_tasks,
                                 tiny_model)
from benchmarks.tree import held_seconds
from corral.runner import AssemblyConfig, EpisodeLimits, LocalPolicy, Runner, ScriptedPolicy
from corral.runner.episode import WorkItem, run_episode
from corral.runner.trajectory import Trajectory
from corral.terminal import bash
from corral.toolcalls import format_tool_call
from corral.trainer import StepConfig, Trainer, supervised_warmup

__all__ = ["InspectFirst", "TREE", "TreeSettings", "evaluate_episodes", "oracle_episodes",
           "run_tree_vs_flat"]


@dataclass
class TreeSettings(Settings):
    """`learning.Settings` and the knobs of the tree-vs-flat comparison."""

    tree_turns: int = 1        # the tree arm's shared turns (the flat arm: 0)
    arm_cpu_s: float = 270.0   # CPU seconds (process + reaped sandbox processes) per RL arm
    arm_wall_s: float = 420.0  # wall seconds per RL arm, whichever budget ends first
    oracle_tasks: int = 160    # train tasks the oracle plays for the warm start


@functools.cache
def _inspecting(base: type[cr.Env], command: str) -> type[cr.Env]:
    """`base` whose oracle runs `command` (inspect the input) before its own calls."""

    class Inspecting(base):  # type: ignore[misc, valid-type]
        def solution(self, task: cr.Task) -> list[cr.ToolCall]:
            return [bash(command), *super().solution(task)]

    Inspecting.__name__ = Inspecting.__qualname__ = f"Inspecting{base.__name__}"
    return Inspecting


@dataclass(frozen=True)
class InspectFirst(Slice):
    """A slice whose oracle episode first runs `inspect` (one call, its own turn), then the
    env's own oracle calls, one per turn. The env's verifier is unchanged."""

    inspect: str = ""

    def env_class(self) -> type[cr.Env]:
        return _inspecting(super().env_class(), self.inspect)


TWO_TURN = {
    # sort-unique (see learning.SLICES["unique"]) in two turns: `cat /root/words.txt`, then the
    # oracle's `LC_ALL=C sort -u /root/words.txt > /root/unique.txt`
    "unique2": InspectFirst("corral/term-text-v0",
                            "template 'sort-unique', 2 turns: cat the input, then one bash call",
                            lambda t: t.template == "sort-unique", 60,
                            env_kwargs={"backend": "bwrap", "max_turns": 2},
                            sandbox_backend="bwrap", sandbox_capacity=16,
                            inspect="cat /root/words.txt"),
}

# learning.TERMINAL's RL settings (group 8, 32 samples per step, lr 5e-4); more SFT steps:
# an example is now two turns with the words file's contents between them.
TREE = dict(slice="unique2", sft_steps=120, eval_tasks=124, eval_samples=2)


def cpu_seconds() -> float:
    """CPU seconds of this process (all threads) and of its children it has waited for."""
    own, kids = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                    resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


async def oracle_episodes(sl: Slice, tasks: cr.Dataset, tokenizer: Any, n: int, *,
                          concurrency: int = 8) -> list[Trajectory]:
    """The oracle's episodes of the first `n` of `tasks`, played by the runner's episode loop
    (real sandboxes), so that the transcripts are token for token what RL episodes are. A
    `ScriptedPolicy` ends each turn with the tokenizer's end-of-sequence token, as the
    tiny model may (it stops at `</s>` or `<|im_end|>`); the transcript then closes the turn."""
    inference, slots = asyncio.Semaphore(64), asyncio.Semaphore(concurrency)
    limits = EpisodeLimits(max_turns=sl.env_kwargs.get("max_turns"), max_tokens=sl.max_tokens)

    async def one(index: int) -> Trajectory:
        env = make_env(sl, tasks)
        calls = [format_tool_call(c) for c in env.solution(tasks[index])]
        policy = ScriptedPolicy(calls, tokenizer=tokenizer)
        async with slots:
            traj = await run_episode(env, policy, WorkItem(0, index, 0, str(env.env_id), index,
                                                           index), limits, inference)
        if traj.reward != 1.0:
            raise RuntimeError(f"oracle episode of task {traj.task_id} scored {traj.reward} "
                               f"({traj.status}): the slice's oracle is broken")
        return traj

    return list(await asyncio.gather(*(one(i) for i in range(min(n, len(tasks))))))


async def evaluate_episodes(policy: LocalPolicy, sl: Slice, tasks: cr.Dataset, *, samples: int,
                            seed: int, concurrency: int = 8) -> dict[str, float]:
    """Mean held-out reward over whole episodes (every turn, real sandboxes): greedy (one per
    task) and at temperature 1 (`samples` per task: pass@1). Seeds as `learning.evaluate`."""
    inference, slots = asyncio.Semaphore(64), asyncio.Semaphore(concurrency)
    turns = sl.env_kwargs.get("max_turns")

    async def one(index: int, temperature: float, k: int) -> float:
        env = make_env(sl, tasks)
        limits = EpisodeLimits(max_turns=turns, max_tokens=sl.max_tokens,
                               temperature=temperature)
        async with slots:
            traj = await run_episode(env, policy, WorkItem(0, k, 0, str(env.env_id), index,
                                                           seed * 7919 + k), limits, inference)
        return float(traj.reward)

    n = len(tasks)
    greedy = await asyncio.gather(*(one(i, 0.0, 0) for i in range(n)))
    sampled = await asyncio.gather(*(one(i, 1.0, 1 + i * samples + k) for i in range(n)
                                     for k in range(samples)))
    return {"greedy": sum(greedy) / n, "sampled": sum(sampled) / (n * samples)}


async def rl_arm(s: TreeSettings, sl: Slice, train: cr.Dataset, tree_turns: int,
                 start: dict[str, Any]) -> tuple[LocalPolicy, dict[str, Any]]:
    """GRPO from the warm start `start` (model, tokenizer, optimizer state, version) with
    `tree_turns` shared turns per group, until the arm's CPU or wall budget is spent; returns
    a fresh policy with the trained weights (for the held-out evaluation) and the arm's
    figures and per-step curve.

    The rollout policy is closed with its runner, and the evaluation decodes with a policy of
    its own: twice in nine evaluations that reused the rollout policy right after its runner
    had cancelled its in-flight episodes, the evaluation hung (the event loop idle, every
    evaluation sandbox set up and idle: by every sign waiting on generations)."""
    random.seed(s.seed)
    torch.manual_seed(s.seed)
    model, tokenizer, version = copy.deepcopy(start["model"]), start["tokenizer"], start["version"]
    policy = LocalPolicy(copy.deepcopy(model), tokenizer, max_batch=64, seed=s.seed,
                         version=version)
    trainer = Trainer(model, tokenizer, StepConfig(lr=s.rl_lr, micro_batch_size=64,
                                                   lr_warmup_steps=s.rl_warmup,
                                                   temperature=s.rl_temperature),
                      publish=lambda m, v: policy.load_weights(m.state_dict(), v),
                      version=version)
    trainer.optimizer.load_state_dict(copy.deepcopy(start["optimizer"]))
    finished: list[Trajectory] = []
    steps: list[dict[str, float]] = []
    limits = EpisodeLimits(max_turns=sl.env_kwargs.get("max_turns"), max_tokens=sl.max_tokens,
                           temperature=s.rl_temperature)
    assembly = AssemblyConfig(filter_zero_variance=s.filter_zero_variance, tree_turns=tree_turns)
    tokens0, cpu0, wall0 = policy.stats.generated_tokens, cpu_seconds(), time.perf_counter()
    load_start = os.getloadavg()[0]
    async with Runner(envs=[partial(make_env, sl, train)], policy=policy, seed=s.seed,
                      inference_concurrency=128, limits=limits, assembly=assembly,
                      sandbox_capacity=sl.sandbox_capacity,
                      sandbox_backend=sl.sandbox_backend) as runner:
        runner.add_listener(finished.append)
        async with contextlib.aclosing(runner.batches(size=s.rl_batch, group=s.group,
                                                      max_batches=s.rl_steps)) as batches:
            async for batch in batches:
                result = await asyncio.to_thread(_one_thread, trainer.step, batch)
                runner.on_policy_update(trainer.version)
                steps.append({"rl_step": len(steps) + 1,
                              "reward": float(batch.stats["mean_reward"]),
                              "applied": float(result.applied),
                              "filtered_groups": float(batch.stats["filtered_groups"]),
                              "cpu_s": cpu_seconds() - cpu0,
                              "wall_s": time.perf_counter() - wall0})
                log.info("%s step %d: batch reward %.3f, cpu %.0f s, wall %.0f s",
                         "tree" if tree_turns else "flat", len(steps), steps[-1]["reward"],
                         steps[-1]["cpu_s"], steps[-1]["wall_s"])
                if steps[-1]["cpu_s"] >= s.arm_cpu_s or steps[-1]["wall_s"] >= s.arm_wall_s:
                    break
        counts = runner.stats()["counts"]
    await policy.close()
    figures = {
        "rl_steps": len(steps), "applied_updates": int(sum(p["applied"] for p in steps)),
        "trajectories_trained": len(steps) * s.rl_batch,
        "filtered_groups": int(sum(p["filtered_groups"] for p in steps)),
        "generated_tokens": policy.stats.generated_tokens - tokens0,
        "sandbox_seconds": round(sum(held_seconds(t) for t in finished), 1),
        "episodes_finished": len(finished), "snapshot_restores": counts.get("tree_branches", 0),
        "cpu_s": round(cpu_seconds() - cpu0, 1), "wall_s": round(time.perf_counter() - wall0, 1),
        "ended_by": ("cpu budget" if steps and steps[-1]["cpu_s"] >= s.arm_cpu_s else
                     "wall budget" if steps and steps[-1]["wall_s"] >= s.arm_wall_s else
                     "rl_steps"),
        "load_avg_1min_start": load_start, "load_avg_1min_end": os.getloadavg()[0]}
    trained = LocalPolicy(copy.deepcopy(model), tokenizer, max_batch=64, seed=s.seed,
                          version=trainer.version)
    return trained, {"figures": figures, "steps": steps}


async def run_tree_vs_flat(s: TreeSettings, out: Path) -> dict[str, Any]:
    """The whole comparison (module docstring); returns the report."""
    started = time.perf_counter()
    random.seed(s.seed)
    torch.manual_seed(s.seed)
    sl = TWO_TURN[s.slice]
    train, test = split_tasks(sl, sl.tasks(s.scan), s.test_fraction)
    model, tokenizer, token_text_name = tiny_model(s, sl, train, out)
    held_out = cr.Dataset.from_list(list(test)[: s.eval_tasks], sl.env_class().tasks.task_type)
    ev = partial(evaluate_episodes, sl=sl, tasks=held_out, samples=s.eval_samples, seed=s.seed)
    figures: dict[str, Any] = {"env": sl.env_id, "slice": sl.description,
                               "tokenizer_text": token_text_name, "train_tasks": len(train),
                               "test_tasks": len(held_out), "group": s.group,
                               "rl_batch": s.rl_batch, "tree_turns": s.tree_turns,
                               "load_avg_1min_start": os.getloadavg()[0]}

    t0 = time.perf_counter()
    examples = await oracle_episodes(sl, train, tokenizer, s.oracle_tasks)
    figures["oracle_episode_tokens"] = sum(len(t.token_ids) for t in examples) / len(examples)
    policy = LocalPolicy(copy.deepcopy(model), tokenizer, max_batch=64, seed=s.seed)
    trainer = Trainer(model, tokenizer, StepConfig(lr=s.rl_lr, micro_batch_size=64),
                      publish=lambda m, v: policy.load_weights(m.state_dict(), v))
    sft = await asyncio.to_thread(_one_thread, supervised_warmup, trainer, examples, s.sft_steps,
                                  batch_size=s.sft_batch, lr=s.sft_lr)
    figures["sft_s"] = time.perf_counter() - t0
    figures["sft_loss_last"] = sft[-1].metrics.get("sft_loss", float("nan"))
    after_sft = await ev(policy)
    await policy.close()
    figures.update({"after_sft_greedy": after_sft["greedy"],
                    "after_sft_sampled": after_sft["sampled"]})
    log.info("after SFT %s", after_sft)
    start = {"model": model, "tokenizer": tokenizer, "version": trainer.version,
             "optimizer": trainer.optimizer.state_dict()}

    arms: dict[str, Any] = {}
    for name, k in (("flat", 0), ("tree", s.tree_turns)):
        policy, arms[name] = await rl_arm(s, sl, train, k, start)
        after = await ev(policy)
        await policy.close()
        log.info("%s after RL %s", name, after)
        arms[name]["figures"].update({
            "after_rl_greedy": after["greedy"], "after_rl_sampled": after["sampled"],
            "rl_delta_greedy": after["greedy"] - after_sft["greedy"],
            "rl_delta_sampled": after["sampled"] - after_sft["sampled"]})
        figures.update({f"{name}_{key}": value for key, value in arms[name]["figures"].items()})
    for key in ("generated_tokens", "sandbox_seconds"):
        per_step = [arms[a]["figures"][key] / max(1, arms[a]["figures"]["rl_steps"])
                    for a in ("flat", "tree")]
        figures[f"flat_vs_tree_{key}_per_step"] = round(per_step[0] / max(1e-9, per_step[1]), 2)
    figures.update({"wall_s": time.perf_counter() - started,
                    "load_avg_1min_end": os.getloadavg()[0]})
    return {"settings": s.__dict__, "figures": figures,
            "curves": {name: arm["steps"] for name, arm in arms.items()}}
