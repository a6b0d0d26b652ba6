"""`corral train`: GRPO training against registered envs (`corral.trainer.loop.train`)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from corral.errors import CorralError

from .common import console, fail


# TrainConfig fields whose flag is not the field's name in kebab case
FLAGS = {"batch_size": "--batch", "time_budget_s": "--time-budget", "envs": "--env",
         "filter_zero_variance": "--keep-zero-variance", "tasks": "--where/--length"}


def flag_of(field: str) -> str:
    """The `corral train` flag that sets TrainConfig field `field` (errors name the flag)."""
    return FLAGS.get(field, "--" + field.replace("_", "-"))


def parse_mix(text: str) -> dict[str, float]:
    """`"a=0.7,b=0.3"` -> `{"a": 0.7, "b": 0.3}`."""
    mix: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, weight = part.partition("=")
        try:
            mix[name.strip()] = float(weight) if sep else 1.0
        except ValueError:
            raise CorralError(f"--mix: weight {weight!r} of {name!r} is not a number; "
                              "write ID=WEIGHT,ID=WEIGHT") from None
    return mix


def parse_slice(where: list[str], length: list[str]) -> Any:
    """`--where FIELD=VALUE` / `--length FIELD=N` options -> a `TaskSlice` (None when unset)."""
    from corral.trainer.tasks import TaskSlice

    if not where and not length:
        return None
    equal: dict[str, Any] = {}
    sizes: dict[str, int] = {}
    for option, text in [("--where", w) for w in where] + [("--length", n) for n in length]:
        name, sep, value = text.partition("=")
        if not sep or not name.strip():
            raise CorralError(f"{option} {text!r}: write FIELD=VALUE")
        if option == "--where":
            equal[name.strip()] = value
        elif value.strip().isdigit():
            sizes[name.strip()] = int(value)
        else:
            raise CorralError(f"--length {text!r}: the length must be a whole number")
    return TaskSlice(where=equal, lengths=sizes)


def run_training(config: Any, *, resume: bool) -> Any:
    """Run `train` with a progress bar of steps; returns the `TrainResult`."""
    from corral.trainer.loop import train

    columns = (TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[info]}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("train", total=config.steps, info="starting")

        def on_step(record: dict[str, Any]) -> None:
            loss = record["metrics"].get("loss")
            info = (f"v{record['version']} reward {record['reward_mean']:.3f}"
                    + (f" loss {loss:.4f}" if isinstance(loss, float) else "")
                    + ("" if record["applied"] else f" (skipped: {record['skipped_reason']})"))
            progress.update(task, completed=record["step"] + 1, info=info)

        return asyncio.run(train(config, resume=resume, on_step=on_step))


def train_command(
    env: list[str] = typer.Option([], "--env", "-e", help="Env id to train on (repeatable)."),
    mix: str = typer.Option("", "--mix", help="Mixture ID=WEIGHT,ID=WEIGHT instead of --env."),
    model: str = typer.Option("tiny", "--model", help='"tiny" or a local model directory.'),
    steps: int = typer.Option(10, "--steps", min=1, help="Training steps in total."),
    batch: int = typer.Option(16, "--batch", min=1, help="Trajectories per step."),
    group: int = typer.Option(4, "--group", min=2, help="Samples per task (GRPO group)."),
    lr: float = typer.Option(1e-4, "--lr", help="Learning rate."),
    async_level: int = typer.Option(1, "--async-level", min=0,
                                    help="Batches collected ahead of the trainer (0: sync)."),
    run_dir: Path = typer.Option(Path("runs/train"), "--run-dir", help="Output directory."),
    resume: bool = typer.Option(False, "--resume", help="Continue from RUN_DIR/checkpoint."),
    sft_steps: int = typer.Option(0, "--sft-steps", min=0,
                                  help="Supervised warm-up steps on oracle solutions."),
    checkpoint_every: int = typer.Option(5, "--checkpoint-every", min=1),
    max_tokens: int = typer.Option(32, "--max-tokens", min=1),
    seed: int = typer.Option(0, "--seed"),
    eval_every: int = typer.Option(0, "--eval-every", min=0,
                                   help="Held-out evaluation every k steps (0: never)."),
    keep_zero_variance: bool = typer.Option(
        False, "--keep-zero-variance",
        help="Hand groups with equal rewards to the trainer (logged as skips)."),
    where: list[str] = typer.Option(
        [], "--where", help="Train on tasks whose FIELD equals VALUE (FIELD=VALUE, repeatable); "
        "a share is held out for evaluation."),
    length: list[str] = typer.Option(
        [], "--length", help="Train on tasks whose FIELD has N items (FIELD=N, repeatable)."),
    sft_batch: int = typer.Option(8, "--sft-batch", min=1,
                                  help="Oracle episodes per warm-up step."),
    sft_from: str = typer.Option(None, "--sft-from", help="Warm up on a dataset written by "
                                 "`corral export` (HF directory, .parquet or .jsonl) instead "
                                 "of oracle answers, for --sft-steps steps."),
    time_budget: float = typer.Option(0.0, "--time-budget", min=0.0,
                                      help="Stop taking RL steps after this many seconds "
                                      "(0: no limit; --resume continues)."),
    engine: str = typer.Option("local", "--engine", help="Rollout engine: local (in-process) "
                               "or vllm (replicas in .venv-vllm, fenced weight publishing)."),
    replicas: int = typer.Option(1, "--replicas", min=1, help="vLLM replicas (--engine vllm)."),
) -> None:
    """Train a policy with GRPO against registered envs (async collection, checkpoints)."""
    from corral.trainer.loop import TrainConfig

    from .engine import ENGINES, check_engine

    check_engine(engine, ("local", *ENGINES))
    try:
        config = TrainConfig(envs=env, mix=parse_mix(mix) or None, model=model, steps=steps,
                             tasks=parse_slice(where, length), sft_batch=sft_batch,
                             sft_from=sft_from,
                             time_budget_s=time_budget or None,
                             batch_size=batch, group=group, lr=lr, async_level=async_level,
                             run_dir=run_dir, sft_steps=sft_steps,
                             checkpoint_every=checkpoint_every, max_tokens=max_tokens,
                             seed=seed, eval_every=eval_every,
                             filter_zero_variance=not keep_zero_variance,
                             engine=engine, engine_replicas=replicas)
    except ValidationError as exc:
        # name the flag the user typed, not the Python field (batch_size -> --batch-size)
        fail("; ".join((f"{flag_of(str(e['loc'][0]))}: " if e["loc"] else "")
                       + e["msg"].removeprefix("Value error, ") for e in exc.errors()))
    if config.engine != "local":
        from corral.runner.policy.process import stop_on_signals

        stop_on_signals()  # SIGTERM stops the engine's replicas too
    result = run_training(config, resume=resume)
    last = result.records[-1] if result.records else None
    console.print(f"trained to step {result.steps}, version {result.version} in "
                  f"{result.wall_s:.1f} s" + (f"; last batch reward {last['reward_mean']:.3f}"
                                              if last else "") + f"; logs in {run_dir}")


def register(app: typer.Typer) -> None:
    app.command("train")(train_command)
