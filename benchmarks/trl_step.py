"""One GRPO step of a real model on the same batch: Corral's `Trainer` vs TRL's `GRPOTrainer`.

The batch: `--groups` prompts of `corral/arithmetic-v0` (the model's own chat template, as the
runner encodes them) × `--group-size` completions of `--completion` tokens (fixed token ids
drawn from the ordinary vocabulary, so no end-of-sequence cuts one short), rewards 0/1
alternating inside each group, behaviour logprobs from one forward of the starting weights.
Both trainers train the full weights in float32 on CPU with AdamW at `--lr`, the whole batch
in one forward/backward (micro-batch = batch), no reference model (KL coefficient 0).

* **Corral**: `Trainer.step(batch)`: the proximal recompute (a no-grad forward: decoupled
  PPO's proximal policy), staleness filter, importance weights, numerics report, forward/
  backward, clip, AdamW.
* **TRL** (`[trl]` extra), `GRPOTrainer` with a `rollout_func` that returns the same prompt
  and completion ids (generation costs nothing) and a reward function that returns the same
  rewards; each `train()` step's time is measured between the `on_step_begin` and
  `on_step_end` callbacks (reward scoring, advantage, forward/backward, AdamW). Two configs:
  `trl` (on-policy, TRL's default: no old-logprob forward) and `trl_oldlogp`
  (`steps_per_generation=2`: TRL computes the old logprobs with a no-grad forward, as it does
  with vLLM importance-sampling correction or any batch reuse; the same work as Corral's
  recompute; its generation batch is two steps' worth, so its step time is the mean over
  each two-step cycle).

Every configuration runs in its own fresh process (so its peak resident memory, `ru_maxrss`,
is its own); `--steps` timed steps after one warm-up step; medians. It prints seconds per step,
peak RSS and `corral_vs_trl` / `corral_vs_trl_oldlogp` (Corral's seconds / TRL's: ≤ 1.0 is
the goal).

    .venv/bin/python benchmarks/trl_step.py [--model smollm2-135m-instruct] [--groups 4] \\
        [--group-size 4] [--completion 32] [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

__all__ = ["main", "make_data", "run_corral", "run_trl"]

ENV = "corral/arithmetic-v0"


def make_data(tokenizer: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Prompt ids per group, completion ids and rewards per sample (seeded)."""
    import corral as cr
    from corral.runner.policy.chat import ChatTranscript

    env = cr.make(ENV)
    rng = random.Random(args.seed)
    prompts = []
    for g in range(args.groups):
        task = env.tasks[g]
        messages = ([{"role": "system", "content": env.system_prompt}]
                    if env.system_prompt else [])
        messages.append({"role": "user", "content": env.instruction(task)})
        prompts.append(list(ChatTranscript(tokenizer, messages).ids))
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(min(1000, len(tokenizer) // 4), len(tokenizer)) if i not in special]
    completions = [[rng.choice(vocab) for _ in range(args.completion)]
                   for _ in range(args.groups * args.group_size)]
    rewards = [float(i % 2) for i in range(args.groups * args.group_size)]
    return {"prompts": prompts, "completions": completions, "rewards": rewards}


def behaviour_logprobs(model: Any, data: dict[str, Any], group_size: int) -> list[list[float]]:
    """Logprobs of each completion under the starting weights (one forward per sample)."""
    import torch

    from corral.trainer import token_logprobs

    out = []
    with torch.no_grad():
        for i, completion in enumerate(data["completions"]):
            prompt = data["prompts"][i // group_size]
            ids = torch.tensor([prompt + completion])
            logp = token_logprobs(model(input_ids=ids, use_cache=False).logits, ids)[0]
            out.append(logp[len(prompt):].tolist())
    return out


def run_corral(args: argparse.Namespace) -> dict[str, Any]:
    from corral.runner.policy.models import load_model
    from corral.runner.trajectory import Batch, Trajectory
    from corral.trainer import StepConfig, Trainer

    model, tokenizer = load_model(args.model, device="cpu")
    data = make_data(tokenizer, args)
    behaviour = behaviour_logprobs(model, data, args.group_size)
    n = args.groups * args.group_size
    trainer = Trainer(model, tokenizer, StepConfig(lr=args.lr, micro_batch_size=n,
                                                   max_staleness=1_000_000,
                                                   divergence_threshold=10.0))
    times, parts = [], []
    for step in range(args.steps + 1):
        groups = []
        for g in range(args.groups):
            group = []
            for k in range(args.group_size):
                i = g * args.group_size + k
                traj = Trajectory(id=f"s{step}-{i}", env_id=ENV, task_id=f"t{g}",
                                  group_id=f"g{step}-{g}", reward=data["rewards"][i])
                traj.append(data["prompts"][g], generated=False)
                traj.append(data["completions"][i], generated=True, logprobs=behaviour[i],
                            version=trainer.version)
                group.append(traj)
            groups.append(group)
        started = time.perf_counter()
        result = trainer.step(Batch(groups=groups, policy_version=trainer.version))
        if not result.applied:
            raise SystemExit(f"corral step {step} not applied: {result.skipped_reason}")
        if step:
            times.append(time.perf_counter() - started)
            parts.append({k: result.metrics.get(f"time/{k}_s", 0.0)
                          for k in ("recompute", "train")})
    return {"step_s": times, "recompute_s": statistics.median(p["recompute"] for p in parts),
            "train_s": statistics.median(p["train"] for p in parts)}


def run_trl(args: argparse.Namespace, steps_per_generation: int) -> dict[str, Any]:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from corral.runner.policy.models import load_model

    model, tokenizer = load_model(args.model, device="cpu")
    data = make_data(tokenizer, args)
    n = args.groups * args.group_size
    drawn: dict[int, int] = {}

    def rollout(prompts: list[str], trainer: Any) -> dict[str, Any]:
        out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": [],
                                     "bench_reward": []}
        for prompt in prompts:
            g = int(prompt[1:])
            k = drawn.get(g, 0) % args.group_size
            drawn[g] = drawn.get(g, 0) + 1
            i = g * args.group_size + k
            out["prompt_ids"].append(data["prompts"][g])
            out["completion_ids"].append(data["completions"][i])
            out["logprobs"].append([0.0] * args.completion)
            out["bench_reward"].append(data["rewards"][i])
        return out

    def reward(completions: list[Any], bench_reward: list[float], **_: Any) -> list[float]:
        return list(bench_reward)

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.t0 = 0.0

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            self.times.append(time.perf_counter() - self.t0)

    total = (args.steps + 1) * steps_per_generation
    prompts = Dataset.from_list([{"prompt": f"p{g}"} for g in range(args.groups)] *
                                (total * steps_per_generation + 2))
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="corral-trl-"), use_cpu=True, bf16=False,
        per_device_train_batch_size=n, num_generations=args.group_size,
        gradient_accumulation_steps=1, steps_per_generation=steps_per_generation,
        max_steps=total, learning_rate=args.lr, beta=0.0, lr_scheduler_type="constant",
        max_completion_length=args.completion, report_to=[], logging_steps=1,
        save_strategy="no", dataloader_num_workers=0, seed=args.seed, shuffle_dataset=False)
    clock = Clock()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=prompts,
                          processing_class=tokenizer, rollout_func=rollout, callbacks=[clock])
    trainer.train()
    # a step's share of its generation cycle (the cycle's first step computes the old
    # logprobs of the whole generation batch); the first cycle is the warm-up
    cycles = [clock.times[i:i + steps_per_generation]
              for i in range(0, len(clock.times), steps_per_generation)]
    return {"step_s": [sum(c) / len(c) for c in cycles[1:]]}


