"""`corral demo`: the main job end to end on this machine.

1. the base image (`corral/base:bookworm`) is built if missing;
2. a few built-in envs are validated in real sandboxes (oracle must pass, no-op must fail);
3. the tiny model collects asynchronously from a terminal env in Docker and text envs;
4. a tiny model (0.58M parameters, built here) is trained on a slice of `corral/word-sort-v0`
   (reverse 3 words; held-out tasks never trained on): held-out reward before anything, a
   supervised warm-up on oracle answers, then GRPO with async collection, on CPU, within what
   is left of the time budget. These are the settings of `benchmarks/learning.py`, which
   measured held-out sampled reward +0.27 from the warm-started checkpoint.
   With `--model NAME` a real model is trained instead, as it is (no warm start), on
   arithmetic level 1 through vLLM (`real_train_config`: the settings of
   `benchmarks/learning.py --model`); held-out pass@1 at step 0 and along the run;
5. `RUN_DIR/report.html` is written (the training dashboard: reward, loss, divergence,
   staleness, numerics, throughput, utilisation; then the rollout report) and a summary is
   printed.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from .common import console

__all__ = ["DemoPlan", "FULL", "QUICK", "REAL_BUDGET_S", "REAL_ENV", "REAL_SLICE",
           "TERMINAL_ENV", "TEXT_ENVS", "TRAIN_ENV", "TRAIN_SLICE", "demo", "real_train_config",
           "register", "train_config"]

TEXT_ENVS = ["corral/arithmetic-v0", "corral/word-sort-v0"]
TERMINAL_ENV = "corral/term-text-v0"
TRAIN_ENV = "corral/word-sort-v0"
TRAIN_SLICE: dict[str, Any] = {"where": {"operation": "reverse"}, "lengths": {"words": 3}}


@dataclass(frozen=True)
class DemoPlan:
    """How much work each stage does (`--quick` is the ~1-minute version the tests run)."""

    validate_limit: int
    collect: int
    steps: int           # RL steps at most (the time budget may stop earlier)
    batch: int
    group: int
    sft_steps: int
    sft_batch: int
    eval_tasks: int
    eval_every: int
    hidden: int          # width of the tiny model built for training
    budget_s: float      # the whole demo's target wall time; training gets what is left
    filter_zero_variance: bool


FULL = DemoPlan(validate_limit=4, collect=24, steps=400, batch=64, group=8, sft_steps=100,
                sft_batch=32, eval_tasks=64, eval_every=20, hidden=128, budget_s=500.0,
                filter_zero_variance=True)
# An untrained model after 4 warm-up steps scores 0 everywhere: all-equal groups must still
# reach the trainer (as logged skips) or no step would run.
QUICK = DemoPlan(validate_limit=2, collect=8, steps=2, batch=8, group=4, sft_steps=4,
                 sft_batch=8, eval_tasks=4, eval_every=1, hidden=64, budget_s=120.0,
                 filter_zero_variance=False)


def train_config(plan: DemoPlan, run_dir: Path, model: Path, seconds_left: float,
                 engine: str = "local") -> Any:
    """The demo's `TrainConfig`: the learning benchmark's reverse-3 slice and settings."""
    from corral.trainer.config import TrainConfig
    from corral.trainer.tasks import TaskSlice

    return TrainConfig(
        envs=[TRAIN_ENV], tasks=TaskSlice(**TRAIN_SLICE),
        model=str(model), steps=plan.steps, batch_size=plan.batch, group=plan.group, lr=5e-4,
        async_level=1, run_dir=run_dir, sft_steps=plan.sft_steps, sft_batch=plan.sft_batch,
        sft_lr=2e-3, sft_examples=256, max_tokens=28, sandbox_capacity=128,
        inference_concurrency=128, eval_every=plan.eval_every, eval_tasks=plan.eval_tasks,
        checkpoint_every=max(2, plan.steps // 4), filter_zero_variance=plan.filter_zero_variance,
        time_budget_s=max(30.0, seconds_left), trainer={"micro_batch_size": 64},
        engine=engine)


# `--model NAME` (a real model, trained as it is: no warm start): the slice and settings of
# `benchmarks/learning.py --model` (docs/benchmarks.md), where SmolLM2-135M-Instruct starts
# at about a third: arithmetic level 1, short completions at temperature 0.7, small batches.
REAL_ENV = "corral/arithmetic-v0"
REAL_SLICE: dict[str, Any] = {"where": {"level": 1}}
REAL_BUDGET_S = {False: 720.0, True: 240.0}   # training seconds (full, --quick)


def real_train_config(run_dir: Path, model: str, seconds: float, engine: str,
                      quick: bool = False) -> Any:
    """The demo's `TrainConfig` for a real model: held-out pass@1 at step 0, every 5 steps and
    when the time budget ends the run."""
    from corral.trainer.config import TrainConfig
    from corral.trainer.tasks import TaskSlice

    return TrainConfig(
        envs=[REAL_ENV], tasks=TaskSlice(**REAL_SLICE), model=model, engine=engine,
        steps=2 if quick else 200, batch_size=8 if quick else 32, group=4 if quick else 8,
        lr=2e-5, temperature=0.7, max_tokens=16, async_level=1, run_dir=run_dir,
        eval_every=1 if quick else 5, eval_tasks=8 if quick else 64, checkpoint_every=10_000,
        torch_threads=2, inference_concurrency=32, time_budget_s=seconds,
        filter_zero_variance=not quick, zero_signal="warn",
        trainer={"micro_batch_size": 8})


def _validate(plan: DemoPlan) -> Table:
    from corral.registry.validate import validate

    table = Table(title="1. validation (oracle must pass, no-op must fail)", title_justify="left")
    for column in ("env", "backend", "tasks", "oracle", "no-op", "ok", "seconds"):
        table.add_column(column)
    for env_id in [*TEXT_ENVS, TERMINAL_ENV]:
        report = asyncio.run(validate(env_id, limit=plan.validate_limit))
        table.add_row(env_id, report.backend or "-", str(report.tasks_checked),
                      f"{report.oracle_pass_rate:.0%}", f"{report.noop_pass_rate:.0%}",
                      "yes" if report.ok else "[red]no[/]", f"{report.seconds:.1f}")
    return table


async def _collect(plan: DemoPlan, run_dir: Path) -> tuple[Table, dict[str, Any]]:
    from corral.runner import EpisodeLimits, LocalPolicy, Runner

    policy = LocalPolicy("tiny")
    started = time.perf_counter()
    async with Runner([TERMINAL_ENV, *TEXT_ENVS], policy, sandbox_capacity=4,
                      inference_concurrency=16, limits=EpisodeLimits(max_tokens=32),
                      run_dir=run_dir) as runner:
        trajs = await runner.collect(plan.collect, group=2)
        stats = runner.stats()
    seconds = time.perf_counter() - started
    table = Table(title="2. async collection, tiny model (untrained)", title_justify="left")
    for column in ("env", "trajectories", "statuses", "mean reward", "tokens"):
        table.add_column(column)
    for env_id in [TERMINAL_ENV, *TEXT_ENVS]:
        mine = [t for t in trajs if t.env_id == env_id]
        statuses = sorted({t.status.value for t in mine})
        reward = sum(t.reward for t in mine) / max(1, len(mine))
        table.add_row(env_id, str(len(mine)), ",".join(statuses), f"{reward:.2f}",
                      str(sum(t.generated_tokens for t in mine)))
    return table, {"seconds": seconds, "pool": stats["executor"].get("pool", {})}


def demo(quick: bool = typer.Option(False, "--quick", help="A ~1-minute version."),
         run_dir: Path = typer.Option(Path("runs/demo"), "--run-dir",
                                      help="Output directory (replaced)."),
         engine: str = typer.Option(None, "--engine", help="Rollout engine for training: "
                                    "local or vllm (.venv-vllm; see docs/policies.md); "
                                    "default local for the tiny model, vllm for --model."),
         model: str = typer.Option("tiny", "--model", help="'tiny' (built here, warm started "
                                   "on oracle answers) or a real model name or folder "
                                   "(docs/models.md), trained as it is on arithmetic level 1."
                                   )) -> None:
    """Validate built-in envs, collect in real sandboxes, train a model, write a report."""
    import torch

    from corral.runner import build_tiny_model
    from corral.sandbox.baseimage import ensure_base_image
    from corral.trainer.report import write_training_report

    from .engine import ENGINES, check_engine
    from .train import run_training

    real = model != "tiny"
    engine = engine or ("vllm" if real else "local")
    check_engine(engine, ("local", *ENGINES))
    if real:
        from corral.runner.policy.models import resolve_model_path

        model = str(resolve_model_path(model))  # a bad name fails here, before any work

    torch.set_num_threads(1)  # the tiny model: extra threads only add contention here
    plan = QUICK if quick else FULL
    started = time.perf_counter()
    shutil.rmtree(run_dir, ignore_errors=True)
    with console.status("checking the base image (built with debootstrap if missing)"):
        image = ensure_base_image()
    console.print(f"base image: {image}")
    with console.status("validating envs in real sandboxes"):
        console.print(_validate(plan))
    with console.status("collecting rollouts asynchronously"):
        table, collected = asyncio.run(_collect(plan, run_dir / "collect"))
    console.print(table)
    if real:
        config = real_train_config(run_dir, model, REAL_BUDGET_S[quick], engine, quick)
        console.print(f"3. training {model} as it is on {REAL_ENV}, tasks {REAL_SLICE} "
                      f"(held-out tasks never trained on) through {engine}, at most "
                      f"{config.time_budget_s:.0f} s")
    else:
        # vLLM's CPU kernels need a head size of 32 or more (4 heads of 16 suit local)
        heads = plan.hidden // 32 if engine == "vllm" else 4
        tiny = build_tiny_model(run_dir / "model", hidden=plan.hidden, layers=2, heads=heads)
        config = train_config(plan, run_dir, tiny,
                              plan.budget_s - (time.perf_counter() - started), engine)
        console.print(f"3. training a tiny model on {TRAIN_ENV}, tasks {TRAIN_SLICE} "
                      f"(held-out tasks never trained on), at most "
                      f"{config.time_budget_s:.0f} s")
    result = run_training(config, resume=False)
    page = write_training_report(run_dir)
    applied = [r for r in result.records if r["applied"]]
    step_times = [r["time/step_s"] for r in result.records]
    summary = Table(title="Corral demo summary", title_justify="left")
    summary.add_column("what")
    summary.add_column("value")
    rows = [("collection: trajectories / seconds",
             f"{plan.collect} / {collected['seconds']:.1f}"),
            ("sandbox starts / reuses", f"{collected['pool'].get('starts', 0)} / "
                                        f"{collected['pool'].get('reuses', 0)}"),
            ("warm-up SFT loss", f"{result.sft[0]['sft_loss']:.3f} -> "
                                 f"{result.sft[-1]['sft_loss']:.3f}" if result.sft else "-"),
            ("RL steps (applied)", f"{len(result.records)} ({len(applied)})"),
            ("policy version", str(result.version)),
            ("step time mean (s)", f"{sum(step_times) / max(1, len(step_times)):.2f}"),
            ("held-out reward (before warm-up | RL steps)",
             " -> ".join(f"{e['reward_mean']:.2f}" + (" |" if e.get("stage") == "before_sft"
                                                       else f" @{e['step']}")
                         for e in result.evals)),
            ("held-out pass@1 (RL steps)",
             " -> ".join(f"{e['pass_rate']:.2f} @{e['step']}" for e in result.evals
                         if e.get("stage") != "before_sft") or "-"),
            ("batch reward first -> last", f"{result.records[0]['reward_mean']:.3f} -> "
                                           f"{result.records[-1]['reward_mean']:.3f}"
             if result.records else "no step taken"),
            ("wall time (s)", f"{time.perf_counter() - started:.0f}"),
            ("report", str(page))]
    for row in rows:
        summary.add_row(*row)
    console.print(summary)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
