"""`corral demo`: the main job end to end on this machine.

1. the base image (`corral/base:bookworm`) is built if missing;
2. a few built-in envs are validated in real sandboxes (oracle must pass, no-op must fail);
3. the tiny model collects asynchronously from a terminal env in Docker and text envs;
4. the tiny model is trained on the text envs (a short supervised warm-up on oracle answers,
   then GRPO with async collection), on CPU;
5. `RUN_DIR/report.html` is written (reward curve, rollout timeline, staleness and divergence
   histograms, numerics report) and a summary is printed.
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

TEXT_ENVS = ["corral/arithmetic-v0", "corral/word-sort-v0"]
TERMINAL_ENV = "corral/term-text-v0"


@dataclass(frozen=True)
class DemoPlan:
    """How much work each stage does (`--quick` is the ~1-minute version the tests run)."""

    validate_limit: int
    collect: int
    steps: int
    batch: int
    sft_steps: int
    eval_tasks: int


FULL = DemoPlan(validate_limit=4, collect=24, steps=24, batch=16, sft_steps=120, eval_tasks=32)
QUICK = DemoPlan(validate_limit=2, collect=8, steps=2, batch=8, sft_steps=4, eval_tasks=4)


def _validate(plan: DemoPlan) -> Table:
    from corral.validate import validate

    table = Table(title="1. validation (oracle must pass, no-op must fail)", title_justify="left")
    for column in ("env", "backend", "tasks", "oracle", "no-op", "ok", "seconds"):
        table.add_column(column)
    for env_id in [*TEXT_ENVS, TERMINAL_ENV]:
        backend = "docker" if env_id == TERMINAL_ENV else None
        report = asyncio.run(validate(env_id, backend=backend, limit=plan.validate_limit))
        table.add_row(env_id, report.backend or "-", str(report.tasks_checked),
                      f"{report.oracle_pass_rate:.0%}", f"{report.noop_pass_rate:.0%}",
                      "yes" if report.ok else "[red]no[/]", f"{report.seconds:.1f}")
    return table


async def _collect(plan: DemoPlan, run_dir: Path) -> tuple[Table, dict[str, Any]]:
    from corral.runner import LocalPolicy, Runner

    policy = LocalPolicy("tiny")
    started = time.perf_counter()
    async with Runner([TERMINAL_ENV, *TEXT_ENVS], policy, sandbox_capacity=4,
                      inference_concurrency=16, run_dir=run_dir, max_tokens=32,
                      sandbox_backend="docker") as runner:
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
                                      help="Output directory (replaced).")) -> None:
    """Validate built-in envs, collect in real sandboxes, train the tiny model, write a report."""
    import torch

    from corral.sandbox.images import ensure_base_image
    from corral.trainer.loop import TrainConfig
    from corral.trainer.report import write_training_report

    from .train import run_training

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
    config = TrainConfig(envs=TEXT_ENVS, steps=plan.steps, batch_size=plan.batch, group=4,
                         lr=2e-4, async_level=1, run_dir=run_dir, sft_steps=plan.sft_steps,
                         sft_lr=3e-3, sft_examples=128, max_tokens=16,
                         eval_every=max(1, plan.steps // 3), eval_tasks=plan.eval_tasks,
                         checkpoint_every=max(2, plan.steps // 2), filter_zero_variance=False)
    console.print(f"3. training the tiny model on {', '.join(TEXT_ENVS)}")
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
            ("held-out reward", " -> ".join(f"{e['reward_mean']:.2f}" for e in result.evals)),
            ("batch reward first -> last", f"{result.records[0]['reward_mean']:.3f} -> "
                                           f"{result.records[-1]['reward_mean']:.3f}"),
            ("wall time (s)", f"{time.perf_counter() - started:.0f}"),
            ("report", str(page))]
    for row in rows:
        summary.add_row(*row)
    console.print(summary)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