def child(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    runs = {"corral": lambda: run_corral(args), "trl": lambda: run_trl(args, 1),
            "trl_oldlogp": lambda: run_trl(args, 2)}
    result = runs[args.child]()
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--completion", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after 1 warm-up)")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=["corral", "trl", "trl_oldlogp"], action="append",
                        help="run only these configurations (repeatable)")
    parser.add_argument("--child", choices=["corral", "trl", "trl_oldlogp"],
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    from corral.runner.policy.models import resolve_model_path

    args.model = str(resolve_model_path(args.model))
    print(f"model {args.model}; {args.groups} x {args.group_size} samples, "
          f"{args.completion} completion tokens, {args.threads} threads; "
          f"load_avg_1min_start={os.getloadavg()[0]:.2f}", flush=True)
    results: dict[str, dict[str, Any]] = {}
    base = [sys.executable, os.path.abspath(__file__), "--model", args.model, "--groups",
            str(args.groups), "--group-size", str(args.group_size), "--completion",
            str(args.completion), "--steps", str(args.steps), "--lr", str(args.lr),
            "--threads", str(args.threads), "--seed", str(args.seed)]
    for name in args.only or ["corral", "trl", "trl_oldlogp"]:
        proc = subprocess.run([*base, "--child", name], capture_output=True, text=True)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if proc.returncode or line is None:
            sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
            raise SystemExit(f"{name}: the child process failed (exit {proc.returncode})")
        results[name] = json.loads(line[len("RESULT "):])
        r = results[name]
        extra = (f", recompute {r['recompute_s']:.2f} s + train {r['train_s']:.2f} s"
                 if "recompute_s" in r else "")
        print(f"{name:<12} step {statistics.median(r['step_s']):6.2f} s (median of "
              f"{len(r['step_s'])}: {', '.join(f'{t:.2f}' for t in r['step_s'])}){extra}; "
              f"peak RSS {r['peak_rss_mb']:.0f} MB; load {os.getloadavg()[0]:.2f}", flush=True)
    if "corral" in results:
        corral = statistics.median(results["corral"]["step_s"])
        for name in ("trl", "trl_oldlogp"):
            if name in results:
                print(f"corral_vs_{name}={corral / statistics.median(results[name]['step_s']):.3f}")
                print(f"corral_vs_{name}_peak_rss="
                      f"{results['corral']['peak_rss_mb'] / results[name]['peak_rss_mb']:.3f}")
    print(f"load_avg_1min_end={os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
